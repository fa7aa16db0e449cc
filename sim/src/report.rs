//! The figures reported for each strategy, and their spread over repeated
//! runs.

use std::collections::BTreeMap;

use crate::run::RunResult;
use crate::strategy::Kind;

/// Bytes in a MiB.
const MIB: f64 = 1048576.0;

/// One figure of a run: how to read it and how to print it.
#[derive(Debug, Clone, Copy)]
pub struct Figure {
    /// Its name in JSON (the field of [`RunResult`] it comes from).
    pub key: &'static str,
    /// Its label in the table.
    pub label: &'static str,
    /// Its value in a run, if the strategy has one.
    pub value: fn(&RunResult) -> Option<f64>,
    /// How the table prints a value.
    pub format: fn(f64) -> String,
}

fn one(v: f64) -> String {
    format!("{v:.1}")
}

fn two(v: f64) -> String {
    format!("{v:.2}")
}

fn three(v: f64) -> String {
    format!("{v:.3}")
}

fn count(v: f64) -> String {
    format!("{v:.0}")
}

fn percent(v: f64) -> String {
    format!("{:.2}%", v * 100.0)
}

fn mib(v: f64) -> String {
    format!("{:.1}", v / MIB)
}

/// The figures of the table, in its order.
pub const FIGURES: &[Figure] = &[
    Figure {
        key: "segments_per_s",
        label: "segments/s",
        value: |r| r.segments_per_s,
        format: two,
    },
    Figure {
        key: "steady_segments_per_s",
        label: "steady segments/s",
        value: |r| r.steady_segments_per_s,
        format: two,
    },
    Figure {
        key: "staged_gb_per_s",
        label: "staged GB/s",
        value: |r| Some(r.staged_gb_per_s),
        format: two,
    },
    Figure {
        key: "take_p50_us",
        label: "take p50 us",
        value: |r| Some(r.take_p50_us),
        format: one,
    },
    Figure {
        key: "take_p99_us",
        label: "take p99 us",
        value: |r| Some(r.take_p99_us),
        format: one,
    },
    Figure {
        key: "drop_p99_us",
        label: "drop p99 us",
        value: |r| Some(r.drop_p99_us),
        format: one,
    },
    Figure {
        key: "hit_rate",
        label: "hits (count)",
        value: |r| Some(r.hit_rate),
        format: percent,
    },
    Figure {
        key: "hit_rate_bytes",
        label: "hits (bytes)",
        value: |r| Some(r.hit_rate_bytes),
        format: percent,
    },
    Figure {
        key: "steady_hit_rate",
        label: "steady hits (count)",
        value: |r| Some(r.steady_hit_rate),
        format: percent,
    },
    Figure {
        key: "steady_hit_rate_bytes",
        label: "steady hits (bytes)",
        value: |r| Some(r.steady_hit_rate_bytes),
        format: percent,
    },
    Figure {
        key: "ready_p50_ms",
        label: "drop-to-ready p50 ms",
        value: |r| r.ready_p50_ms,
        format: two,
    },
    Figure {
        key: "ready_p99_ms",
        label: "drop-to-ready p99 ms",
        value: |r| r.ready_p99_ms,
        format: two,
    },
    Figure {
        key: "peak_pinned_bytes",
        label: "peak pinned MiB",
        value: |r| Some(r.peak_pinned_bytes as f64),
        format: mib,
    },
    Figure {
        key: "peak_in_use_bytes",
        label: "peak in use MiB",
        value: |r| Some(r.peak_in_use_bytes as f64),
        format: mib,
    },
    Figure {
        key: "pinned_per_in_use",
        label: "pinned/in use at peak",
        value: |r| Some(r.pinned_per_in_use),
        format: three,
    },
    Figure {
        key: "registrations",
        label: "registrations",
        value: |r| Some(r.registrations as f64),
        format: count,
    },
    Figure {
        key: "bytes_requested",
        label: "requested MiB",
        value: |r| Some(r.bytes_requested as f64),
        format: mib,
    },
    Figure {
        key: "bytes_handed_out",
        label: "handed out MiB",
        value: |r| Some(r.bytes_handed_out as f64),
        format: mib,
    },
    Figure {
        key: "class_overhead",
        label: "class overhead",
        value: |r| Some(r.class_overhead),
        format: three,
    },
    Figure {
        key: "bytes_zeroed",
        label: "zeroed MiB",
        value: |r| Some(r.bytes_zeroed as f64),
        format: mib,
    },
    Figure {
        key: "late_p99_ms",
        label: "replay late p99 ms",
        value: |r| r.late_p99_ms,
        format: two,
    },
    Figure {
        key: "wall_s",
        label: "wall s",
        value: |r| Some(r.wall_s),
        format: two,
    },
];

