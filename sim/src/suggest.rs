//! `pinpool-sim suggest`: the smallest pinpool settings that reach a
//! target of steady byte hits on a trace, found by replaying it.
//!
//! For each layout (size classes, regions), caps are tried in increasing
//! order, as factors of the trace's peak in-use bytes, until one reaches
//! the target; larger caps of that layout are not tried (more idle room
//! never costs hits). Of the layouts that reach it, the suggestion is the
//! one that pinned the least at its peak (where the backend pins; the
//! smallest cap where it does not), ties going to the smaller cap.

use crate::run::RunResult;

/// The factors of the trace's peak in-use bytes tried as caps, in order.
pub const CAP_FACTORS: [f64; 9] = [0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 8.0];

/// One layout of pinpool's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Layout {
    /// `size_classes`: `fine` or `pow2`.
    pub size_classes: &'static str,
    /// `regions`: whether buffers are carved from large registrations.
    pub regions: bool,
}

impl Layout {
    /// The layout named `text`: `fine-off`, `fine-on`, `pow2-off` or
    /// `pow2-on` (size classes, then regions).
    pub fn parse(text: &str) -> Result<Self, String> {
        LAYOUTS
            .into_iter()
            .find(|l| l.name() == text.trim())
            .ok_or_else(|| {
                format!("`{text}` is not a layout: fine-off, fine-on, pow2-off or pow2-on")
            })
    }

    /// Its name: the size classes, then regions on or off.
    pub fn name(self) -> String {
        format!(
            "{}-{}",
            self.size_classes,
            if self.regions { "on" } else { "off" }
        )
    }
}

/// Every layout, in the order tried.
pub const LAYOUTS: [Layout; 4] = [
    Layout {
        size_classes: "fine",
        regions: false,
    },
    Layout {
        size_classes: "fine",
        regions: true,
    },
    Layout {
        size_classes: "pow2",
        regions: false,
    },
    Layout {
        size_classes: "pow2",
        regions: true,
    },
];

/// One replay of the sweep.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Step {
    /// The layout.
    pub layout: Layout,
    /// The cap on pooled bytes.
    pub max_pooled_bytes: usize,
    /// The factor of the trace's peak in-use bytes it is.
    pub cap_factor: f64,
    /// The `PINPOOL_CONF` pairs of the step.
    pub conf: String,
    /// Steady byte hits.
    pub steady_hit_rate_bytes: f64,
    /// Steady hits by count.
    pub steady_hit_rate: f64,
    /// Most bytes pinned at once.
    pub peak_pinned_bytes: u64,
    /// Peak pinned over the replay's peak in-use bytes.
    pub pinned_per_in_use: f64,
    /// Registration calls.
    pub registrations: u64,
    /// Whether the step reached the target.
    pub reached: bool,
}

/// The `PINPOOL_CONF` pairs of `layout` with a cap of `cap` bytes.
pub fn conf(layout: Layout, cap: usize) -> String {
    format!(
        "max_pooled_bytes={cap},size_classes={},regions={}",
        layout.size_classes,
        if layout.regions { "on" } else { "off" }
    )
}

