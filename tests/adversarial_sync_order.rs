//! A device synchronize that started *before* an event-less pinned buffer
//! was dropped must not count for it. Every synchronize after the first
//! (held) one fails, so a correct pool must leak the second buffer; a pool
//! that counted the earlier synchronize recycles it.
#![cfg(feature = "testing")]

mod adversarial_util;

use std::time::Duration;

use adversarial_util::{faulty, within};

#[test]
fn a_sync_started_before_the_drop_does_not_cover_it() {
    let (pool, faults) = faulty(2);
    let pair: Vec<_> = (0..2).map(|_| pool.take(1 << 16)).collect();
    drop(pair);
    pool.flush();
    let mut pair: Vec<_> = (0..2).map(|_| pool.take(1 << 16)).collect();
    assert!(pair.iter().all(|b| b.is_pinned() && b.was_pooled()));
    let x = pair.pop().unwrap();
    let y = pair.pop().unwrap();
    let c0 = faults.synchronize_calls();
    let syncs0 = pool.stats().device_syncs;
    faults.hold_synchronize();
    drop(y); // a worker starts synchronize N (held)
    std::thread::sleep(Duration::from_millis(300));
    let later: Vec<u64> = (c0 + 2..c0 + 10_000).collect();
    faults.fail_synchronize(&later);
    drop(x); // dropped after N started: only N+1 or later covers it
    std::thread::sleep(Duration::from_millis(300));
    faults.release();
    let p = pool.clone();
    within(Duration::from_secs(10), "flush", move || p.flush());
    let s = pool.stats();
    assert!(s.device_syncs > syncs0, "a synchronize ran");
    assert_eq!(
        (s.pooled_buffers, s.fence_failures),
        (1, 1),
        "x was recycled on the strength of a synchronize that started before \
         its drop ({} synchronize calls)",
        faults.synchronize_calls() - c0
    );
}

/// Same, with one worker: the synchronize for y runs on the worker, and x is
/// dropped while it is held.
#[test]
fn a_sync_started_before_the_drop_does_not_cover_it_one_worker() {
    let (pool, faults) = faulty(1);
    let pair: Vec<_> = (0..2).map(|_| pool.take(1 << 16)).collect();
    drop(pair);
    pool.flush();
    let mut pair: Vec<_> = (0..2).map(|_| pool.take(1 << 16)).collect();
    let x = pair.pop().unwrap();
    let y = pair.pop().unwrap();
    let c0 = faults.synchronize_calls();
    faults.hold_synchronize();
    drop(y);
    std::thread::sleep(Duration::from_millis(300));
    let later: Vec<u64> = (c0 + 2..c0 + 10_000).collect();
    faults.fail_synchronize(&later);
    drop(x);
    faults.release();
    let p = pool.clone();
    within(Duration::from_secs(10), "flush", move || p.flush());
    let s = pool.stats();
    assert_eq!((s.pooled_buffers, s.fence_failures), (1, 1));
}