/// The median and range of a figure over runs.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Spread {
    /// The median (the mean of the middle two for an even count).
    pub median: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
}

impl Spread {
    /// The spread of `values`, `None` if there are none.
    pub fn of(mut values: Vec<f64>) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let median = if n % 2 == 1 {
            values[n / 2]
        } else {
            (values[n / 2 - 1] + values[n / 2]) / 2.0
        };
        Some(Self {
            median,
            min: values[0],
            max: values[n - 1],
        })
    }
}

/// Every run of one strategy and the spread of each figure over them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// The strategy.
    pub strategy: Kind,
    /// What it is ([`Kind::legend`]).
    pub legend: &'static str,
    /// The runs, in order.
    pub runs: Vec<RunResult>,
    /// Per figure (by its key), its spread over the runs; `None` where
    /// the strategy has no such figure, or where some run has none (a
    /// steady rate whose provers were never steady at once): a spread
    /// over the other runs would pass for all of them.
    pub summary: BTreeMap<&'static str, Option<Spread>>,
}

impl Report {
    /// The report of `runs` of `strategy`.
    pub fn new(strategy: Kind, runs: Vec<RunResult>) -> Self {
        let summary = FIGURES
            .iter()
            .map(|f| {
                let values: Option<Vec<f64>> = runs.iter().map(f.value).collect();
                (f.key, Spread::of(values.unwrap_or_default()))
            })
            .collect();
        Self {
            strategy,
            legend: strategy.legend(),
            runs,
            summary,
        }
    }

    /// `figure` as the table prints it: the value of a single run, else
    /// `median (min-max)`; `-` where the strategy has none.
    pub fn cell(&self, figure: &Figure) -> String {
        match self.summary.get(figure.key).copied().flatten() {
            None => "-".into(),
            Some(s) if self.runs.len() == 1 => (figure.format)(s.median),
            Some(s) => format!(
                "{} ({}-{})",
                (figure.format)(s.median),
                (figure.format)(s.min),
                (figure.format)(s.max)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A figure one run lacks has no spread: the others' would pass for
    /// every run's.
    #[test]
    fn a_figure_some_run_lacks_has_no_spread() {
        let run = |steady: Option<f64>| RunResult {
            steady_segments_per_s: steady,
            ..crate::run::tests::a_run()
        };
        let report = Report::new(Kind::Limit, vec![run(Some(2.0)), run(None), run(Some(3.0))]);
        let steady = FIGURES
            .iter()
            .find(|f| f.key == "steady_segments_per_s")
            .unwrap();
        assert_eq!(report.summary["steady_segments_per_s"], None);
        assert_eq!(report.cell(steady), "-");
        let report = Report::new(Kind::Limit, vec![run(Some(2.0)), run(Some(3.0))]);
        assert_eq!(report.cell(steady), "2.50 (2.00-3.00)");
    }

    #[test]
    fn spreads() {
        assert_eq!(Spread::of(vec![]), None);
        assert_eq!(
            Spread::of(vec![3.0, 1.0, 2.0]),
            Some(Spread {
                median: 2.0,
                min: 1.0,
                max: 3.0
            })
        );
        assert_eq!(Spread::of(vec![4.0, 1.0]).map(|s| s.median), Some(2.5));
    }

    #[test]
    fn every_figure_is_a_field_of_a_run() {
        let workload = crate::workload::Workload {
            devices: 1,
            provers_per_device: 1,
            segments: 1,
            arenas: 1,
            staging: 1,
            scale: 1e-6,
            gap_ms: (0.0, 0.0),
            seed: 1,
        };
        let settings = crate::strategy::Settings {
            cleaner_threads: 1,
            max_pooled_bytes: Some(1 << 20),
            size_classes: pinpool::SizeClasses::Fine,
            conf: String::new(),
            trace: None,
            emulate_pinning: false,
        };
        let result = crate::run::run(Kind::Pageable, &workload, &settings, None, None);
        let run = serde_json::to_value(result).unwrap();
        for figure in FIGURES {
            assert!(run.get(figure.key).is_some(), "{}", figure.key);
        }
    }
}
