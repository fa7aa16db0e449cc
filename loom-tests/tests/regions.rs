//! Loom models of regions (`PoolBuilder::regions`): a buffer given back to
//! its region racing a carve from it, a trim releasing a region racing a
//! take that would carve from it, and a trim racing the give-back of a
//! region's last buffer. Workerless pools: the flushes and the trim clean
//! and release on their callers' threads, so each model races only its own
//! two threads. The CI runs these at `LOOM_MAX_PREEMPTIONS=2`.
#![cfg(loom)]

mod common;

use common::{carving_pool, model};
use loom::thread;

/// One thread drops a carved buffer and flushes (giving it back to its
/// region, where it coalesces with the free rest) while another takes a
/// buffer of the same size, which carves from the same free extents.
///
/// Catches: a carve that leaves its bytes among the free extents, or a
/// give-back and a carve that lose or double an extent between them (two
/// live buffers at one address, a carved buffer over written bytes, or a
/// region never wholly free again, left registered at shutdown).
#[test]
fn a_give_back_races_a_carve_from_the_same_region() {
    model(|| {
        let (pool, faults) = carving_pool();
        drop(pool.take(8));
        pool.flush();
        let mut a = pool.take(8);
        assert!(a.is_pinned(), "not carved from a region");
        a.fill(0xFF);
        let dropper = {
            let pool = pool.clone();
            thread::spawn(move || {
                drop(a);
                pool.flush();
            })
        };
        let b = pool.take(8);
        let b_ptr = b.as_ptr() as usize;
        assert!(b.iter().all(|&x| x == 0), "carved over written bytes");
        dropper.join().unwrap();
        let c = pool.take(8);
        assert_ne!(
            c.as_ptr() as usize,
            b_ptr,
            "two live buffers at one address"
        );
        assert!(c.iter().all(|&x| x == 0));
        drop((b, c));
        pool.shutdown();
        assert_eq!(
            faults.registered(),
            faults.unregistered(),
            "a region stayed registered"
        );
    });
}

/// A trim (which releases regions that are wholly free) races a take that
/// carves from the one region there is.
///
/// Catches: a region unlisted, unregistered and freed while a buffer is
/// still carved from it, or while a take is carving from it (the buffer
/// then lies in unregistered or freed memory), or a region left registered
/// after the shutdown.
#[test]
fn a_trim_races_a_carve_from_the_region_it_releases() {
    model(|| {
        let (pool, faults) = carving_pool();
        drop(pool.take(8));
        pool.flush();
        let trimmer = {
            let pool = pool.clone();
            thread::spawn(move || pool.trim())
        };
        let b = pool.take(8);
        trimmer.join().unwrap();
        if b.was_pooled() {
            assert!(b.is_pinned(), "carved from a released region");
            assert!(
                faults.registered() > faults.unregistered(),
                "carved from an unregistered region"
            );
        }
        drop(b);
        pool.flush();
        pool.shutdown();
        assert_eq!(faults.registered(), faults.unregistered());
    });
}

/// A region's one carved buffer is dropped and flushed on one thread (the
/// give-back of its last block) while a trim on another releases what is
/// wholly free, in whichever order the two threads reach the region.
///
/// Catches: a region released while its last block is still carved or
/// being given back (the give-back then writes into a freed region), or a
/// region the give-back leaves never wholly free again (left registered at
/// shutdown).
#[test]
fn a_trim_races_the_last_give_back_of_a_region() {
    model(|| {
        let (pool, faults) = carving_pool();
        drop(pool.take(4));
        pool.flush();
        let a = pool.take(4);
        assert!(a.is_pinned(), "not carved from a region");
        let dropper = {
            let pool = pool.clone();
            thread::spawn(move || {
                drop(a);
                pool.flush();
            })
        };
        pool.trim();
        dropper.join().unwrap();
        pool.trim();
        pool.shutdown();
        assert_eq!(
            faults.registered(),
            faults.unregistered(),
            "a region stayed registered"
        );
    });
}
