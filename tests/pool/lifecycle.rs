//! The pool's life cycle: shutdown, clear and working again afterwards,
//! clones, pools built and dropped in a loop, and life-cycle calls racing
//! each other and held device synchronizes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{
    all_zero, eventually, host, host_pool, host_pool_with, in_child, thread_count, within,
};
#[cfg(feature = "testing")]
use crate::common::{faulty, faulty_on};

#[test]
fn shutdown_drains_everything_and_pool_works_after() {
    let pool = host_pool(1);
    let mut buf = pool.take(1 << 15);
    buf.fill(0xEF);
    drop(buf);
    pool.shutdown();
    let stats = pool.stats();
    assert_eq!(
        stats.pooled_buffers, 0,
        "shutdown left buffers pooled (thread caches included)"
    );
    assert_eq!(stats.in_cleaner, 0);
    let buf = pool.take(1 << 15);
    assert_eq!(pool.stats().misses, 2, "the take after shutdown misses");
    drop(buf);
    pool.flush();
    assert_eq!(pool.stats().pooled_buffers, 1, "the cleaner came back");
    assert!(all_zero(&pool.take(1 << 15)));
    assert_eq!(pool.stats().hits, 1);
}

#[test]
fn clear_empties_shards_and_caches() {
    let pool = host_pool(2);
    let bufs: Vec<_> = (0..4)
        .map(|i| pool.take_on(i % 2, 1 << 14).unwrap())
        .collect();
    drop(bufs);
    pool.flush();
    assert_eq!(pool.stats().pooled_buffers, 4);
    pool.clear();
    let stats = pool.stats();
    assert_eq!((stats.pooled_buffers, stats.pooled_bytes), (0, 0));
    assert_eq!(stats.released, 4);
}

#[test]
fn clones_share_one_pool() {
    let pool = host_pool(1);
    let other = pool.clone();
    drop(pool.take(4096));
    other.flush();
    assert_eq!(other.stats().pooled_buffers, 1);
    drop(pool);
    assert!(!other.take(4096).is_pinned());
    assert_eq!(other.stats().hits, 1);
}

#[cfg(feature = "testing")]
#[test]
fn shutdown_unregisters_exactly_what_was_registered() {
    let (pool, faults) = faulty_on(2);
    let mut live = Vec::new();
    for round in 0..4 {
        for device in 0..2 {
            for shift in [12, 16, 20, 23] {
                live.push(pool.take_on(device, 1 << shift).unwrap());
            }
        }
        if round % 2 == 1 {
            live.clear();
            pool.flush();
        }
    }
    drop(live);
    pool.set_max_pooled_bytes(4 << 20); // evict some
    pool.shutdown();
    assert!(faults.registered() > 0);
    assert_eq!(
        faults.unregistered(),
        faults.registered(),
        "a registration was never undone"
    );
    let stats = pool.stats();
    assert_eq!(
        (stats.pooled_bytes, stats.pooled_buffers, stats.pinned_bytes),
        (0, 0, 0)
    );
}

/// Two threads loop take / drop / flush on 16 MiB buffers while a third
/// loops `shutdown`: nothing may hang, and the pool must end balanced.
fn shutdown_races_flush(workers: usize) {
    let pool = host_pool_with(1, workers);
    within(
        Duration::from_secs(60),
        "take/flush racing shutdown",
        move || {
            let stop = Arc::new(AtomicBool::new(false));
            let deadline = Instant::now() + Duration::from_secs(5);
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

/// Life-cycle calls racing while device synchronizes are held: everything
/// returns once they are released, and nothing registered stays registered.
#[cfg(feature = "testing")]
#[test]
fn shutdown_flush_clear_close_while_syncs_are_held() {
    for round in 0..5 {
        let (pool, faults) = faulty(if round % 2 == 0 { 1 } else { 2 });
        let bufs: Vec<_> = (0..16).map(|i| pool.take(4096 << (i % 6))).collect();
        drop(bufs);
        pool.flush();
        let bufs: Vec<_> = (0..16).map(|i| pool.take(4096 << (i % 6))).collect();
        faults.hold_synchronize();
        let mut threads = Vec::new();
        let (a, b, c) = (pool.clone(), pool.clone(), pool.clone());
        threads.push(std::thread::spawn(move || drop(bufs)));
        threads.push(std::thread::spawn(move || a.shutdown()));
        threads.push(std::thread::spawn(move || b.flush()));
        threads.push(std::thread::spawn(move || {
            c.clear();
            drop(c.take(1 << 20));
        }));
        let late = pool.take(1 << 16);
        let d = pool.clone();
        threads.push(std::thread::spawn(move || drop(d)));
        std::thread::sleep(Duration::from_millis(200));
        faults.release();
        within(Duration::from_secs(10), "life-cycle calls", move || {
            for t in threads {
                t.join().unwrap();
            }
        });
        within(Duration::from_secs(10), "close", move || drop(pool));
        drop(late);
        let ok = eventually(Duration::from_secs(5), || {
            faults.registered() == faults.unregistered()
        });
        assert!(
            ok,
            "round {round}: registered {} unregistered {}",
            faults.registered(),
            faults.unregistered()
        );
    }
}

/// After `shutdown`, dropping buffers must not start cleaner workers on the
/// dropping thread (spawning is neither cheap nor non-blocking); the pool
/// still works: a later take or flush brings the cleaner back. Alone in a
/// child process: it counts the process's threads, which other tests
/// running beside it would change.
#[test]
fn drop_after_shutdown_spawns_nothing_and_the_pool_works_again() {
    const TEST: &str = "drop_after_shutdown_spawns_nothing_and_the_pool_works_again";
    if in_child(module_path!(), TEST, &[]).is_some() {
        return;
    }
    let pool = host_pool_with(1, 2);
    let bufs: Vec<_> = (0..4).map(|_| pool.take(1 << 20)).collect();
    pool.shutdown();
    let before = thread_count();
    drop(bufs);
    let after = thread_count();
    assert!(
        after <= before,
        "dropping buffers started {} threads",
        after - before
    );
    pool.flush();
    assert_eq!(pool.stats().in_cleaner, 0);
    assert!(pool.take(1 << 20).was_pooled(), "the pool works again");
}

/// Building, using and dropping pools in a loop leaks no threads (the
/// reaper is the one process-wide thread allowed) and little memory.
/// Alone in a child process, as it counts the process's threads.
#[test]
fn pools_built_and_dropped_in_a_loop_leak_no_threads() {
    const TEST: &str = "pools_built_and_dropped_in_a_loop_leak_no_threads";
    if in_child(module_path!(), TEST, &[]).is_some() {
        return;
    }
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
