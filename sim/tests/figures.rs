//! The figures of a run that compare strategies with the workload: its
//! peak in use, pinned bytes against it, and registrations.

use std::sync::{Arc, Mutex, MutexGuard};

use pinpool::testing::Faults;
use pinpool_sim::run::{run, run_strategy, RunResult};
use pinpool_sim::strategy::{pinpool_builder, Kind, Settings, Strategy};
use pinpool_sim::workload::Workload;

/// One run at a time, so that the tests' runs do not load the machine for
/// each other: a replay reproduces its capture's hits only where both ran
/// alike (on a 2-core machine with two busy loops beside the four tests,
/// 67% of a capture's bytes hit, then 64% in its replay). The runs take
/// about a second in all.
fn alone() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Two provers, a few small segments, no CPU gaps: well under a second.
fn workload() -> Workload {
    Workload {
        devices: 1,
        provers_per_device: 2,
        segments: 4,
        arenas: 8,
        staging: 2,
        scale: 1.0 / 1024.0,
        gap_ms: (0.0, 0.0),
        seed: 3,
    }
}

fn settings() -> Settings {
    Settings {
        cleaner_threads: 2,
        max_pooled_bytes: Some(1 << 30),
        size_classes: pinpool::SizeClasses::Fine,
        conf: String::new(),
        trace: None,
        emulate_pinning: false,
    }
}

/// A run of pinpool on the fault-injecting backend, which pins in name
/// only (and fails nothing here), and that backend's counts.
fn pinpool_pinning(workload: &Workload) -> (RunResult, Arc<Faults>) {
    let faults = Arc::new(Faults::default());
    let pool = pinpool_builder(workload, &settings(), None)
        .expect("settings")
        .faults(faults.clone())
        .build()
        .expect("build the pool");
    let result = run_strategy(Strategy::Pinpool(pool), workload, None, None);
    (result, faults)
}

/// The most bytes one segment of any prover asks for.
fn largest_segment(workload: &Workload) -> u64 {
    (0..workload.provers())
        .flat_map(|p| workload.plan(p))
        .map(|s| s.buffers.iter().map(|b| b.size as u64).sum())
        .max()
        .unwrap()
}

#[test]
fn peak_in_use_lies_between_the_largest_segment_and_the_working_set_bound() {
    let _alone = alone();
    let workload = workload();
    let result = run(Kind::Pageable, &workload, &settings(), None, None);
    assert!(
        result.peak_in_use_bytes >= largest_segment(&workload),
        "{result:?}"
    );
    assert!(
        result.peak_in_use_bytes <= workload.working_set_bound(),
        "{result:?}"
    );
    // Pageable staging pins nothing.
    assert_eq!(result.peak_pinned_bytes, 0);
    assert_eq!(result.pinned_per_in_use, 0.0);
    assert_eq!(result.registrations, 0);
}

/// A pinning strategy's pinned figure is its peak pinned over its peak in
/// use. (Not at least 1: a take that finds nothing pinned gets a pageable
/// buffer, never pinned on its own, and on a loaded machine the first
/// segments can run ahead of the regions' growth; a CI run measured 4 MiB
/// pinned against 4.3 MiB in use.)
#[test]
fn pinned_per_in_use_is_peak_pinned_over_peak_in_use() {
    let _alone = alone();
    let workload = workload();
    let (result, _) = pinpool_pinning(&workload);
    assert!(
        result.peak_in_use_bytes >= largest_segment(&workload),
        "{result:?}"
    );
    assert!(result.peak_pinned_bytes > 0, "{result:?}");
    let ratio = result.peak_pinned_bytes as f64 / result.peak_in_use_bytes as f64;
    assert!(
        (result.pinned_per_in_use - ratio).abs() <= 1e-12 * ratio,
        "{result:?}"
    );
}

#[test]
fn registrations_are_the_calls_the_strategy_made() {
    let _alone = alone();
    let workload = workload();
    let (result, faults) = pinpool_pinning(&workload);
    assert!(result.registrations > 0, "{result:?}");
    assert_eq!(result.registrations, faults.register_calls(), "{result:?}");
    // Without a GPU the ideal strategy and the seed design pin nothing.
    for kind in [Kind::Ideal, Kind::Seed] {
        let result = run(kind, &workload, &settings(), None, None);
        assert_eq!(result.registrations, 0, "{result:?}");
        assert_eq!(result.peak_pinned_bytes, 0, "{result:?}");
    }
}

