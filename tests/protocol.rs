//! The handoff protocol under real threads: shutdown racing flushes and
//! drops, drops that must never block or call the backend, bounded
//! backlogs, failed waits. Each test runs its racing part under a watchdog,
//! so a hang fails the test instead of stalling the run.
#![cfg(feature = "testing")]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pinpool::testing::{fence_calls_on, FenceCalls, TestFence};
use pinpool::{BackendKind, Pool};

use common::{faulty, within};

/// Two threads loop take / drop / flush on 16 MiB buffers while a third
/// loops `shutdown`: nothing may hang, and the pool must end balanced.
fn shutdown_races_flush(workers: usize) {
    let pool = common::host_pool_with(1, workers);
    within(
        Duration::from_secs(60),
        "take/flush racing shutdown",
        move || {
            let stop = Arc::new(AtomicBool::new(false));
            let deadline = Instant::now() + Duration::from_secs(10);
            std::thread::scope(|scope| {
                for _ in 0..2 {
                    let (pool, stop) = (&pool, &stop);
                    scope.spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            let mut buf = pool.take(16 << 20);
                            buf[..64].fill(1);
                            drop(buf);
                            pool.flush();
                        }
                    });
                }
                let (pool, stop) = (&pool, &stop);
                scope.spawn(move || {
                    while Instant::now() < deadline {
                        pool.shutdown();
                    }
                    stop.store(true, Ordering::Relaxed);
                });
            });
            pool.flush();
            pool.shutdown();
            let stats = pool.stats();
            assert_eq!((stats.in_cleaner, stats.pooled_buffers), (0, 0));
        },
    );
}

#[test]
fn shutdown_racing_flushes_never_hangs_one_worker() {
    shutdown_races_flush(1);
}

#[test]
fn shutdown_racing_flushes_never_hangs_three_workers() {
    shutdown_races_flush(3);
}

/// A drop while `shutdown` is stuck waiting for a device synchronize
/// returns at once and calls nothing on the dropping thread.
#[test]
fn drop_during_a_slow_shutdown_neither_blocks_nor_calls_the_backend() {
    let (pool, faults) = faulty(2);
    // A pinned buffer out, and one pooled, pinned without events: shutdown's
    // drain synchronizes the device for the latter.
    drop(pool.take(1 << 16));
    pool.flush();
    let pinned = pool.take(1 << 16);
    assert!(pinned.is_pinned());
    drop(pool.take(1 << 16));
    let other = pool.take(1 << 20);
    faults.hold_synchronize();
    let shutter = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.shutdown())
    };
    std::thread::sleep(Duration::from_millis(100));
    let (tx, rx) = std::sync::mpsc::channel();
    let faults2 = faults.clone();
    std::thread::spawn(move || {
        let started = Instant::now();
        drop(pinned);
        drop(other);
        let took = started.elapsed();
        let calls = faults2.calls_on(std::thread::current().id());
        let _ = tx.send((took, calls));
    });
    let outcome = rx.recv_timeout(Duration::from_secs(5));
    faults.release();
    shutter.join().unwrap();
    let (took, calls) = outcome.expect("a drop blocked behind a slow shutdown");
    assert!(took < Duration::from_millis(50), "the drops took {took:?}");
    assert_eq!(calls, 0, "a drop called the backend");
    pool.flush();
    assert_eq!(pool.stats().in_cleaner, 0);
}

