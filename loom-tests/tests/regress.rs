//! Loom models of protocol races found by review.
#![cfg(loom)]

use loom::thread;
use pinpool::{BackendKind, Pool};

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 100_000;
    builder.check(f);
}

fn pool() -> Pool {
    Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(1)
        .build()
        .unwrap()
}

/// A flush on another thread races a drop; the dropping thread's own flush
/// afterwards must still wait for its buffer.
#[test]
fn flush_waits_for_own_earlier_drop_despite_a_racing_flush() {
    model(|| {
        let pool = pool();
        let buf = pool.take(8);
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

/// Lowering the cap to 0 races a drop and a flush; once everything has
/// settled nothing may stay pooled.
#[test]
fn cap_lowered_to_zero_racing_a_return_pools_nothing() {
    model(|| {
        let pool = pool();
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