/// A capture through a trace, then its replay on the same settings, with a
/// fresh pool on the fault-injecting backend (which pins in name only, so
/// peak pinned is a real figure here): the replay reproduces the captured
/// run's hits, by count and by bytes, and its peak pinned within 2%.
#[test]
fn a_replayed_trace_reproduces_the_captured_runs_hits_and_peak_pinned() {
    let _alone = alone();
    use pinpool_sim::replay::{self, Replay};
    // One prover, with gaps of 31-47 ms: time enough for the cleaner
    // between segments, as a real prover's 50-300 ms of CPU work give it,
    // so that what the pool holds at each take follows from the takes and
    // drops alone. (A returned miss may wait up to 20 ms for a burst of
    // takes to settle before its region grows; with gaps of 8-16 ms that
    // growth ended before the next segment in some runs and after it in
    // others, and 5 of 100 runs missed 2-12 more takes in one of the two.)
    // (With two provers it also follows from how their segments happen to
    // interleave, which differs from run to run: six runs of this workload
    // with two provers ranged over 64-76% byte hits.)
    let workload = Workload {
        provers_per_device: 1,
        segments: 12,
        gap_ms: (8000.0, 12000.0),
        scale: 1.0 / 256.0,
        ..workload()
    };
    let path =
        std::env::temp_dir().join(format!("pinpool-sim-replay-{}.trace", std::process::id()));
    let captured = {
        // Buffers pinned one by one: with regions, what a take finds also
        // follows when each growth ends, which load moves (8 of 16 runs
        // beside two busy loops replayed 5% more hits than they captured).
        let settings = Settings {
            trace: Some(path.clone()),
            conf: "regions=off".into(),
            ..settings()
        };
        let pool = pinpool_builder(&workload, &settings, None)
            .expect("settings")
            .faults(Arc::new(Faults::default()))
            .build()
            .expect("build the pool");
        run_strategy(Strategy::Pinpool(pool), &workload, None, None)
    };
    let trace = pinpool::trace::Trace::read(&path).expect("read the trace");
    std::fs::remove_file(&path).expect("remove the trace");
    let (replay, warnings) = Replay::new(&trace, None).expect("a replayable trace");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(replay.lost, 0);
    assert!(replay.complete);
    assert_eq!(replay.threads.len(), workload.provers());
    assert_eq!(
        replay.takes(),
        workload.provers() * workload.segments * (workload.arenas + workload.staging)
    );
    assert_eq!(replay.never_dropped(), 0);
    assert_eq!(replay.unmatched_drops, 0);
    assert_eq!(replay.peak_in_use_bytes(), captured.peak_in_use_bytes);

    let settings = Settings {
        conf: replay.conf.clone(),
        ..settings()
    };
    let pool = pinpool_builder(&replay, &settings, None)
        .expect("the trace's settings")
        .faults(Arc::new(Faults::default()))
        .build()
        .expect("build the pool");
    let replayed = replay::run_strategy(Strategy::Pinpool(pool), &replay, None, 1.0);
    let close = |what: &str, a: f64, b: f64| {
        assert!(
            (a - b).abs() <= 0.02 * a.abs().max(b.abs()),
            "{what}: captured {a}, replayed {b}"
        );
    };
    assert!(captured.peak_pinned_bytes > 0);
    close("hits (count)", captured.hit_rate, replayed.hit_rate);
    close(
        "hits (bytes)",
        captured.hit_rate_bytes,
        replayed.hit_rate_bytes,
    );
    close(
        "peak pinned",
        captured.peak_pinned_bytes as f64,
        replayed.peak_pinned_bytes as f64,
    );
    assert_eq!(replayed.bytes_requested, captured.bytes_requested);
    assert!(replayed.late_p99_ms.is_some() && captured.late_p99_ms.is_none());
}

/// Steady segments per second count the provers' segments after their
/// first quarter over the time they took: with a fixed 20 ms gap after
/// every segment, each later segment takes 20 ms or more, so two provers
/// make at most 100 a second, and about as many as over the whole run; a
/// prover with one segment has none after its first quarter. (The
/// window's arithmetic is tested in `run`'s unit tests.)
#[test]
fn steady_segments_per_s_counts_the_later_segments_over_their_time() {
    let _alone = alone();
    let mut workload = workload();
    workload.segments = 8;
    // (Gaps scale with the buffers: 20 ms at this scale.)
    workload.gap_ms = (20.0 / workload.scale, 20.0 / workload.scale);
    let result = run(Kind::Pageable, &workload, &settings(), None, None);
    let steady = result.steady_segments_per_s.expect("later segments");
    assert!(steady > 0.0 && steady <= 100.0, "{result:?}");
    // Nothing warms up in pageable staging: the whole run's rate, which
    // counts the first segments too, is the same but for noise.
    let overall = result.segments_per_s.unwrap();
    assert!(overall <= 100.0 && steady >= 0.9 * overall, "{result:?}");
    // Two later segments a prover still have a rate; a single segment,
    // none.
    workload.segments = 3;
    let result = run(Kind::Pageable, &workload, &settings(), None, None);
    let steady = result.steady_segments_per_s.expect("later segments");
    assert!(steady > 0.0 && steady <= 100.0, "{result:?}");
    workload.segments = 1;
    let result = run(Kind::Pageable, &workload, &settings(), None, None);
    assert_eq!(result.steady_segments_per_s, None, "{result:?}");
}
