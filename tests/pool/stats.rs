//! Statistics: a readable table, broken down by device and class, and exact
//! after a mixed workload once the pool is quiet.

#[cfg(feature = "testing")]
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
#[cfg(feature = "testing")]
use std::sync::{Arc, Mutex};
#[cfg(feature = "testing")]
use std::time::Duration;

#[cfg(feature = "testing")]
use pinpool::{PinnedBuffer, SizeClasses};

use crate::common::host_pool;
#[cfg(feature = "testing")]
use crate::common::{all_zero, faulty_with_classes, state_freed};

#[test]
fn stats_display_is_a_readable_table() {
    let pool = host_pool(1);
    drop(pool.take(4096));
    pool.flush();
    let line = pool.stats().to_string();
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(line.contains("1 misses"), "{line}");
    let text = format!("{:#}", pool.stats());
    assert!(text.contains("host backend"), "{text}");
    assert!(text.contains("4.0 KiB"), "sizes in human units: {text}");
    assert!(text.lines().count() >= 8, "{text}");
}

#[test]
fn stats_break_down_by_device_and_class() {
    let pool = host_pool(2);
    let bufs = [
        pool.take_on(0, 4096).unwrap(),
        pool.take_on(1, 4096).unwrap(),
        pool.take_on(1, 1 << 20).unwrap(),
    ];
    drop(bufs);
    pool.flush();
    let stats = pool.stats();
    let devices: Vec<(usize, usize)> = stats
        .per_device
        .iter()
        .map(|d| (d.device, d.pooled_buffers))
        .collect();
    assert_eq!(devices, [(0, 1), (1, 2)]);
    assert_eq!(stats.per_device[1].pooled_bytes, 4096 + (1 << 20));
    let classes: Vec<(usize, usize, u64)> = stats
        .per_class
        .iter()
        .map(|c| (c.size, c.pooled_buffers, c.misses))
        .collect();
    assert_eq!(classes, [(4096, 2, 2), (1 << 20, 1, 1)]);
}

/// Threads take and pass buffers around (dropped by other threads), borrow,
/// and reuse their own; after joining and flushing, the counts are exact
/// and the pool lets its state go on close.
#[cfg(feature = "testing")]
#[test]
fn stats_exact_after_mixed_workload() {
    let (pool, faults) = faulty_with_classes(2, SizeClasses::PowersOfTwo);
    let takes = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::sync_channel::<PinnedBuffer>(64);
    let rx = Arc::new(Mutex::new(rx));
    let mut threads = Vec::new();
    for t in 0..4usize {
        let (pool, takes, bad, tx, rx) = (
            pool.clone(),
            takes.clone(),
            bad.clone(),
            tx.clone(),
            rx.clone(),
        );
        threads.push(std::thread::spawn(move || {
            for i in 0..2000usize {
                let size = [64usize, 4096, 8192, 1000][(i + t) % 4];
                let mut b = pool.take(size);
                takes.fetch_add(1, Ordering::Relaxed);
                if !all_zero(&b) {
                    bad.store(true, Ordering::Relaxed);
                }
                let n = b.len().min(48);
                b[..n].fill(0x5A);
                b.set_dirty_len(n);
                if i % 5 == 0 {
                    let _ = tx.try_send(b);
                } else {
                    drop(b);
                }
                if i % 7 == 0 {
                    if let Ok(b) = rx.lock().unwrap().try_recv() {
                        drop(b);
                    }
                }
            }
        }));
    }
    drop(tx);
    for t in threads {
        t.join().unwrap();
    }
    while let Ok(b) = rx.lock().unwrap().try_recv() {
        drop(b);
    }
    pool.flush();
    assert!(!bad.load(Ordering::Relaxed), "a non-zero buffer handed out");
    let s = pool.stats();
    assert_eq!(s.hits + s.misses, takes.load(Ordering::Relaxed), "{s:?}");
    assert_eq!(s.in_cleaner, 0, "{s:?}");
    let per_class: u64 = s.per_class.iter().map(|c| c.hits + c.misses).sum();
    assert_eq!(per_class, s.hits + s.misses, "{s:?}");
    let per_class_pooled: usize = s.per_class.iter().map(|c| c.pooled_buffers).sum();
    assert_eq!(per_class_pooled, s.pooled_buffers, "{s:?}");
    assert!(s.pooled_bytes <= s.max_pooled_bytes);
    drop(pool);
    assert!(
        state_freed(&faults, Duration::from_secs(5)),
        "nothing out, state kept ({} refs)",
        Arc::strong_count(&faults)
    );
}

