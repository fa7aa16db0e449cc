//! Runs one strategy over the workload and measures it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;
use indicatif::ProgressBar;

use crate::gpu::Sink;
use crate::strategy::{Kind, Settings, Staged, Strategy};
use crate::workload::Workload;

/// What one strategy achieved.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunResult {
    /// The strategy.
    pub strategy: Kind,
    /// Wall time of the run, seconds.
    pub wall_s: f64,
    /// Segments proved per second, all provers together (`None` in a
    /// replay, which has no segments).
    pub segments_per_s: Option<f64>,
    /// Segments proved per second, all provers together, while every
    /// prover is past the first quarter of its segments: over the window
    /// from the last prover's first later take to the first prover's end,
    /// the segments each prover proved within it (those that straddle the
    /// window's ends counted by the share of their time inside it; a
    /// segment ends after its CPU gap, the last one once its copies are
    /// done), summed over the provers, over the window's length. Against
    /// `segments_per_s` it shows what a run loses while a pool warms up.
    /// `None` in a replay, with a single segment a prover, or where the
    /// provers were never past their first quarter at once.
    pub steady_segments_per_s: Option<f64>,
    /// Bytes staged (copied) per second, GB/s.
    pub staged_gb_per_s: f64,
    /// Take latency, median and 99th percentile, microseconds.
    pub take_p50_us: f64,
    /// See `take_p50_us`.
    pub take_p99_us: f64,
    /// Give-back (drop) latency, 99th percentile, microseconds.
    pub drop_p99_us: f64,
    /// Fraction of takes served from a pool.
    pub hit_rate: f64,
    /// Fraction of bytes taken that were served from a pool.
    pub hit_rate_bytes: f64,
    /// As `hit_rate`, after the first quarter of each prover's segments.
    pub steady_hit_rate: f64,
    /// As `hit_rate_bytes`, after the first quarter of each prover's segments.
    pub steady_hit_rate_bytes: f64,
    /// Drop-to-ready latency, median and 99th percentile, milliseconds
    /// (pools only; pinpool's figures are power-of-two bucket edges).
    pub ready_p50_ms: Option<f64>,
    /// See `ready_p50_ms`.
    pub ready_p99_ms: Option<f64>,
    /// Most bytes page-locked at once: the strategy's own count where it
    /// keeps one, else sampled every 2 ms.
    pub peak_pinned_bytes: u64,
    /// The workload's own peak: the most bytes of buffers taken and not
    /// yet given back at once, all provers together, counting the sizes
    /// asked of `take` (not the lengths handed out, which round them up).
    pub peak_in_use_bytes: u64,
    /// `peak_pinned_bytes / peak_in_use_bytes`: the peaks, which need not
    /// fall at the same moment.
    pub pinned_per_in_use: f64,
    /// Calls that page-locked memory, all the run's (see
    /// [`Strategy::registrations`]).
    pub registrations: u64,
    /// Bytes asked of `take`, all takes together.
    pub bytes_requested: u64,
    /// Bytes of the buffers handed out (their lengths), all takes together.
    pub bytes_handed_out: u64,
    /// `bytes_handed_out / bytes_requested`: what rounding to size classes
    /// costs.
    pub class_overhead: f64,
    /// Bytes the strategy re-zeroed.
    pub bytes_zeroed: u64,
    /// In a replay, how late the takes and drops ran against the trace's
    /// times (scaled by `--speed`), 99th percentile, milliseconds.
    pub late_p99_ms: Option<f64>,
    /// Pinned and in-use bytes over the run, and its misses (for
    /// `--plot`; not in the JSON).
    #[serde(skip)]
    pub series: Series,
}

/// What a run held over time.
#[derive(Debug, Clone, Default)]
pub struct Series {
    /// Samples every 2 ms: seconds since the run began, bytes pinned,
    /// bytes in use (asked of takes and not yet given back).
    pub samples: Vec<(f64, u64, u64)>,
    /// Each take the strategy did not serve from its pool: seconds since
    /// the run began, bytes asked.
    pub misses: Vec<(f64, u64)>,
}

