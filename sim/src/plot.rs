//! `--plot`: pinned and in-use bytes over time, per strategy, as SVG.

use std::path::Path;

use plotters::prelude::*;

use crate::run::Series;

/// Bytes in a GiB.
const GIB: f64 = (1u64 << 30) as f64;

/// Pixels per strategy's panel.
const PANEL: (u32, u32) = (1000, 240);

/// Most points a line is drawn with: more samples than this are merged
/// into as many buckets of time, each keeping its largest value (so that
/// no peak is lost), which keeps the file small.
pub const MAX_POINTS: usize = 1000;

/// Most misses marked in a panel: more are merged as the samples are
/// (bucketed by time), each mark the largest miss of its bucket of time.
pub const MAX_MARKS: usize = 250;

/// `samples` (time, value) in at most `most` points: each the largest
/// value of its bucket of time, at the bucket's first time.
fn thin(samples: impl Iterator<Item = (f64, f64)>, end: f64, most: usize) -> Vec<(f64, f64)> {
    let width = end / most as f64;
    let mut points: Vec<(f64, f64)> = Vec::new();
    let mut bucket = None;
    for (t, v) in samples {
        let b = (t / width) as usize;
        match points.last_mut() {
            Some(last) if bucket == Some(b) => last.1 = last.1.max(v),
            _ => {
                points.push((t, v));
                bucket = Some(b);
            }
        }
    }
    points
}

/// Draws to `path`, under `title`, one panel per strategy (`runs`: its
/// name and what one run held): pinned bytes and in-use bytes over time,
/// each miss a cross at the bytes it asked for, all panels on one time
/// axis and one byte scale; a line has at most [`MAX_POINTS`] points, a
/// panel at most [`MAX_MARKS`] marks of misses (its legend counts them
/// all).
pub fn draw(path: &Path, title: &str, runs: &[(&str, &Series)]) -> Result<(), String> {
    draw_svg(path, title, runs).map_err(|e| format!("{}: {e}", path.display()))
}

fn draw_svg(
    path: &Path,
    title: &str,
    runs: &[(&str, &Series)],
) -> Result<(), Box<dyn std::error::Error>> {
    let end = runs
        .iter()
        .flat_map(|(_, s)| {
            s.samples
                .iter()
                .map(|p| p.0)
                .chain(s.misses.iter().map(|m| m.0))
        })
        .fold(0.0, f64::max)
        .max(1e-3);
    let top = runs
        .iter()
        .flat_map(|(_, s)| {
            s.samples
                .iter()
                .flat_map(|p| [p.1, p.2])
                .chain(s.misses.iter().map(|m| m.1))
        })
        .max()
        .unwrap_or(0) as f64
        / GIB;
    let top = (top * 1.1).max(1.0 / 1024.0);
    let height = PANEL.1 * runs.len().max(1) as u32 + 40;
    let root = SVGBackend::new(path, (PANEL.0, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 18))?;
    let panels = root.split_evenly((runs.len().max(1), 1));
    for (area, (name, series)) in panels.iter().zip(runs) {
        let mut chart = ChartBuilder::on(area)
            .caption(*name, ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(32)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..end, 0.0..top)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_desc("seconds")
            .y_desc("GiB")
            .draw()?;
        let pinned = RGBColor(200, 40, 40);
        let in_use = RGBColor(30, 90, 200);
        chart
            .draw_series(LineSeries::new(
                thin(
                    series.samples.iter().map(|p| (p.0, p.1 as f64 / GIB)),
                    end,
                    MAX_POINTS,
                ),
                pinned.stroke_width(2),
            ))?
            .label("pinned")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], pinned));
        chart
            .draw_series(LineSeries::new(
                thin(
                    series.samples.iter().map(|p| (p.0, p.2 as f64 / GIB)),
                    end,
                    MAX_POINTS,
                ),
                in_use.stroke_width(2),
            ))?
            .label("in use")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], in_use));
        chart
            .draw_series(
                thin(
                    series.misses.iter().map(|m| (m.0, m.1 as f64 / GIB)),
                    end,
                    MAX_MARKS,
                )
                .into_iter()
                .map(|m| Cross::new(m, 3, BLACK)),
            )?
            .label(format!("misses ({})", series.misses.len()))
            .legend(|(x, y)| Cross::new((x + 10, y), 3, BLACK));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.85))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinning_keeps_each_buckets_peak() {
        let samples = (0..10_000).map(|i| (i as f64 / 1000.0, if i == 4321 { 9.0 } else { 1.0 }));
        let points = thin(samples, 10.0, MAX_POINTS);
        assert!(points.len() <= MAX_POINTS, "{}", points.len());
        assert!(points.iter().any(|p| p.1 == 9.0));
        assert!(points.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(thin([(0.5, 2.0)].into_iter(), 10.0, 5), [(0.5, 2.0)]);
    }
}
