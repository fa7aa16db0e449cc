//! A workload that shrinks: segments of large buffers, then of small ones
//! (the defaults tests, and the GPU test of the same).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pinpool::Pool;

use super::Rng;

/// Runs segments of `buffers` log-uniform sizes up to `hi` on each of
/// `threads` threads until `stop`, tracking the bytes held at once.
pub fn segments(
    pool: &Pool,
    threads: usize,
    hi: usize,
    seed: u64,
    stop: &(dyn Fn(usize) -> bool + Sync),
    peak_held: &AtomicU64,
) {
    let held = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..threads {
            let held = &held;
            s.spawn(move || {
                let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9) + t as u64 + 1);
                let mut segment = 0;
                while !stop(segment) {
                    let bufs: Vec<_> = (0..24)
                        .map(|_| {
                            let size = rng.log_uniform(4096, hi);
                            let mut b = pool.take(size);
                            let written = size / 4;
                            b[..written].fill(1);
                            b.set_dirty_len(written);
                            let now = held.fetch_add(size as u64, Ordering::Relaxed) + size as u64;
                            peak_held.fetch_max(now, Ordering::Relaxed);
                            (b, size)
                        })
                        .collect();
                    std::thread::sleep(Duration::from_millis(2));
                    let asked: usize = bufs.iter().map(|(_, size)| size).sum();
                    held.fetch_sub(asked as u64, Ordering::Relaxed);
                    drop(bufs);
                    std::thread::sleep(Duration::from_millis(2));
                    segment += 1;
                }
            });
        }
    });
}

/// What [`pinned_after`] saw.
#[derive(Debug, Clone, Copy)]
pub struct After {
    /// The most bytes pinned over the last quarter.
    pub pinned: u64,
    /// The most bytes the small segments held at once.
    pub held: u64,
    /// The most bytes the large segments pinned (0 without them).
    pub large: u64,
    /// The most buffers in the cleaner at once during the small segments
    /// (sampled every 20 ms): dropped and not yet ready. Memory carved for
    /// them is memory the pool needed at once, and keeps for a window.
    pub backlog: usize,
    /// The same from three quarters of an idle-trim time on: what the
    /// pool needed at once then is still in the window it keeps memory
    /// for when `pinned` is sampled.
    pub late_backlog: usize,
}

/// Segments of buffers up to 8 MiB first if `large`, then segments of
/// buffers up to `small_hi` bytes for two and a quarter of `pool`'s
/// idle-trim times.
pub fn pinned_after(pool: &Pool, large: bool, small_hi: usize, seed: u64) -> After {
    let idle_trim = pool.config().idle_trim.expect("an idle-trim time");
    let mut large_pinned = 0;
    if large {
        let held = AtomicU64::new(0);
        segments(pool, 4, 8 << 20, seed, &|segment| segment >= 20, &held);
        assert!(held.into_inner() >= 64 << 20);
        pool.flush();
        large_pinned = pool.stats().peak_pinned_bytes;
    }
    let small = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let worst = AtomicU64::new(0);
    let (backlog, late_backlog) = (AtomicUsize::new(0), AtomicUsize::new(0));
    std::thread::scope(|s| {
        s.spawn(|| {
            let start = Instant::now();
            while start.elapsed() < idle_trim * 9 / 4 {
                let stats = pool.stats();
                backlog.fetch_max(stats.in_cleaner, Ordering::Relaxed);
                if start.elapsed() >= idle_trim * 3 / 4 {
                    late_backlog.fetch_max(stats.in_cleaner, Ordering::Relaxed);
                }
                if start.elapsed() >= 2 * idle_trim {
                    worst.fetch_max(stats.pinned_bytes, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            stop.store(true, Ordering::Relaxed);
        });
        segments(
            pool,
            4,
            small_hi,
            seed + 7,
            &|_| stop.load(Ordering::Relaxed),
            &small,
        );
    });
    After {
        pinned: worst.into_inner(),
        held: small.into_inner(),
        large: large_pinned,
        backlog: backlog.into_inner(),
        late_backlog: late_backlog.into_inner(),
    }
}