/// The cleaner moves the ready buffers of threads gone idle from their
/// caches to the shards; a snapshot taken meanwhile counts each buffer
/// once, in a cache or in the shard, never both nor neither.
#[test]
fn a_snapshot_during_a_sweep_counts_each_pooled_buffer_once() {
    use std::sync::mpsc::channel;
    use std::time::{Duration, Instant};
    const THREADS: usize = 16;
    // Provisioning off: it would pool more than the threads dropped.
    let pool = pinpool::Pool::builder()
        .backend(pinpool::BackendKind::Host)
        .provision(false)
        .build()
        .unwrap();
    let (done, finished) = channel::<()>();
    // Every thread holds its buffers until all have taken theirs, so that
    // none takes another's: as many buffers pooled as taken.
    let all_taken = std::sync::Arc::new(std::sync::Barrier::new(THREADS));
    // Alive and idle between rounds, so that their caches are swept, all
    // at once.
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (pool, done, all_taken) = (pool.clone(), done.clone(), all_taken.clone());
            let (go, work) = channel::<bool>();
            let thread = std::thread::spawn(move || {
                let mut held = None;
                while let Ok(take) = work.recv() {
                    if take {
                        drop(held.take());
                        let bufs: Vec<_> =
                            (0..256).map(|i| pool.take(4096 * (1 + i % 4))).collect();
                        all_taken.wait();
                        drop(bufs);
                    } else {
                        // The take collects the cleaned buffers into the
                        // thread's lists, where a sweep finds them.
                        held = Some(pool.take(4096));
                    }
                    done.send(()).unwrap();
                }
            });
            (go, thread)
        })
        .collect();
    let each = |take: bool| {
        for (go, _) in &workers {
            go.send(take).unwrap();
        }
        for _ in &workers {
            finished.recv().unwrap();
        }
    };
    for round in 0..3 {
        each(true);
        pool.flush();
        each(false);
        let expected = THREADS * 256 - THREADS;
        // Within the sweep's longest wait, and a half again.
        let until = Instant::now() + Duration::from_millis(150);
        while Instant::now() < until {
            assert_eq!(pool.stats().pooled_buffers, expected, "round {round}");
        }
        pool.clear();
    }
    for (go, thread) in workers {
        drop(go);
        thread.join().unwrap();
    }
}

/// A trim takes idle buffers out of the pool and counts them as trimmed; a
/// snapshot taken meanwhile sees each buffer either pooled or trimmed, never
/// gone uncounted.
#[test]
fn a_snapshot_during_a_trim_sees_each_buffer_pooled_or_trimmed() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const BYTES: u64 = 4 * (2 << 20);
    let pool = pinpool::Pool::builder()
        .backend(pinpool::BackendKind::Host)
        .provision(false)
        .no_idle_trim()
        .build()
        .unwrap();
    for round in 0..300u64 {
        let bufs: Vec<_> = (0..4).map(|_| pool.take(2 << 20)).collect();
        drop(bufs);
        pool.flush();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let watcher = s.spawn(|| {
                // Relaxed: the flag only ends the loop.
                while !stop.load(Ordering::Relaxed) {
                    let stats = pool.stats();
                    let seen = stats.pooled_bytes as u64 + stats.trimmed_bytes;
                    assert!(
                        seen >= (round + 1) * BYTES,
                        "round {round}: {} pooled and {} trimmed",
                        stats.pooled_bytes,
                        stats.trimmed_bytes
                    );
                }
            });
            pool.trim();
            stop.store(true, Ordering::Relaxed);
            watcher.join().unwrap();
        });
        assert_eq!(pool.stats().trimmed_bytes, (round + 1) * BYTES);
    }
}
