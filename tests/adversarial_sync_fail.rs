//! Every device synchronize fails: event-less pinned buffers must be leaked
//! (counted), flush must return, and after the pool is closed and every
//! buffer dropped, registrations = unregistrations + leaked buffers.
#![cfg(feature = "testing")]

mod adversarial_util;

use std::time::Duration;

use adversarial_util::{eventually, faulty, within};

#[test]
fn failing_syncs_leak_counted_flush_returns_nothing_lost() {
    let (pool, faults) = faulty(2);
    let bufs: Vec<_> = (0..64).map(|i| pool.take(4096 << (i % 5))).collect();
    drop(bufs);
    pool.flush();
    let registered = faults.registered();
    assert!(registered > 0);
    let all: Vec<u64> = (1..100_000).collect();
    faults.fail_synchronize(&all);
    faults.hold_synchronize();
    let bufs: Vec<_> = (0..64).map(|i| pool.take(4096 << (i % 5))).collect();
    let pinned = bufs.iter().filter(|b| b.is_pinned()).count() as u64;
    // Drop them from several threads while syncs are held.
    let mut handles = Vec::new();
    let mut it = bufs.into_iter();
    for _ in 0..4 {
        let chunk: Vec<_> = it.by_ref().take(16).collect();
        handles.push(std::thread::spawn(move || drop(chunk)));
    }
    for h in handles {
        h.join().unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    faults.release();
    let p = pool.clone();
    within(Duration::from_secs(10), "flush", move || p.flush());
    let s = pool.stats();
    assert_eq!(
        s.fence_failures, pinned,
        "every event-less pinned buffer leaked"
    );
    // The pool still works, and shutdown returns.
    let p = pool.clone();
    within(Duration::from_secs(10), "shutdown", move || p.shutdown());
    let p = pool.clone();
    within(Duration::from_secs(10), "take after shutdown", move || {
        drop(p.take(4096));
        p.flush();
    });
    within(Duration::from_secs(10), "close", move || drop(pool));
    let ok = eventually(Duration::from_secs(5), || {
        faults.registered() == faults.unregistered() + pinned
    });
    assert!(
        ok,
        "registered {} != unregistered {} + leaked {pinned}",
        faults.registered(),
        faults.unregistered()
    );
}
