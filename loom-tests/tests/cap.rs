//! Loom models of the cap: admission racing a lower cap. The CI runs these
//! at `LOOM_MAX_PREEMPTIONS=3`; the two that lower the cap below one buffer
//! run at two whatever the bound (each fails its mutation there: see
//! `loom-tests/src/lib.rs`).
#![cfg(loom)]

mod common;

use common::{model, model_bounded, pool};
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
/// Catches: an admission that checks the cap before adding its buffer to the
/// estimate (pooled bytes above the cap after quiescence), or accounting
/// that drifts from the buffers actually pooled.
#[test]
fn cap_change_races_return() {
    model(|| {
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
