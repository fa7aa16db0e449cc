//! Loom models of the flush barrier (SRCU's two-index counters). The CI
//! runs these at `LOOM_MAX_PREEMPTIONS=3`.
#![cfg(loom)]

mod common;

use common::{model, pool};
use loom::thread;

/// A flush on another thread races a drop; the dropping thread's own flush
/// afterwards must still wait for its buffer.
///
/// Catches: a flush that checks only the old active parity: the drop may
/// read the epoch, stall while the racing flush flips and checks, then
/// count itself in the parity that flush already saw balanced.
#[test]
fn flush_waits_for_an_earlier_drop_despite_a_racing_flush() {
    model(|| {
        let pool = pool(1);
        let mut buf = pool.take(8);
        buf.fill(1);
        let other = {
            let pool = pool.clone();
            thread::spawn(move || pool.flush())
        };
        drop(buf);
        pool.flush();
        assert_eq!(pool.stats().in_cleaner, 0, "flush returned early");
        other.join().unwrap();
        pool.shutdown();
    });
}

/// Two flushes race each other and a cross-thread drop.
///
/// Catches: flushes that interleave their epoch flips (one waiting on the
/// parity the other just flipped), or a completion's wake-up lost between a
/// flush's check and its wait (loom reports the deadlock).
#[test]
fn two_racing_flushes_both_return_and_see_earlier_drops() {
    model(|| {
        let pool = pool(1);
        let buf = pool.take(8);
        thread::spawn(move || drop(buf)).join().unwrap();
        let other = {
            let pool = pool.clone();
            thread::spawn(move || {
                pool.flush();
                assert_eq!(
                    pool.stats().in_cleaner,
                    0,
                    "the racing flush returned early"
                );
            })
        };
        pool.flush();
        assert_eq!(pool.stats().in_cleaner, 0, "flush returned early");
        other.join().unwrap();
        pool.shutdown();
    });
}