/// After the last `Pool` handle is gone, dropping a buffer (pinned, no
/// events: it needs a device synchronize, then an unregistration) leaves
/// that work to someone else.
#[test]
fn drop_after_the_pool_is_gone_calls_nothing_on_the_dropping_thread() {
    let (pool, faults) = faulty(1);
    drop(pool.take(1 << 16));
    pool.flush();
    let buf = pool.take(1 << 16);
    assert!(buf.is_pinned());
    drop(pool);
    let faults2 = faults.clone();
    std::thread::spawn(move || {
        drop(buf);
        assert_eq!(
            faults2.calls_on(std::thread::current().id()),
            0,
            "the drop synchronized or unregistered on the dropping thread"
        );
    })
    .join()
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while faults.unregistered() < faults.registered() {
        assert!(
            Instant::now() < deadline,
            "the late buffer was never released"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A buffer whose copies could not be waited for (the fence failed) must
/// not go back to the allocator: it is leaked, never unregistered.
#[test]
fn failed_fence_leaks_the_buffer_instead_of_freeing_it() {
    let (pool, faults) = faulty(1);
    drop(pool.take(1 << 16));
    pool.flush();
    let mut buf = pool.take(1 << 16);
    assert!(buf.is_pinned());
    let fence = TestFence::default();
    fence.record(&mut buf);
    drop(buf);
    fence.fail();
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.fence_failures, 1);
    assert_eq!(stats.pooled_buffers, 0);
    assert_eq!(
        faults.unregistered(),
        0,
        "memory a copy may still read was unregistered"
    );
}

/// The same for a failed device synchronize (pinned buffer, no events).
#[test]
fn failed_synchronize_leaks_the_buffer_instead_of_freeing_it() {
    let (pool, faults) = faulty(1);
    drop(pool.take(1 << 16));
    pool.flush();
    let buf = pool.take(1 << 16);
    let next = faults.synchronize_calls() + 1;
    faults.fail_synchronize(&[next]);
    drop(buf);
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.fence_failures, 1);
    assert_eq!(
        faults.unregistered(),
        0,
        "memory a copy may still read was unregistered"
    );
}

/// Dropping written buffers faster than the cleaner can zero them must not
/// grow its backlog (and the memory it holds) without bound.
#[test]
fn host_recycling_backlog_is_bounded() {
    const SIZE: usize = 64 << 20;
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(1)
        .max_pooled_bytes(1 << 30)
        .build()
        .unwrap();
    let base = common::resident_bytes();
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
                    let grown = common::resident_bytes().saturating_sub(base);
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
/// bounded backlog, and returns within a second.
#[test]
fn flush_returns_within_a_second_while_small_drops_outrun_the_cleaner() {
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
        worst < Duration::from_secs(1),
        "a flush waited {worst:?} behind the cleaner's backlog"
    );
    assert_eq!(pool.stats().in_cleaner, 0);
}

/// A miss buffer dropped while the registration backlog is full is freed
/// by its dropper (so that misses cannot grow the queue), but its fences
/// (CUDA events, which only the driver destroys, and spare events, which
/// go back to a process-wide pool under a lock) go to the cleaner: the
/// dropping thread destroys none and takes no event-pool lock.
#[test]
fn a_miss_freed_past_the_registration_backlog_leaves_its_fences_to_the_cleaner() {
    let (pool, faults) = faulty(1);
    // The only worker stuck in a device synchronize: registrations queue.
    drop(pool.take(1 << 16));
    pool.flush();
    let pinned = pool.take(1 << 16);
    assert!(pinned.is_pinned());
    faults.hold_synchronize();
    drop(pinned);
    std::thread::sleep(Duration::from_millis(50));
    // One worker: a backlog of 64 + 16 registrations.
    let misses: Vec<_> = (0..80).map(|_| pool.take(1 << 20)).collect();
    assert!(misses.iter().all(|b| !b.is_pinned()));
    drop(misses);
    let mut last = pool.take(1 << 20);
    let fence = TestFence::default();
    fence.record(&mut last);
    fence.complete();
    let me = std::thread::current().id();
    let before = pool.stats().registrations_skipped;
    drop(last);
    let (skipped, calls) = (pool.stats().registrations_skipped, fence_calls_on(me));
    faults.release();
    pool.flush();
    assert_eq!(
        skipped,
        before + 1,
        "the miss buffer was queued, not freed by its dropper"
    );
    assert_eq!(
        calls,
        FenceCalls::default(),
        "the drop destroyed a fence or locked the event pool"
    );
    assert_eq!(pool.stats().in_cleaner, 0);
    assert_eq!(fence_calls_on(me), FenceCalls::default());
}
