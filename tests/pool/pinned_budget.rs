//! The pinned budget: the most bytes page-locked at once, in use and idle.

use std::sync::Arc;

use pinpool::testing::Faults;
use pinpool::{Error, Pool};

const MIB: usize = 1 << 20;

fn pool(budget: usize) -> Pool {
    Pool::builder()
        .regions(false)
        .faults(Arc::new(Faults::default()))
        .cleaner_threads(2)
        .provision(false)
        .max_pinned_bytes(budget)
        .build()
        .unwrap()
}

#[test]
fn misses_past_the_budget_are_not_pinned() {
    let pool = pool(4 * MIB);
    let bufs: Vec<_> = (0..8).map(|_| pool.take(MIB)).collect();
    drop(bufs);
    pool.flush();
    let stats = pool.stats();
    assert!(stats.pinned_bytes <= 4 * MIB as u64, "{stats:#?}");
    assert_eq!(stats.pinned_bytes, stats.peak_pinned_bytes, "{stats:#?}");
    assert!(stats.registrations_skipped >= 4, "{stats:#?}");
    assert_eq!(stats.max_pinned_bytes, 4 * MIB as u64);
    // What is pooled is pinned; the rest of the takes miss, pageable.
    let again: Vec<_> = (0..8).map(|_| pool.take(MIB)).collect();
    let pinned = again.iter().filter(|b| b.is_pinned()).count();
    assert!(pinned <= 4 && pinned == again.iter().filter(|b| b.was_pooled()).count());
    drop(again);
    pool.flush();
    assert!(pool.stats().peak_pinned_bytes <= 4 * MIB as u64);
}

#[test]
fn lowering_the_budget_releases_idle_pinned_buffers_at_once() {
    let pool = pool(usize::MAX);
    drop((0..8).map(|_| pool.take(MIB)).collect::<Vec<_>>());
    pool.flush();
    assert_eq!(pool.stats().pinned_bytes, 8 * MIB as u64);
    pool.set_max_pinned_bytes(2 * MIB);
    let stats = pool.stats();
    assert!(stats.pinned_bytes <= 2 * MIB as u64, "{stats:#?}");
    assert_eq!(pool.config().max_pinned_bytes, Some(2 * MIB));
}

#[test]
fn buffers_in_use_past_a_lowered_budget_are_released_when_dropped() {
    let pool = pool(usize::MAX);
    drop((0..4).map(|_| pool.take(MIB)).collect::<Vec<_>>());
    pool.flush();
    let held: Vec<_> = (0..4).map(|_| pool.take(MIB)).collect();
    assert!(held.iter().all(|b| b.is_pinned()));
    pool.set_max_pinned_bytes(MIB);
    // In use: still pinned.
    assert_eq!(pool.stats().pinned_bytes, 4 * MIB as u64);
    drop(held);
    pool.flush();
    let stats = pool.stats();
    assert!(stats.pinned_bytes <= MIB as u64, "{stats:#?}");
}

#[test]
fn reserving_past_the_budget_is_an_error_and_reserves_nothing() {
    let pool = pool(4 * MIB);
    let err = pool.reserve(0, &[(MIB, 8)]).unwrap_err();
    assert!(
        matches!(err, Error::ReservePastPinnedBudget { .. }),
        "{err}"
    );
    pool.flush();
    assert_eq!(pool.stats().pinned_bytes, 0);
    pool.reserve(0, &[(MIB, 4)]).unwrap();
    pool.flush();
    assert_eq!(pool.stats().pinned_bytes, 4 * MIB as u64);
}

#[test]
fn provisioning_pins_nothing_past_the_budget() {
    let pool = Pool::builder()
        .regions(false)
        .faults(Arc::new(Faults::default()))
        .cleaner_threads(2)
        .max_pinned_bytes(3 * MIB)
        .build()
        .unwrap();
    // A demand of 6 buffers at once, then idle: provisioning would pin
    // them back after any loss, but not past the budget.
    for _ in 0..3 {
        drop((0..6).map(|_| pool.take(MIB)).collect::<Vec<_>>());
        pool.flush();
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let stats = pool.stats();
    assert!(stats.peak_pinned_bytes <= 3 * MIB as u64, "{stats:#?}");
}
