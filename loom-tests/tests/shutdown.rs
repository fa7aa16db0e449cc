//! Loom models of shutdown and close racing drops and flushes. The CI runs
//! these at `LOOM_MAX_PREEMPTIONS=3`.
#![cfg(loom)]

mod common;

use common::{model, pool};
use loom::thread;

/// A drop (then a flush) on one thread races `shutdown` on another.
///
/// Catches: a flush that, finding the cleaner stopping, discards the
/// shutdown's stop signals (the shutdown then waits forever in `join`: loom
/// reports the deadlock); a buffer stranded in the queue with no worker to
/// take it; or one still pooled after a shutdown that followed it.
#[test]
fn shutdown_races_drop_and_flush() {
    model(|| {
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
