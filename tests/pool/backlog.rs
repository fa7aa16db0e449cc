//! The cleaner's backlogs are bounded: dropping faster than the cleaner
//! can zero or recycle does not grow the memory it holds, or the wait of a
//! flush, without bound; past the bound, droppers free their own buffers.

#[cfg(feature = "testing")]
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pinpool::{BackendKind, Pool};

#[cfg(feature = "testing")]
use crate::common::faulty;
use crate::common::{in_child, resident_bytes};

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// On the host backend, a drop whose dirty bytes would push the zeroing
/// backlog past its limit (half the cap, clamped to 64 MiB..2 GiB) is freed
/// by the dropping thread itself, at once: an overloaded cleaner makes the
/// droppers pay for their own frees instead of queueing without bound. The
/// buffer is gone before the drop returns, and no flush is needed.
#[test]
fn a_large_written_buffer_over_the_backlog_is_freed_by_its_dropper() {
    const SIZE: usize = 1536 << 20;
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(1)
        .max_pooled_bytes(1 << 20)
        .build()
        .unwrap();
    let mut buf = pool.take(SIZE);
    buf.fill(1); // resident
    let (wall, cpu) = (Instant::now(), thread_cpu());
    drop(buf);
    let (wall, cpu) = (wall.elapsed(), thread_cpu() - cpu);
    let stats = pool.stats();
    assert_eq!(
        stats.zeroing_skipped, 1,
        "the drop took the zero-backlog branch"
    );
    assert_eq!(
        stats.released, 1,
        "freed by the dropping thread, before any flush"
    );
    assert_eq!(stats.in_cleaner, 0, "nothing queued for the cleaner");
    // The unmapping is the dropper's only work: well under a second.
    assert!(
        cpu < Duration::from_secs(1),
        "dropping a written {} MiB buffer cost the dropping thread {cpu:?} of CPU ({wall:?} wall)",
        SIZE >> 20
    );
}

/// Dropping written buffers faster than the cleaner can zero them must not
/// grow its backlog (and the memory it holds) without bound. Alone in a
/// child process, as it measures the process's resident memory.
#[test]
fn host_recycling_backlog_is_bounded() {
    const TEST: &str = "host_recycling_backlog_is_bounded";
    if in_child(module_path!(), TEST, &[]).is_some() {
        return;
    }
    const SIZE: usize = 64 << 20;
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(1)
        .max_pooled_bytes(1 << 30)
        .build()
        .unwrap();
    let base = resident_bytes();
    let peak = std::sync::Mutex::new(0usize);
    let deadline = Instant::now() + Duration::from_secs(2);
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                while Instant::now() < deadline {
                    // Fresh buffers, written in full: each costs the cleaner
                    // 64 MiB of zeroing.
                    let bufs: Vec<_> = (0..2).map(|_| pool.take(SIZE)).collect();
                    for mut buf in bufs {
                        buf.fill(1);
                        drop(buf);
                    }
                    let grown = resident_bytes().saturating_sub(base);
                    let mut peak = peak.lock().unwrap();
                    *peak = (*peak).max(grown);
                }
            });
        }
    });
    let peak = *peak.lock().unwrap();
    pool.flush();
    assert!(
        peak <= 3 << 30,
        "resident memory grew by {} MiB while dropping faster than the cleaner zeroes",
        peak >> 20
    );
}

/// Sixteen threads drop small pinned buffers (no events: each needs the
/// cleaner) as fast as they can, far faster than two workers on two cores
/// recycle them. The pinned population grows with every registration of a
/// miss (256-byte buffers: sixteen per registered slab, so that it grows
/// within seconds), but the cleaner's backlog stays bounded in buffers:
/// past it, pinned buffers are released in bulk. So a flush waits for a
/// bounded backlog: a few milliseconds of the workers' time, stretched by
/// the sixteen threads competing with them for two cores (and by the other
/// tests running at once), and well within three seconds.
#[cfg(feature = "testing")]
#[test]
fn flush_returns_within_seconds_while_small_drops_outrun_the_cleaner() {
    let (pool, _faults) = faulty(2);
    let stop = AtomicBool::new(false);
    let worst = std::thread::scope(|scope| {
        for _ in 0..16 {
            let (pool, stop) = (&pool, &stop);
            scope.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let bufs: Vec<_> = (0..8).map(|_| pool.take(256)).collect();
                    drop(bufs);
                }
            });
        }
        std::thread::sleep(Duration::from_millis(500));
        let mut worst = Duration::ZERO;
        for _ in 0..4 {
            let started = Instant::now();
            pool.flush();
            worst = worst.max(started.elapsed());
            std::thread::sleep(Duration::from_millis(500));
        }
        stop.store(true, Ordering::Relaxed);
        worst
    });
    pool.flush();
    assert!(
        worst < Duration::from_secs(3),
        "a flush waited {worst:?} behind the cleaner's backlog"
    );
    assert_eq!(pool.stats().in_cleaner, 0);
}

/// A copy pipeline deeper than the cleaner's recycling backlog: more
/// pinned buffers wait for their copies at once than the backlog holds
/// queued. The waiting ones are parked, not queued, so they must not fill
/// the backlog: no later drop is shed, and every buffer comes back pinned.
#[cfg(feature = "testing")]
#[test]
fn copies_in_flight_past_the_recycling_backlog_keep_their_pinned_buffers() {
    use pinpool::testing::{Faults, TestFence};
    use std::sync::Arc;
    // Past the recycling backlog (4096 buffers).
    const N: usize = 5000;
    let faults = Arc::new(Faults::default());
    let pool = Pool::builder()
        .regions(false)
        .faults(faults)
        .cleaner_threads(2)
        .provision(false)
        .max_pooled_bytes(256 << 20)
        .thread_cache_bytes(0)
        .build()
        .unwrap();
    pool.reserve(0, &[(4096, N)]).unwrap();
    pool.flush();
    assert_eq!(pool.stats().pooled_buffers, N);
    let mut bufs: Vec<_> = (0..N).map(|_| pool.take(4096)).collect();
    assert!(bufs.iter().all(|b| b.is_pinned() && b.was_pooled()));
    let fence = TestFence::default();
    for buf in &mut bufs {
        fence.record(buf);
    }
    // Dropped in batches the cleaner parks as they come (a batch never
    // fills the queue on its own).
    while !bufs.is_empty() {
        let rest = bufs.split_off(bufs.len().saturating_sub(500));
        drop(rest);
        std::thread::sleep(Duration::from_millis(50));
    }
    fence.complete();
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.zeroing_skipped, 0, "drops were shed: {stats:#?}");
    assert_eq!(stats.pooled_buffers, N, "{stats:#?}");
    assert_eq!(stats.pinned_bytes, (N * 4096) as u64);
}
