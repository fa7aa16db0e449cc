//! "Dropping a buffer never blocks and never calls CUDA, in every state of
//! the pool": drops during a stuck clear, eviction, flush or shutdown,
//! after the pool is gone, across threads, and past the registration
//! backlog. Drops are timed and the fault backend says which thread made
//! each backend call.

use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(feature = "testing")]
use pinpool::testing::{fence_calls_on, FenceCalls, TestFence};
use pinpool::{BackendKind, Pool};

#[cfg(feature = "testing")]
use crate::common::{eventually, faulty, within};

fn timed_drop(buf: pinpool::PinnedBuffer) -> Duration {
    let t0 = Instant::now();
    drop(buf);
    t0.elapsed()
}

/// The calling thread's involuntary context switches so far: the times the
/// scheduler took its core away while it could run.
fn preemptions() -> i64 {
    // SAFETY: all zeros is a valid `rusage`.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `RUSAGE_THREAD` fills `usage` for the calling thread.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    usage.ru_nivcsw
}

/// Drops during a clear, an eviction and a flush that are stuck in the
/// backend (a held device synchronize) neither block nor call the backend.
#[cfg(feature = "testing")]
#[test]
fn drops_during_stuck_clear_evict_and_flush_neither_block_nor_call() {
    let (pool, faults) = faulty(2);
    let warm: Vec<_> = (0..8).map(|i| pool.take(4096 << (i % 4))).collect();
    drop(warm);
    pool.flush();
    let held: Vec<_> = (0..8).map(|i| pool.take(4096 << (i % 4))).collect();
    assert!(held.iter().all(|b| b.is_pinned()));
    // An event-less pinned buffer in the cleaner: a flush blocks on it.
    drop(pool.take(1 << 16));
    faults.hold_synchronize();
    let flusher = {
        let p = pool.clone();
        std::thread::spawn(move || p.flush())
    };
    let clearer = {
        let p = pool.clone();
        std::thread::spawn(move || {
            for _ in 0..50 {
                p.clear();
                p.set_max_pooled_bytes(4096);
                p.set_max_pooled_bytes(1 << 30);
            }
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    let faults2 = faults.clone();
    let (took, calls) = within(Duration::from_secs(5), "drops while stuck", move || {
        let t0 = Instant::now();
        drop(held);
        (t0.elapsed(), faults2.calls_on(std::thread::current().id()))
    });
    faults.release();
    flusher.join().unwrap();
    clearer.join().unwrap();
    // A drop stuck behind the registration would last until the release
    // above, after `within`'s 5 s: a second tells the two apart on a
    // loaded machine too.
    assert!(took < Duration::from_secs(1), "drops took {took:?}");
    assert_eq!(calls, 0, "a drop called the backend");
    pool.shutdown();
    assert!(eventually(Duration::from_secs(2), || faults.registered()
        == faults.unregistered()));
}

/// Cross-thread drops of many buffers taken on a thread that keeps
/// stealing and evicting: each drop is quick. (A drop during which the
/// scheduler took the dropping thread's core away does not count: on a
/// loaded machine such a drop can take 100 ms without waiting for
/// anything.)
#[test]
fn cross_thread_drops_are_quick() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(2)
        .max_pooled_bytes(8 << 20)
        .build()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::sync_channel::<pinpool::PinnedBuffer>(1024);
    let worst = Arc::new(std::sync::Mutex::new(Duration::ZERO));
    let dropper = {
        let worst = worst.clone();
        std::thread::spawn(move || {
            for b in rx {
                let before = preemptions();
                let t = timed_drop(b);
                if preemptions() != before {
                    continue;
                }
                let mut w = worst.lock().unwrap();
                *w = (*w).max(t);
            }
        })
    };
    let deadline = Instant::now() + Duration::from_millis(1500);
    let mut i = 0usize;
    while Instant::now() < deadline {
        let mut b = pool.take(4096 << (i % 6));
        b[..64].fill(1);
        b.set_dirty_len(64);
        tx.send(b).unwrap();
        if i.is_multiple_of(1000) {
            pool.set_max_pooled_bytes(if i.is_multiple_of(2000) {
                4096
            } else {
                8 << 20
            });
        }
        i += 1;
    }
    drop(tx);
    dropper.join().unwrap();
    pool.flush();
    let worst = *worst.lock().unwrap();
    assert!(
        worst < Duration::from_millis(100),
        "worst cross-thread drop {worst:?}"
    );
}

/// A drop while `shutdown` is stuck waiting for a device synchronize
/// returns at once and calls nothing on the dropping thread.
#[cfg(feature = "testing")]
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
    // A drop blocked behind the shutdown would last until the release
    // above, after the 5 s wait: a second tells the two apart on a loaded
    // machine too.
    assert!(took < Duration::from_secs(1), "the drops took {took:?}");
    assert_eq!(calls, 0, "a drop called the backend");
    pool.flush();
    assert_eq!(pool.stats().in_cleaner, 0);
}

/// After the last `Pool` handle is gone, dropping a buffer (pinned, no
/// events: it needs a device synchronize, then an unregistration) leaves
/// that work to someone else.
#[cfg(feature = "testing")]
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

/// A miss buffer dropped while the registration backlog is full is freed
/// by its dropper (so that misses cannot grow the queue), but its fences
/// (CUDA events, which only the driver destroys, and spare events, which
/// go back to a process-wide pool under a lock) go to the cleaner: the
/// dropping thread destroys none and takes no event-pool lock.
#[cfg(feature = "testing")]
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

/// A buffer dropped by a thread other than its taker waits for the taker
/// (whose next take re-zeroes it) only while its dirty prefix is small
/// enough for a take to re-zero; a larger one goes to the cleaner. What
/// counts is the prefix at the drop: narrowed, widened or narrowed again.
///
/// A taker that takes nothing between two sweeps of the cleaner looks
/// idle, and the sweep moves what waits for it to the cleaner: on a loaded
/// box the taker's thread may stand still that long between the drop and
/// its take (two runs of the suite on two cores: 6 runs in 60 found the
/// buffer re-zeroed by the cleaner). A buffer that should wait for the
/// taker is tried up to three times, and the test fails only if it never
/// did.
#[test]
fn a_drop_elsewhere_leaves_only_a_small_dirty_prefix_to_the_taker() {
    const SIZE: usize = 1 << 20;
    let cases: [(&[usize], bool); 5] = [
        (&[10], true),
        (&[], false),
        (&[usize::MAX], false),
        (&[10, usize::MAX], false),
        (&[usize::MAX, 100], true),
    ];
    // How many times the taker re-zeroed the buffer dropped elsewhere.
    let cleaned_by_taker = |lens: &[usize]| {
        // One buffer of the class in the pool, ready.
        let pool = Pool::builder()
            .backend(BackendKind::Host)
            .max_pooled_bytes(1 << 30)
            .build()
            .unwrap();
        drop(pool.take(SIZE));
        pool.flush();
        let mut buf = pool.take(SIZE);
        let written = lens.last().map_or(SIZE, |&len| len.min(SIZE));
        buf[..written].fill(7);
        for &len in lens {
            buf.set_dirty_len(len);
        }
        std::thread::scope(|s| {
            s.spawn(move || drop(buf));
        });
        let again = pool.take(SIZE);
        assert!(again.iter().all(|&b| b == 0), "{lens:?}: not zero");
        pool.stats().cleaned_by_takers
    };
    for (lens, to_taker) in cases {
        let tries: Vec<u64> = if to_taker {
            let mut tries = Vec::new();
            while tries.len() < 3 && !tries.contains(&1) {
                tries.push(cleaned_by_taker(lens));
            }
            tries
        } else {
            vec![cleaned_by_taker(lens)]
        };
        assert_eq!(
            tries.last(),
            Some(&u64::from(to_taker)),
            "{lens:?}: re-zeroed by the taker {tries:?} times, in turn"
        );
    }
}
