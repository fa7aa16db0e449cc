//! Buffers shorter than a page, carved from one-page slabs registered once,
//! on the fault-injecting backend (which "pins" every buffer and counts the
//! calls).
#![cfg(feature = "testing")]

use std::collections::BTreeSet;
use std::sync::Arc;

use pinpool::testing::Faults;
use pinpool::{BackendKind, Pool};

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

fn faulty() -> (Pool, Arc<Faults>) {
    let faults = Arc::new(Faults::default());
    // Provisioning off: the tests count buffers and registrations exactly,
    // and a slow run lets a tick see demand and pin more.
    let pool = Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(2)
        .provision(false)
        .build()
        .unwrap();
    (pool, faults)
}

/// A 1 KiB miss, dropped and flushed: its slab is registered, and carved.
fn one_slab(pool: &Pool, size: usize) {
    let mut head = pool.take(size);
    assert!(!head.was_pooled() && !head.is_pinned());
    head.fill(7);
    drop(head);
    pool.flush();
}

#[test]
fn sub_page_buffers_share_one_registration_of_one_page() {
    let (pool, faults) = faulty();
    one_slab(&pool, 1024);
    assert_eq!(faults.registered(), 1);
    let stats = pool.stats();
    assert_eq!(stats.pinned_bytes, page() as u64, "one page pinned");
    let per_slab = page() / 1024;
    assert_eq!(stats.pooled_buffers, per_slab, "the slab was carved whole");
    assert_eq!(stats.pooled_bytes, page(), "each buffer occupies 1 KiB");

    let mut bufs: Vec<_> = (0..per_slab).map(|_| pool.take(1024)).collect();
    let mut starts = BTreeSet::new();
    for (i, buf) in bufs.iter_mut().enumerate() {
        assert!(buf.was_pooled() && buf.is_pinned(), "buffer {i}");
        assert_eq!((buf.len(), buf.capacity()), (1024, 1024));
        assert!(buf.iter().all(|&b| b == 0), "buffer {i} is not zeroed");
        starts.insert(buf.as_ptr() as usize);
        buf.fill(i as u8 + 1);
    }
    let (first, last) = (*starts.first().unwrap(), *starts.last().unwrap());
    assert_eq!(starts.len(), per_slab, "two buffers share an address");
    assert_eq!(first % page(), 0, "the slab is page-aligned");
    assert_eq!(last + 1024 - first, page(), "the buffers tile one page");
    for (i, buf) in bufs.iter().enumerate() {
        assert!(buf.iter().all(|&b| b == i as u8 + 1), "buffers overlap");
    }
    assert_eq!(faults.registered(), 1, "a sibling was registered again");
    assert_eq!(pool.stats().misses, 1);
    drop(bufs);
    pool.shutdown();
    assert_eq!(faults.unregistered(), 1, "the slab is unregistered once");
    assert_eq!(pool.stats().pinned_bytes, 0);
}

#[test]
fn a_slab_goes_back_only_when_all_of_its_buffers_are_freed() {
    let (pool, faults) = faulty();
    one_slab(&pool, 2048);
    let held = pool.take(2048);
    assert!(held.was_pooled());
    pool.clear();
    assert_eq!(pool.stats().pooled_buffers, 0);
    assert_eq!(
        faults.unregistered(),
        0,
        "unregistered while a buffer of it was in use"
    );
    assert_eq!(pool.stats().pinned_bytes, page() as u64);
    drop(held);
    pool.flush();
    pool.clear();
    assert_eq!(faults.unregistered(), 1, "the slab stayed registered");
    assert_eq!(pool.stats().pinned_bytes, 0);
    assert_eq!(pool.stats().leaked_bytes, 0);
}

#[test]
fn lowering_the_cap_frees_a_slabs_buffers_one_by_one() {
    let (pool, faults) = faulty();
    one_slab(&pool, 1024);
    pool.set_max_pooled_bytes(2048);
    let stats = pool.stats();
    assert!(stats.pooled_bytes <= 2048, "{} pooled", stats.pooled_bytes);
    assert_eq!(faults.unregistered(), 0, "the rest of the slab is pooled");
    pool.set_max_pooled_bytes(0);
    assert_eq!(faults.unregistered(), 1);
    assert_eq!(pool.stats().pinned_bytes, 0);
}

#[test]
fn a_failed_slab_registration_frees_the_slab() {
    let (pool, faults) = faulty();
    faults.fail_register(&[1]);
    one_slab(&pool, 1024);
    let stats = pool.stats();
    assert_eq!(stats.registration_failures, 1);
    assert_eq!((stats.pooled_buffers, stats.pinned_bytes), (0, 0));
    one_slab(&pool, 1024); // a miss again: nothing of the first slab is pooled
    assert_eq!(faults.registered(), 1, "the next slab registers");
    assert_eq!(pool.stats().pooled_buffers, page() / 1024);
    pool.shutdown();
    assert_eq!(faults.unregistered(), 1);
    assert_eq!(pool.stats().leaked_bytes, 0);
}

#[test]
fn a_failed_slab_unregistration_leaks_the_slab_once() {
    let (pool, faults) = faulty();
    faults.fail_unregister(&[1]);
    one_slab(&pool, 1024);
    pool.clear();
    let stats = pool.stats();
    assert_eq!(stats.unregister_failures, 1);
    assert_eq!(stats.leaked_bytes, page() as u64);
}

#[test]
fn reserving_sub_page_buffers_pins_whole_slabs_and_pools_the_count() {
    let (pool, faults) = faulty();
    let per_slab = page() / 1024;
    pool.reserve(0, &[(1000, per_slab + 2)]).unwrap();
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.pooled_buffers, per_slab + 2, "the count asked for");
    assert_eq!(stats.pooled_bytes, (per_slab + 2) * 1024);
    assert_eq!(faults.registered(), 2, "two slabs");
    assert_eq!(stats.pinned_bytes, 2 * page() as u64);
    let bufs: Vec<_> = (0..per_slab + 2).map(|_| pool.take(1000)).collect();
    assert!(bufs.iter().all(|b| b.was_pooled() && b.len() == 1024));
    assert!(!pool.take(1000).was_pooled());
}

#[test]
fn the_host_backend_hands_out_exact_sub_page_lengths() {
    let pool = Pool::builder().backend(BackendKind::Host).build().unwrap();
    for (asked, len) in [(1, 1), (3, 4), (300, 512), (1024, 1024), (2049, 4096)] {
        let buf = pool.take(asked);
        assert_eq!((buf.len(), buf.capacity()), (len, len), "take({asked})");
        assert!(buf.iter().all(|&b| b == 0));
    }
}
