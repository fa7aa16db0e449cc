//! Loom models of the cap: admission racing a lower cap. Each runs at two
//! preemptions whatever the bound: the two that lower the cap below one
//! buffer fail their mutations there (see `loom-tests/src/lib.rs`), and
//! `cap_change_races_return` failed none known at three either.
#![cfg(loom)]

mod common;

use common::{model_bounded, pool};
use loom::thread;

/// Lowering the cap to 0 races a drop and a flush; once everything has
/// settled nothing may stay pooled.
///
/// Catches: an admission that read the old cap and places its buffer after
/// the lowering thread's eviction, with nobody enforcing the new cap (the
/// fast path not re-reading the cap after a SeqCst fence, or the setter not
/// fencing before it evicts). Two preemptions suffice: both mutations fail
/// at one.
#[test]
fn cap_lowered_to_zero_racing_a_return_pools_nothing() {
    model_bounded(Some(2), || {
        let pool = pool(1);
        let buf = pool.take(8);
        let lowerer = {
            let pool = pool.clone();
            thread::spawn(move || pool.set_max_pooled_bytes(0))
        };
        drop(buf);
        pool.flush();
        lowerer.join().unwrap();
        pool.flush();
        let stats = pool.stats();
        assert_eq!(
            (stats.pooled_bytes, stats.pooled_buffers),
            (0, 0),
            "pooled above a cap of 0"
        );
        pool.shutdown();
    });
}

/// Two buffers taken; the cap is lowered to `cap` on another thread while
/// the first comes back, then the second comes back. The statistics once
/// everything has settled.
fn lower_cap_racing_two_returns(cap: usize) -> pinpool::Stats {
    let pool = pool(1);
    let (a, b) = (pool.take(8), pool.take(8));
    let lowerer = {
        let pool = pool.clone();
        thread::spawn(move || pool.set_max_pooled_bytes(cap))
    };
    drop(a);
    pool.flush();
    lowerer.join().unwrap();
    drop(b);
    pool.flush();
    let stats = pool.stats();
    pool.shutdown();
    stats
}

/// A cap below one buffer's footprint (4 KiB) racing two returns.
///
/// Catches: a buffer larger than the cap admitted on the fast path, or the
/// estimate drifting from the buffers pooled. Two preemptions suffice: the
/// fast path's mutations (no re-read of the cap after the fence, no fence
/// in the setter) and an eviction that leaves the estimate alone fail
/// there.
#[test]
fn cap_below_one_buffer_racing_returns_pools_nothing() {
    model_bounded(Some(2), || {
        let stats = lower_cap_racing_two_returns(2048);
        assert_eq!(
            stats.pooled_buffers, 0,
            "a buffer larger than the cap was pooled: {stats:#?}"
        );
        assert_eq!(stats.pooled_bytes, 0, "accounting drifted");
    });
}

/// Lowering the cap to one buffer races a return.
///
/// Would catch: pooled bytes above the cap after quiescence, or accounting
/// that drifts from the buffers actually pooled. Runs at two preemptions
/// whatever the bound (3 s; 208 s at three): re-applied on 2026-12-06, the
/// mutation recorded for it (an admission fast path that checks the cap
/// with a load before adding its buffer to the estimate) passed at both
/// bounds, as did a fast path that does not re-read the cap after its
/// fence (which `cap_lowered_to_zero_racing_a_return_pools_nothing` fails),
/// so the third preemption bought no failure known.
#[test]
fn cap_change_races_return() {
    model_bounded(Some(2), || {
        let stats = lower_cap_racing_two_returns(4096);
        assert!(
            stats.pooled_bytes <= 4096,
            "{} bytes pooled over a 4096-byte cap",
            stats.pooled_bytes
        );
        assert_eq!(
            stats.pooled_bytes,
            stats.pooled_buffers * 4096,
            "accounting drifted"
        );
    });
}
