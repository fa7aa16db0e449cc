//! pool life cycle. Dropping the last handle while other
//! threads hold and drop buffers, pools built and dropped in a loop (threads
//! and memory must not leak), many devices, huge and zero sizes, buffers of
//! exited threads.
#![cfg(feature = "testing")]

mod adversarial_util;

use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use adversarial_util::{all_zero, eventually, faulty, host, thread_count, within};
use pinpool::{BackendKind, Pool, SizeClasses, MAX_CLASS_SIZE};

/// Threads hold pinned buffers (some with unfinished copies) when the last
/// handle goes; they drop them afterwards. Every drop must be quick and call
/// nothing on the dropping thread, and every registration must be undone
/// once the copies finish.
#[test]
fn last_handle_dropped_while_threads_hold_and_drop_buffers() {
    let (pool, faults) = faulty(2);
    // Pin a few buffers of each size first.
    let sizes = [4096usize, 1 << 16, 1 << 20, 6 << 20];
    let warm: Vec<_> = sizes
        .iter()
        .flat_map(|&s| (0..4).map(move |_| s))
        .map(|s| pool.take(s))
        .collect();
    drop(warm);
    pool.flush();
    let fences: Arc<Mutex<Vec<pinpool::testing::TestFence>>> = Arc::default();
    let barrier = Arc::new(Barrier::new(5));
    let max_drop = Arc::new(Mutex::new(Duration::ZERO));
    let calls = Arc::new(Mutex::new(0usize));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let mut bufs: Vec<_> = sizes.iter().map(|&s| pool.take(s)).collect();
            let (fences, barrier, max_drop, calls, faults) = (
                fences.clone(),
                barrier.clone(),
                max_drop.clone(),
                calls.clone(),
                faults.clone(),
            );
            std::thread::spawn(move || {
                for (i, b) in bufs.iter_mut().enumerate() {
                    b.fill(t as u8 + 1);
                    if i % 2 == 0 {
                        let f = pinpool::testing::TestFence::default();
                        f.record(b);
                        fences.lock().unwrap().push(f);
                    }
                }
                barrier.wait(); // the pool is being dropped
                std::thread::sleep(Duration::from_millis(20));
                for b in bufs {
                    let t0 = Instant::now();
                    drop(b);
                    let took = t0.elapsed();
                    let mut m = max_drop.lock().unwrap();
                    *m = (*m).max(took);
                }
                *calls.lock().unwrap() += faults.calls_on(std::thread::current().id());
            })
        })
        .collect();
    drop(pool);
    barrier.wait();
    for t in threads {
        t.join().unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        faults.unregistered() < faults.registered(),
        "buffers with unfinished copies were unregistered"
    );
    for f in fences.lock().unwrap().drain(..) {
        f.complete();
    }
    assert!(
        eventually(Duration::from_secs(5), || faults.unregistered()
            == faults.registered()),
        "late buffers never released: {} registered, {} unregistered",
        faults.registered(),
        faults.unregistered()
    );
    assert_eq!(*calls.lock().unwrap(), 0, "a late drop called the backend");
    let max_drop = *max_drop.lock().unwrap();
    assert!(
        max_drop < Duration::from_millis(20),
        "a late drop took {max_drop:?}"
    );
}

/// Building, using and dropping pools in a loop leaks no threads (the
/// reaper is the one process-wide thread allowed) and little memory.
#[test]
fn pools_built_and_dropped_in_a_loop_leak_no_threads() {
    // Make sure the reaper exists before counting.
    {
        let pool = host(1);
        let b = pool.take(4096);
        drop(pool);
        drop(b);
    }
    std::thread::sleep(Duration::from_millis(50));
    let threads_before = thread_count();
    for i in 0..40 {
        let pool = host(1 + i % 4);
        let bufs: Vec<_> = (0..8).map(|j| pool.take(4096 << (j % 4))).collect();
        drop(bufs);
        if i % 2 == 0 {
            pool.flush();
        }
        std::thread::scope(|s| {
            s.spawn(|| drop(pool.take(1 << 20)));
        });
        drop(pool);
    }
    assert!(
        eventually(Duration::from_secs(2), || thread_count() <= threads_before),
        "threads before {threads_before}, after {}",
        thread_count()
    );
}

/// The most devices a pool serves, on the host backend: every device's
/// shard works, and the stats agree.
#[test]
fn many_host_devices_keep_buffers_on_their_devices() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .devices(pinpool::MAX_DEVICES)
        .cleaner_threads(2)
        .build()
        .unwrap();
    let bufs: Vec<_> = [0usize, 1, 31, pinpool::MAX_DEVICES - 1]
        .iter()
        .map(|&d| pool.take_on(d, 4096).unwrap())
        .collect();
    for (b, d) in bufs.iter().zip([0usize, 1, 31, pinpool::MAX_DEVICES - 1]) {
        assert_eq!(b.device(), d);
    }
    assert!(pool.take_on(pinpool::MAX_DEVICES, 4096).is_err());
    drop(bufs);
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.devices, pinpool::MAX_DEVICES);
    assert_eq!(stats.pooled_buffers, 4);
    for d in [0usize, 1, 31, pinpool::MAX_DEVICES - 1] {
        assert_eq!(stats.per_device[d].pooled_buffers, 1, "device {d}");
        let b = pool.take_on(d, 4096).unwrap();
        assert!(
            b.was_pooled(),
            "device {d}: the buffer came back to its own shard"
        );
        assert_eq!(b.device(), d);
    }
    assert!(Pool::builder()
        .backend(BackendKind::Host)
        .devices(0)
        .build()
        .is_err());
}