/// What the takers of a run counted, merged over them.
#[derive(Default)]
pub(crate) struct Tally {
    /// When the first taker started (its sink ready).
    pub(crate) started: Option<Instant>,
    pub(crate) take_ns: Vec<u64>,
    pub(crate) drop_ns: Vec<u64>,
    /// How late each take and drop of a replay ran.
    pub(crate) late_ns: Vec<u64>,
    /// Takes, hits and bytes, before and after the steady point (the
    /// first quarter of each prover's segments, or of a trace's time).
    pub(crate) takes: [u64; 2],
    pub(crate) hits: [u64; 2],
    pub(crate) bytes: [u64; 2],
    pub(crate) hit_bytes: [u64; 2],
    pub(crate) requested: u64,
    pub(crate) staged: u64,
    /// When each miss happened, and its bytes asked.
    pub(crate) misses: Vec<(Instant, u64)>,
    /// Each prover's segment boundaries after the steady point: when its
    /// first steady take began, then when each later segment ended (see
    /// `RunResult::steady_segments_per_s`).
    pub(crate) steady_bounds: Vec<Vec<Instant>>,
}

impl Tally {
    /// Counts a take of `size` bytes asked, served with `buf`, after the
    /// steady point if `steady`.
    pub(crate) fn take(&mut self, buf: &mut Staged<'_>, size: usize, steady: bool) {
        let phase = usize::from(steady);
        // What the take occupies, a borrowed buffer's whole length.
        let len = buf.occupied() as u64;
        self.takes[phase] += 1;
        self.requested += size as u64;
        self.bytes[phase] += len;
        if buf.hit() {
            self.hits[phase] += 1;
            self.hit_bytes[phase] += len;
        } else {
            self.misses.push((Instant::now(), size as u64));
        }
    }

    pub(crate) fn merge(&mut self, other: Tally) {
        self.started = match (self.started, other.started) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.take_ns.extend(other.take_ns);
        self.drop_ns.extend(other.drop_ns);
        self.late_ns.extend(other.late_ns);
        self.misses.extend(other.misses);
        self.steady_bounds.extend(other.steady_bounds);
        for i in 0..2 {
            self.takes[i] += other.takes[i];
            self.hits[i] += other.hits[i];
            self.bytes[i] += other.bytes[i];
            self.hit_bytes[i] += other.hit_bytes[i];
        }
        self.requested += other.requested;
        self.staged += other.staged;
    }
}

