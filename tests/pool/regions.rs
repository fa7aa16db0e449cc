//! Buffers carved from regions (`PoolBuilder::regions`) on the fault
//! backend, which "pins": few registrations, memory moving between size
//! classes, and every region unregistered by `shutdown`, a held buffer's
//! with that buffer.

use std::sync::Arc;

use pinpool::testing::Faults;
use pinpool::Pool;

fn carving() -> (Pool, Arc<Faults>) {
    let faults = Arc::new(Faults::default());
    let pool = Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(2)
        .provision(false)
        .regions(true)
        .build()
        .unwrap();
    (pool, faults)
}

const SIZES: [usize; 6] = [300 << 10, 1 << 20, 2 << 20, 700 << 10, 3 << 20, 5 << 20];

#[test]
fn misses_are_met_by_one_region_and_the_next_takes_carve_from_it() {
    let (pool, faults) = carving();
    let first: Vec<_> = SIZES.iter().map(|&n| pool.take(n)).collect();
    assert!(first.iter().all(|b| !b.was_pooled() && !b.is_pinned()));
    drop(first);
    pool.flush();
    let stats = pool.stats();
    assert!(stats.regions >= 1, "no region: {stats:#?}");
    assert!(
        faults.registered() <= 2,
        "{} registrations for six misses",
        faults.registered()
    );
    let total: usize = SIZES.iter().sum();
    assert!(stats.region_bytes >= total, "the region misses demand");
    let mut again: Vec<_> = SIZES.iter().map(|&n| pool.take(n)).collect();
    for b in &again {
        assert!(b.was_pooled() && b.is_pinned(), "a take missed the region");
        assert!(b.iter().all(|&x| x == 0));
    }
    for b in &mut again {
        b.fill(0xAB);
    }
    drop(again);
    pool.flush();
    assert!(
        faults.registered() <= 2,
        "registered again for the same demand"
    );
    pool.shutdown();
    assert_eq!(faults.registered(), faults.unregistered());
    assert_eq!(pool.stats().regions, 0);
}

#[test]
fn a_large_buffer_given_back_is_carved_into_smaller_classes() {
    let (pool, _faults) = carving();
    drop(pool.take(8 << 20));
    pool.flush();
    // Once back in its region the large buffer's space serves other sizes,
    // all-zero, although they were never taken before.
    let small: Vec<_> = (0..6).map(|_| pool.take(1 << 20)).collect();
    for b in &small {
        assert!(b.was_pooled() && b.is_pinned());
        assert!(b.iter().all(|&x| x == 0));
    }
    let stats = pool.stats();
    assert!(stats.carved >= 6, "{stats:#?}");
    drop(small);
    pool.shutdown();
}

#[test]
fn shutdown_with_a_carved_buffer_held_unregisters_its_region_with_it() {
    let (pool, faults) = carving();
    drop(pool.take(1 << 20));
    pool.flush();
    let mut held = pool.take(1 << 20);
    assert!(held.is_pinned());
    pool.shutdown();
    assert_eq!(
        faults.unregistered(),
        faults.registered() - 1,
        "a region with a buffer out was unregistered"
    );
    held.fill(1);
    drop(held);
    pool.flush();
    assert_eq!(faults.registered(), faults.unregistered());
    pool.shutdown();
}

#[test]
#[ignore = "FAILS now and then under AddressSanitizer: after a restart, the second \
            shutdown left one region registered (2 registered, 1 unregistered)"]
fn a_pool_restarted_after_shutdown_unregisters_its_fresh_region() {
    let (pool, faults) = carving();
    drop(pool.take(1 << 20));
    pool.flush();
    let held = pool.take(1 << 20);
    pool.shutdown();
    drop(held);
    pool.flush();
    assert_eq!(faults.registered(), faults.unregistered());
    // The pool works again, with a fresh region.
    drop(pool.take(1 << 20));
    pool.flush();
    assert!(pool.take(1 << 20).is_pinned());
    pool.shutdown();
    assert_eq!(faults.registered(), faults.unregistered());
}