/// Every thread that takes from the pool keeps bookkeeping for every device
/// served, so the device count is bounded: above the bound the build fails
/// with a clear error, and at it one 4 KiB take on a fresh thread costs
/// little memory.
#[test]
#[cfg_attr(
    pinpool_asan,
    ignore = "a resident-memory bound: AddressSanitizer's shadow memory and redzones break it"
)]
fn a_thread_pays_little_for_the_devices_served() {
    let err = Pool::builder()
        .backend(BackendKind::Host)
        .devices(pinpool::MAX_DEVICES + 1)
        .build()
        .unwrap_err();
    assert!(
        err.to_string().contains("devices must be in 1..=64"),
        "{err}"
    );
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .devices(pinpool::MAX_DEVICES)
        .cleaner_threads(1)
        .build()
        .unwrap();
    drop(pool.take(4096));
    let before = adversarial_util::resident_bytes();
    std::thread::scope(|s| {
        s.spawn(|| drop(pool.take(4096)));
    });
    let grown = adversarial_util::resident_bytes().saturating_sub(before);
    assert!(
        grown < 8 << 20,
        "one 4 KiB take on a new thread grew resident memory by {} KiB",
        grown >> 10
    );
}

/// Zero and huge sizes: never an empty buffer, clear errors and panics.
#[test]
fn zero_and_huge_sizes() {
    for classes in [SizeClasses::Fine, SizeClasses::PowersOfTwo] {
        let pool = Pool::builder()
            .backend(BackendKind::Host)
            .size_classes(classes)
            .cleaner_threads(1)
            .build()
            .unwrap();
        let b = pool.take(0);
        assert!(!b.is_empty(), "take(0) handed out an empty buffer");
        assert!(all_zero(&b));
        drop(b);
        assert_eq!(pool.take(3).len(), 4);
        assert!(pool.take(4097).len() >= 4097);
        for bad in [MAX_CLASS_SIZE + 1, usize::MAX, usize::MAX / 2] {
            assert!(pool.try_take(bad).is_err(), "try_take({bad})");
            let p = pool.clone();
            let msg =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(p.take(bad))))
                    .expect_err("take of a size above the largest class must panic");
            let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(msg.contains("pinpool"), "unclear panic: {msg:?}");
        }
        // The largest class cannot be mapped here: a clear error, no panic.
        match pool.try_take(MAX_CLASS_SIZE) {
            Ok(b) => assert_eq!(b.len(), MAX_CLASS_SIZE),
            Err(e) => assert!(
                matches!(e, pinpool::Error::AllocationFailed { .. }),
                "not a clear allocation error: {e}"
            ),
        }
        pool.flush();
        assert_eq!(pool.stats().in_cleaner, 0);
    }
}

/// A thread fills its cache and exits; the buffers are reachable by others
/// (steal, sweep) and a new thread that inherits the cache gets them back
/// zeroed; nothing is handed out twice.
#[test]
fn exited_threads_caches_are_reachable_and_inherited_safely() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(2)
        .build()
        .unwrap();
    for round in 0..20 {
        let p = pool.clone();
        std::thread::spawn(move || {
            let bufs: Vec<_> = (0..8).map(|_| p.take(4096)).collect();
            for mut b in bufs {
                b[..100].fill(round as u8 + 1);
                b.set_dirty_len(100);
            }
        })
        .join()
        .unwrap();
        let p = pool.clone();
        within(Duration::from_secs(5), "inheriting thread", move || {
            let bufs: Vec<_> = (0..16).map(|_| p.take(4096)).collect();
            let mut ptrs: Vec<_> = bufs.iter().map(|b| b.as_ptr() as usize).collect();
            for b in &bufs {
                assert!(all_zero(b), "a non-zero buffer");
            }
            ptrs.sort_unstable();
            ptrs.dedup();
            assert_eq!(ptrs.len(), 16, "a buffer was handed out twice");
        });
    }
    let p = pool.clone();
    within(Duration::from_secs(5), "flush", move || p.flush());
    let stats = pool.stats();
    assert_eq!(stats.in_cleaner, 0);
    assert_eq!(stats.hits + stats.misses, 20 * 24);
}

/// A burst of takes after another thread left its buffers behind and went
/// away. Right after, a miss may steal one of them (steals that lock owners
/// out are rate-limited to one per millisecond per thread); the cleaner's
/// sweeps move an idle cache's buffers to the shards within a few sweep
/// periods (at most 100 ms each), after which a burst finds them all.
#[test]
fn burst_after_an_idle_thread_left_buffers_finds_them() {
    let pool = host(1);
    let p = pool.clone();
    std::thread::spawn(move || {
        let bufs: Vec<_> = (0..16).map(|_| p.take(4096)).collect();
        drop(bufs);
    })
    .join()
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let before = pool.stats();
    let bufs: Vec<_> = (0..16).map(|_| pool.take(4096)).collect();
    let after = pool.stats();
    drop(bufs);
    let hits = after.hits - before.hits;
    assert!(
        hits == 16,
        "only {hits} of 16 takes found the 16 buffers an exited thread left behind \
         ({} new allocations)",
        after.misses - before.misses
    );
}