/// The `q` quantile of `values` (sorted in place).
pub(crate) fn quantile(values: &mut [u64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_unstable();
    values[((values.len() - 1) as f64 * q).round() as usize] as f64
}

/// The segments per second of every prover together while all are
/// steady, from each prover's segment `bounds` (see
/// `Tally::steady_bounds`): over the window where every prover is steady,
/// the segments each prover proved within it, counted in fractions of the
/// segments that straddle its ends (as if a segment's work ran evenly
/// over its time), summed over the provers and divided by the window's
/// length. `None` if there are no provers, a prover has fewer than two
/// boundaries, or the window is empty.
fn steady_rate(bounds: &[Vec<Instant>]) -> Option<f64> {
    if bounds.iter().any(|b| b.len() < 2) {
        return None;
    }
    let from = bounds.iter().map(|b| b[0]).max()?;
    let to = bounds.iter().map(|b| b[b.len() - 1]).min()?;
    if to <= from {
        return None;
    }
    let segments: f64 = bounds
        .iter()
        .map(|b| progress(b, to) - progress(b, from))
        .sum();
    Some(segments / (to - from).as_secs_f64())
}

/// How many of the segments between `bounds` (ascending, at least two)
/// were done at `at` (within them), the one under way counted by the
/// share of its time gone.
fn progress(bounds: &[Instant], at: Instant) -> f64 {
    // The segment under way at `at`: bounds[i] <= at <= bounds[i + 1].
    let i = bounds
        .partition_point(|&b| b <= at)
        .clamp(1, bounds.len() - 1)
        - 1;
    let (start, end) = (bounds[i], bounds[i + 1]);
    let length = (end - start).as_secs_f64();
    let done = if length > 0.0 {
        (at.saturating_duration_since(start).as_secs_f64() / length).min(1.0)
    } else {
        1.0
    };
    i as f64 + done
}

fn ratio(num: u64, den: u64) -> f64 {
    if den == 0 {
        1.0
    } else {
        num as f64 / den as f64
    }
}

/// Bytes of buffers taken and not yet given back, all provers together.
#[derive(Default)]
pub(crate) struct InUse {
    now: AtomicU64,
    peak: AtomicU64,
}

impl InUse {
    pub(crate) fn taken(&self, bytes: u64) {
        let now = self.now.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    pub(crate) fn given_back(&self, bytes: u64) {
        self.now.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Runs `kind` over `workload`, on `gpu` if given.
pub fn run(
    kind: Kind,
    workload: &Workload,
    settings: &Settings,
    gpu: Option<&[Arc<CudaContext>]>,
    progress: Option<&ProgressBar>,
) -> RunResult {
    run_strategy(
        Strategy::new(kind, workload, settings, gpu),
        workload,
        gpu,
        progress,
    )
}

/// Runs `strategy`, built for `workload` (on `gpu` if given), over it,
/// then shuts it down.
pub fn run_strategy(
    strategy: Strategy,
    workload: &Workload,
    gpu: Option<&[Arc<CudaContext>]>,
    progress: Option<&ProgressBar>,
) -> RunResult {
    let max = workload.max_size();
    let segments = (workload.provers() * workload.segments) as u64;
    measure(strategy, Some(segments), |strategy, in_use| {
        std::thread::scope(|scope| {
            let provers: Vec<_> = (0..workload.provers())
                .map(|p| {
                    scope.spawn(move || prove(strategy, workload, p, max, gpu, in_use, progress))
                })
                .collect();
            let mut tally = Tally::default();
            for prover in provers {
                tally.merge(prover.join().expect("a prover thread panicked"));
            }
            tally
        })
    })
}

/// Sets its flag when dropped, unwinding or not.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Measures a run of `strategy`: `drive` runs the takers, counting into
/// the in-use bytes it is given, and returns their merged tally; then the
/// strategy flushes and shuts down. `segments` are the run's, if it has
/// any.
pub(crate) fn measure(
    strategy: Strategy,
    segments: Option<u64>,
    drive: impl FnOnce(&Strategy, &InUse) -> Tally,
) -> RunResult {
    let kind = strategy.kind();
    let done = AtomicBool::new(false);
    let peak = AtomicU64::new(0);
    let in_use = InUse::default();
    // Wall time runs from the first taker's start (its sink, set up the
    // same for every strategy, ready) until the strategy has flushed,
    // before the sampler below wakes up to see `done` (a sleep of up to
    // 2 ms, and longer on a loaded machine).
    let (wall, mut tally, samples) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut samples = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let pinned = strategy.pinned_bytes();
                peak.fetch_max(pinned, Ordering::Relaxed);
                samples.push((Instant::now(), pinned, in_use.now.load(Ordering::Relaxed)));
                std::thread::sleep(Duration::from_millis(2));
            }
            samples
        });
        let tally = {
            // The sampler stops even when the takers panic.
            let _stop = StopOnDrop(&done);
            drive(&strategy, &in_use)
        };
        strategy.flush();
        let started = tally.started.expect("a run has takers");
        let wall = started.elapsed().as_secs_f64();
        done.store(true, Ordering::Relaxed);
        let samples = sampler.join().expect("the sampler thread panicked");
        (wall, tally, samples)
    });
    let started = tally.started.expect("a run has takers");
    let since = |at: Instant| at.saturating_duration_since(started).as_secs_f64();
    let series = Series {
        samples: samples
            .into_iter()
            .map(|(at, pinned, in_use)| (since(at), pinned, in_use))
            .collect(),
        misses: tally
            .misses
            .iter()
            .map(|&(at, bytes)| (since(at), bytes))
            .collect(),
    };
    let (ready_p50_ms, ready_p99_ms, bytes_zeroed) = match &strategy {
        Strategy::Pinpool(pool) => {
            let s = pool.stats();
            let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e3);
            (
                ms(s.drop_to_ready_p50),
                ms(s.drop_to_ready_p99),
                s.bytes_zeroed,
            )
        }
        Strategy::Seed(pool) => {
            let s = pool.stats();
            let mut ns: Vec<u64> = s
                .ready_latency
                .iter()
                .map(|d| d.as_nanos() as u64)
                .collect();
            let mut ms = |q| (!ns.is_empty()).then(|| quantile(&mut ns, q) / 1e6);
            (ms(0.5), ms(0.99), s.bytes_zeroed)
        }
        Strategy::Ideal(pool) => (None, None, pool.bytes_zeroed()),
        Strategy::Limit(_) | Strategy::Pageable | Strategy::HostAlloc(_) => (None, None, 0),
    };
    let peak_pinned_bytes = strategy
        .peak_pinned_bytes()
        .unwrap_or(0)
        .max(peak.load(Ordering::Relaxed));
    let peak_in_use_bytes = in_use.peak.load(Ordering::Relaxed);
    let registrations = strategy.registrations();
    strategy.shutdown();
    let takes = tally.takes[0] + tally.takes[1];
    let handed_out = tally.bytes[0] + tally.bytes[1];
    RunResult {
        strategy: kind,
        wall_s: wall,
        segments_per_s: segments.map(|n| n as f64 / wall),
        steady_segments_per_s: steady_rate(&tally.steady_bounds),
        staged_gb_per_s: tally.staged as f64 / wall / 1e9,
        take_p50_us: quantile(&mut tally.take_ns, 0.5) / 1e3,
        take_p99_us: quantile(&mut tally.take_ns, 0.99) / 1e3,
        drop_p99_us: quantile(&mut tally.drop_ns, 0.99) / 1e3,
        hit_rate: ratio(tally.hits[0] + tally.hits[1], takes),
        hit_rate_bytes: ratio(tally.hit_bytes[0] + tally.hit_bytes[1], handed_out),
        steady_hit_rate: ratio(tally.hits[1], tally.takes[1]),
        steady_hit_rate_bytes: ratio(tally.hit_bytes[1], tally.bytes[1]),
        ready_p50_ms,
        ready_p99_ms,
        peak_pinned_bytes,
        peak_in_use_bytes,
        pinned_per_in_use: peak_pinned_bytes as f64 / peak_in_use_bytes.max(1) as f64,
        registrations,
        bytes_requested: tally.requested,
        bytes_handed_out: handed_out,
        class_overhead: ratio(handed_out, tally.requested),
        bytes_zeroed,
        late_p99_ms: (!tally.late_ns.is_empty()).then(|| quantile(&mut tally.late_ns, 0.99) / 1e6),
        series,
    }
}