/// Sweeps the caps of each of `layouts` for a trace whose peak in-use
/// bytes are `peak_in_use`: `replay` runs the trace with the
/// `PINPOOL_CONF` pairs it is given. A step reaches the target when its steady byte hits
/// are at least `target` (a fraction). Returns every step, in order, and
/// the index of the suggestion among them, if any step reached the target.
pub fn sweep(
    peak_in_use: u64,
    target: f64,
    layouts: &[Layout],
    mut replay: impl FnMut(&str) -> RunResult,
) -> (Vec<Step>, Option<usize>) {
    let page = 4096.0;
    let mut steps = Vec::new();
    for &layout in layouts {
        for factor in CAP_FACTORS {
            let cap = (factor * peak_in_use as f64).max(page) as usize;
            let conf = conf(layout, cap);
            let result = replay(&conf);
            let reached = result.steady_hit_rate_bytes >= target;
            steps.push(Step {
                layout,
                max_pooled_bytes: cap,
                cap_factor: factor,
                conf,
                steady_hit_rate_bytes: result.steady_hit_rate_bytes,
                steady_hit_rate: result.steady_hit_rate,
                peak_pinned_bytes: result.peak_pinned_bytes,
                pinned_per_in_use: result.pinned_per_in_use,
                registrations: result.registrations,
                reached,
            });
            if reached {
                break;
            }
        }
    }
    let pins = steps.iter().any(|s| s.peak_pinned_bytes > 0);
    let best = steps
        .iter()
        .enumerate()
        .filter(|(_, s)| s.reached)
        .min_by_key(|(_, s)| {
            if pins {
                (s.peak_pinned_bytes, s.max_pooled_bytes)
            } else {
                (s.max_pooled_bytes as u64, 0)
            }
        })
        .map(|(i, _)| i);
    (steps, best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::Kind;

    /// A result with `hits` steady byte hits and `pinned` peak pinned.
    fn result(hits: f64, pinned: u64) -> RunResult {
        RunResult {
            strategy: Kind::Pinpool,
            segments_per_s: None,
            steady_segments_per_s: None,
            hit_rate: hits,
            hit_rate_bytes: hits,
            steady_hit_rate: hits,
            steady_hit_rate_bytes: hits,
            peak_pinned_bytes: pinned,
            peak_in_use_bytes: 100,
            pinned_per_in_use: pinned as f64 / 100.0,
            ..crate::run::tests::a_run()
        }
    }

    fn cap_of(conf: &str) -> usize {
        conf.split(',')
            .find_map(|p| p.strip_prefix("max_pooled_bytes="))
            .unwrap()
            .parse()
            .unwrap()
    }

    #[test]
    fn each_layout_stops_at_its_first_cap_that_reaches_the_target() {
        // Fine classes reach the target at 1.25x the peak in use, pow2
        // at 2x; regions pin 10% less at the same cap.
        let peak = 1 << 30;
        let (steps, best) = sweep(peak, 0.999, &LAYOUTS, |conf| {
            let factor = cap_of(conf) as f64 / peak as f64;
            let need = if conf.contains("fine") { 1.25 } else { 2.0 };
            let pinned = (peak as f64 * factor.max(1.0)) as u64;
            let pinned = if conf.contains("regions=on") {
                pinned * 9 / 10
            } else {
                pinned
            };
            result(if factor >= need { 0.9995 } else { 0.9 }, pinned)
        });
        let tried = |layout: Layout| {
            steps
                .iter()
                .filter(|s| s.layout == layout)
                .map(|s| s.cap_factor)
                .collect::<Vec<_>>()
        };
        assert_eq!(tried(LAYOUTS[0]), [0.5, 0.75, 1.0, 1.25]);
        assert_eq!(tried(LAYOUTS[3]), [0.5, 0.75, 1.0, 1.25, 1.5, 2.0]);
        let best = &steps[best.unwrap()];
        assert_eq!(best.layout, LAYOUTS[1]);
        assert_eq!(best.cap_factor, 1.25);
        assert_eq!(
            best.conf,
            format!(
                "max_pooled_bytes={},size_classes=fine,regions=on",
                peak * 5 / 4
            )
        );
    }

    #[test]
    fn without_pinned_figures_the_smallest_cap_wins_and_a_missed_target_suggests_nothing() {
        let (steps, best) = sweep(1 << 20, 0.999, &LAYOUTS, |conf| {
            let hits = if conf.contains("pow2") && cap_of(conf) >= 1 << 20 {
                1.0
            } else {
                0.5
            };
            result(hits, 0)
        });
        assert_eq!(steps[best.unwrap()].layout.size_classes, "pow2");
        assert_eq!(steps[best.unwrap()].cap_factor, 1.0);

        let (steps, best) = sweep(1 << 20, 0.999, &LAYOUTS, |_| result(0.99, 0));
        assert_eq!(steps.len(), LAYOUTS.len() * CAP_FACTORS.len());
        assert_eq!(best, None);

        // Only the layouts asked for.
        let (steps, _) = sweep(1 << 20, 0.999, &LAYOUTS[1..2], |_| result(1.0, 0));
        assert_eq!(steps.len(), 1);
        assert_eq!(steps[0].layout.name(), "fine-on");
        assert_eq!(Layout::parse("pow2-off"), Ok(LAYOUTS[2]));
        assert!(Layout::parse("fine").is_err());
    }
}
