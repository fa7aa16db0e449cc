//! Loom models of shutdown and close racing drops and flushes. The CI runs
//! these at `LOOM_MAX_PREEMPTIONS=3`.
#![cfg(loom)]

mod common;

use common::{model, model_bounded, pool, workerless_pool};
use loom::thread;
use pinpool::testing::TestFence;

/// A drop (then a flush) on one thread races `shutdown` on another.
///
/// Catches: a flush that, finding the cleaner stopping, discards the
/// shutdown's stop signals (the shutdown then waits forever in `join`: loom
/// reports the deadlock); a buffer stranded in the queue with no worker to
/// take it; or one still pooled after a shutdown that followed it.
///
/// Runs at two preemptions whatever the environment's bound: at three it
/// took 280 s, most of the CI's loom time. At two it fails on a shutdown
/// without its final clear ("shutdown left a buffer pooled") and on a
/// flush that neither restarts the cleaner nor drains inline (loom's own
/// assertion); the discarded stop signals are sent and consumed under the
/// workers' lock, and no small mutation recreates them at either bound.
#[test]
fn shutdown_races_drop_and_flush() {
    model_bounded(Some(2), || {
        let pool = pool(1);
        let buf = pool.take(8);
        let dropper = {
            let pool = pool.clone();
            thread::spawn(move || {
                drop(buf);
                pool.flush();
            })
        };
        pool.shutdown();
        dropper.join().unwrap();
        pool.flush();
        let stats = pool.stats();
        assert_eq!(stats.in_cleaner, 0, "a buffer is stuck in the cleaner");
        assert!(stats.pooled_buffers <= 1);
        pool.shutdown();
        assert_eq!(
            pool.stats().pooled_buffers,
            0,
            "shutdown left a buffer pooled"
        );
    });
}

/// A buffer dropped after `shutdown` (no worker runs) comes back on the
/// next flush, and the pool serves it again.
///
/// Catches: a drop that queues its buffer with no worker running and a
/// flush that neither restarts the cleaner nor does the work itself.
#[test]
fn drop_after_shutdown_comes_back_on_flush() {
    model(|| {
        let pool = pool(1);
        let buf = pool.take(8);
        pool.shutdown();
        drop(buf);
        pool.flush();
        assert_eq!(pool.stats().in_cleaner, 0);
        assert!(pool.take(8).was_pooled(), "the buffer did not come back");
        pool.shutdown();
    });
}

/// The last pool handle drops on one thread while a buffer is dropped on
/// another: the buffer must end up freed (loom's leak check on each
/// buffer's tracked metadata), and nothing may hang.
///
/// Catches: a drop that passed its check of the closed flag before the
/// close and pushes its buffer where the closed pool no longer looks (the
/// close's grace period not waiting for drops under way).
#[test]
fn close_races_a_drop() {
    model(|| {
        let pool = pool(1);
        let buf = pool.take(8);
        let dropper = thread::spawn(move || drop(buf));
        drop(pool);
        dropper.join().unwrap();
    });
}

/// A buffer pinned ahead of demand by `reserve`, taken and dropped on
/// another thread while the last handle drops: the drop may come before
/// the close or after it (late, to the reaper). No cleaner worker runs
/// (the flush and the close clean), and the buffer's copy is done (a
/// completed fence), so the model races only the drop and the close.
///
/// Catches: a close that counts the buffers still out as takes minus
/// drops without the reserved ones (counted as drops with no take): a
/// reserved buffer dropped after the close would find the pool's state
/// freed, or the reaper waiting for a pool that never comes.
#[test]
fn a_reserved_buffer_dropped_racing_the_close() {
    model(|| {
        let (pool, faults) = workerless_pool(&[]);
        pool.reserve(0, &[(8, 1)]).unwrap();
        pool.flush();
        let mut buf = pool.take(8);
        assert!(buf.was_pooled() && buf.is_pinned());
        let fence = TestFence::default();
        fence.record(&mut buf);
        fence.complete();
        let dropper = thread::spawn(move || drop(buf));
        drop(pool);
        dropper.join().unwrap();
        // The reaper runs inline under loom: all is freed by now.
        assert_eq!(faults.unregistered(), faults.registered());
        assert_eq!(
            std::sync::Arc::strong_count(&faults),
            1,
            "the closed pool's state was kept"
        );
    });
}

/// A pool closes while its reaper cannot start (its thread refused), with
/// a buffer out; the late drop of that buffer races a later pool's close,
/// which starts the reaper. No cleaner worker runs in either pool.
///
/// Catches: a close that drops its message when no reaper runs (the
/// pool's state freed under the buffer still out); or a reaper that,
/// once started, does not take over the messages sent before it (the
/// first pool's state never freed).
#[test]
fn a_late_drop_waits_for_a_reaper_that_a_later_close_starts() {
    model(|| {
        let (refused, faults) = workerless_pool(&["pinpool-reaper"]);
        let mut buf = refused.take(8);
        let fence = TestFence::default();
        fence.record(&mut buf);
        fence.complete();
        drop(refused);
        assert!(
            std::sync::Arc::strong_count(&faults) > 1,
            "the closed pool's state was freed with a buffer out"
        );
        let dropper = thread::spawn(move || drop(buf));
        drop(workerless_pool(&[]).0);
        dropper.join().unwrap();
        assert_eq!(
            std::sync::Arc::strong_count(&faults),
            1,
            "the reaper never took over the closed pool"
        );
    });
}