/// One prover thread: its segments, start to end.
fn prove(
    strategy: &Strategy,
    workload: &Workload,
    prover: usize,
    max: usize,
    gpu: Option<&[Arc<CudaContext>]>,
    in_use: &InUse,
    progress: Option<&ProgressBar>,
) -> Tally {
    let device = prover % workload.devices;
    let mut sink = Sink::new(gpu.map(|g| &g[device]), max);
    let warmup = (workload.segments / 4).max(1);
    let mut tally = Tally {
        started: Some(Instant::now()),
        ..Tally::default()
    };
    // The segment boundaries from the steady point on (see
    // `Tally::steady_bounds`).
    let mut bounds = Vec::new();
    for (index, segment) in workload.plan(prover).into_iter().enumerate() {
        let steady = index >= warmup;
        if index == warmup {
            bounds.push(Instant::now());
        }
        let mut staged = Vec::with_capacity(segment.buffers.len());
        for plan in &segment.buffers {
            let started = Instant::now();
            let mut buf = strategy.take(prover, device, plan.size);
            tally.take_ns.push(started.elapsed().as_nanos() as u64);
            in_use.taken(plan.size as u64);
            tally.take(&mut buf, plan.size, steady);
            buf.bytes()[..plan.written].fill(0x5A);
            staged.push((buf, plan.size, plan.written));
        }
        for (buf, size, written) in staged {
            tally
                .drop_ns
                .push(buf.stage(prover, written, &mut sink).as_nanos() as u64);
            in_use.given_back(size as u64);
            tally.staged += written as u64;
        }
        std::thread::sleep(segment.gap);
        if steady && index + 1 < workload.segments {
            bounds.push(Instant::now());
        }
        if let Some(bar) = progress {
            bar.inc(1);
        }
    }
    sink.synchronize();
    if !bounds.is_empty() {
        // The last segment ends once its copies are done.
        bounds.push(Instant::now());
        tally.steady_bounds.push(bounds);
    }
    strategy.finish(prover);
    tally
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A run with every figure at a plain value, for tests of what reads
    /// runs.
    pub(crate) fn a_run() -> RunResult {
        RunResult {
            strategy: Kind::Limit,
            wall_s: 1.0,
            segments_per_s: Some(1.0),
            steady_segments_per_s: Some(1.0),
            staged_gb_per_s: 1.0,
            take_p50_us: 1.0,
            take_p99_us: 1.0,
            drop_p99_us: 1.0,
            hit_rate: 1.0,
            hit_rate_bytes: 1.0,
            steady_hit_rate: 1.0,
            steady_hit_rate_bytes: 1.0,
            ready_p50_ms: None,
            ready_p99_ms: None,
            peak_pinned_bytes: 1,
            peak_in_use_bytes: 1,
            pinned_per_in_use: 1.0,
            registrations: 0,
            bytes_requested: 1,
            bytes_handed_out: 1,
            class_overhead: 1.0,
            bytes_zeroed: 0,
            late_p99_ms: None,
            series: Series::default(),
        }
    }

    fn at(base: Instant, ms: &[u64]) -> Vec<Instant> {
        ms.iter()
            .map(|&m| base + Duration::from_millis(m))
            .collect()
    }

    /// Two provers, one segment a second each, half a second apart: two a
    /// second together, over the two and a half seconds both are steady.
    #[test]
    fn the_steady_rate_counts_the_window_every_prover_is_in() {
        let t = Instant::now();
        let bounds = [
            at(t, &[0, 1000, 2000, 3000]),
            at(t, &[500, 1500, 2500, 3500]),
        ];
        let rate = steady_rate(&bounds).unwrap();
        assert!((rate - 2.0).abs() < 1e-9, "{rate}");
    }

    /// Provers whose steady times do not overlap have no common window:
    /// their own rates (six a second each) must not add up to twelve.
    #[test]
    fn provers_steady_at_different_times_have_no_steady_rate() {
        let t = Instant::now();
        let first: Vec<u64> = (0..=6).map(|i| i * 1000 / 6).collect();
        let second: Vec<u64> = first.iter().map(|m| m + 1000).collect();
        let bounds = [at(t, &first), at(t, &second[1..])];
        assert_eq!(steady_rate(&bounds), None);
        assert_eq!(steady_rate(&[]), None);
        assert_eq!(steady_rate(&[at(t, &[5])]), None);
    }

    /// Segments that straddle the window's ends count by their share of
    /// time inside it: A's one segment (0-100 ms) and B's two (50-60,
    /// 60-150 ms) share 50-100 ms, in which A did half of its segment and
    /// B one segment and 40/90 of the next.
    #[test]
    fn segments_across_the_window_count_by_their_share() {
        let t = Instant::now();
        let rate = steady_rate(&[at(t, &[0, 100]), at(t, &[50, 60, 150])]).unwrap();
        let expected = (0.5 + 1.0 + 40.0 / 90.0) / 0.05;
        assert!((rate - expected).abs() < 1e-9, "{rate} against {expected}");
        // Windows that only touch are empty.
        assert_eq!(steady_rate(&[at(t, &[0, 10]), at(t, &[10, 20])]), None);
    }

    /// A prover that ran five segments in five milliseconds, then one
    /// that took the rest of the second, made six in the second: its
    /// burst does not count as a thousand a second.
    #[test]
    fn a_burst_counts_at_its_share_of_the_window() {
        let t = Instant::now();
        let bursty = at(t, &[0, 1, 2, 3, 4, 5, 1000]);
        let even: Vec<u64> = (0..=6).map(|i| i * 1000 / 6).collect();
        let rate = steady_rate(&[bursty, at(t, &even)]).unwrap();
        assert!((rate - 12.0).abs() < 1e-6, "{rate}");
    }
}
