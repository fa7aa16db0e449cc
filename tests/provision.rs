//! Pinned memory over time: `reserve`, provisioning ahead of demand, idle
//! trimming.

mod common;

use std::time::{Duration, Instant};

use pinpool::{BackendKind, Error, Pool};

fn pool(idle_trim: Option<Duration>) -> Pool {
    let builder = Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(2);
    match idle_trim {
        Some(after) => builder.idle_trim(after),
        None => builder.no_idle_trim(),
    }
    .build()
    .unwrap()
}

/// Waits up to `limit` for `done`.
fn eventually(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn reserve_pins_ahead_and_flush_waits_for_it() {
    let pool = pool(None);
    pool.reserve(0, &[(1 << 20, 3), (4096, 2)]).unwrap();
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.pooled_buffers, 5);
    assert_eq!(stats.pooled_bytes, 3 * (1 << 20) + 2 * 4096);
    let bufs: Vec<_> = (0..3).map(|_| pool.take(1 << 20)).collect();
    assert!(bufs.iter().all(|b| b.was_pooled() && common::all_zero(b)));
    assert_eq!(pool.stats().misses, 0);
}

#[test]
fn bad_reservations_are_errors_and_reserve_nothing() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .devices(2)
        .max_pooled_bytes(16 << 20)
        .build()
        .unwrap();
    assert!(matches!(
        pool.reserve(2, &[(4096, 1)]),
        Err(Error::UnknownDevice { .. })
    ));
    assert!(matches!(
        pool.reserve(0, &[(4096, 1), (usize::MAX, 1)]),
        Err(Error::SizeTooLarge { .. })
    ));
    assert!(matches!(
        pool.reserve(0, &[(4096, 1), (8 << 20, 2)]),
        Err(Error::ReserveTooLarge { .. })
    ));
    assert!(matches!(
        pool.reserve(0, &[(4096, usize::MAX)]),
        Err(Error::ReserveTooLarge { .. })
    ));
    pool.flush();
    assert_eq!(
        pool.stats().pooled_buffers,
        0,
        "a failed reserve pinned something"
    );
}

#[test]
fn idle_buffers_are_trimmed_but_reserved_ones_stay() {
    let pool = pool(Some(Duration::from_millis(100)));
    pool.reserve(0, &[(1 << 20, 1)]).unwrap();
    let bufs: Vec<_> = (0..4).map(|_| pool.take(2 << 20)).collect();
    drop(bufs);
    pool.flush();
    assert_eq!(pool.stats().pooled_buffers, 5);
    // Trimming runs a quarter of the idle time apart, at least a second.
    eventually(Duration::from_secs(10), "idle trim", || {
        pool.stats().pooled_buffers == 1
    });
    let stats = pool.stats();
    assert_eq!(stats.pooled_bytes, 1 << 20, "the reserved buffer stays");
    assert_eq!(stats.trimmed_bytes, 4 * (2 << 20));
}

#[test]
fn trim_now_frees_idle_buffers() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .provision(false)
        .build()
        .unwrap();
    drop(pool.take(1 << 20));
    pool.flush();
    pool.trim();
    assert_eq!(pool.stats().pooled_buffers, 0);
    assert_eq!(pool.stats().trimmed_bytes, 1 << 20);
}

#[test]
fn provisioning_restores_what_recent_demand_needed() {
    let pool = pool(None);
    let bufs: Vec<_> = (0..3).map(|_| pool.take(1 << 20)).collect();
    std::thread::sleep(Duration::from_millis(200)); // a tick sees 3 in use
    drop(bufs);
    pool.flush();
    pool.set_max_pooled_bytes(0); // evicts all three
    assert_eq!(pool.stats().pooled_buffers, 0);
    pool.set_max_pooled_bytes(1 << 30);
    eventually(Duration::from_secs(10), "provisioning", || {
        pool.flush();
        pool.stats().pooled_buffers == 3
    });
    let bufs: Vec<_> = (0..3).map(|_| pool.take(1 << 20)).collect();
    assert!(bufs.iter().all(|b| b.was_pooled()));
}

#[test]
fn provisioning_off_leaves_evicted_classes_empty() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .provision(false)
        .build()
        .unwrap();
    let bufs: Vec<_> = (0..3).map(|_| pool.take(1 << 20)).collect();
    std::thread::sleep(Duration::from_millis(200));
    drop(bufs);
    pool.flush();
    pool.set_max_pooled_bytes(0);
    pool.set_max_pooled_bytes(1 << 30);
    std::thread::sleep(Duration::from_millis(500));
    pool.flush();
    assert_eq!(pool.stats().pooled_buffers, 0);
}

/// A class short of its mark is not provisioned while the shard holds idle
/// buffers of a larger class within the borrowing slack that no mark of
/// their own needs: takes of the short class borrow them instead.
#[cfg(feature = "testing")]
#[test]
fn provisioning_counts_idle_larger_buffers_that_takes_may_borrow() {
    let faults = std::sync::Arc::new(pinpool::testing::Faults::default());
    let pool = Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(2)
        .no_idle_trim()
        .build()
        .unwrap();
    let bufs: Vec<_> = (0..3).map(|_| pool.take(1 << 20)).collect();
    std::thread::sleep(Duration::from_millis(200)); // a tick sees 3 in use
    pool.reserve(0, &[(3 << 19, 3)]).unwrap(); // 1.5 MiB: within the slack
    pool.flush();
    assert_eq!(faults.register_calls(), 3);
    faults.fail_register(&[4, 5, 6]);
    drop(bufs); // their registrations fail: the 1 MiB class falls short
    pool.flush();
    std::thread::sleep(Duration::from_millis(300)); // ticks that could provision
    pool.flush();
    assert_eq!(
        faults.register_calls(),
        6,
        "provisioned 1 MiB buffers beside idle 1.5 MiB ones"
    );
    let bufs: Vec<_> = (0..3).map(|_| pool.take(1 << 20)).collect();
    assert!(bufs.iter().all(|b| b.was_pooled()), "takes borrow them");
}
