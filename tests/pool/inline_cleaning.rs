//! Cleaning on the caller's thread (a flush, shutdown or the last handle's
//! close with no cleaner worker running) survives a panicking job as a
//! worker does: the job's buffer is counted, its flush ticket closed, and
//! the close still hands what is out to the reaper.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use pinpool::testing::Faults;
use pinpool::Pool;

fn faulty_without_workers() -> (Pool, Arc<Faults>) {
    let faults = Arc::new(Faults::default());
    faults.fail_spawn("pinpool-cleaner");
    let pool = Pool::builder()
        .regions(false)
        .faults(faults.clone())
        .cleaner_threads(2)
        .build()
        .unwrap();
    (pool, faults)
}

/// Runs `f` on a thread of its own and fails if it has not returned
/// within `limit` (a hang must fail the test, not stall the run).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(catch_unwind(AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(value)) => value,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("did not return within {limit:?}"),
    }
}

/// With no cleaner worker running, a flush cleans on the calling thread.
/// A job that panics there (a backend bug, as a registration that panics)
/// must be caught as a worker catches it: the flush returns, the panic is
/// counted, and the pool serves on.
#[test]
fn a_flush_cleaning_on_its_own_thread_survives_a_panicking_job() {
    let (pool, faults) = faulty_without_workers();
    faults.panic_register(&[1]);
    drop(pool.take(1 << 16));
    let flushed = catch_unwind(AssertUnwindSafe(|| pool.flush()));
    assert!(
        flushed.is_ok(),
        "flush panicked with a panicking job inline"
    );
    let stats = pool.stats();
    assert_eq!(stats.worker_panics, 1);
    assert_eq!(stats.in_cleaner, 0);
    // The pool serves on: the next miss registers.
    drop(pool.take(1 << 16));
    pool.flush();
    assert_eq!(pool.stats().pooled_buffers, 1);
}

/// The same job panicking inline in the close of the last handle: the
/// close must finish (the pool's state kept for the buffer still out), so
/// that the held buffer's later drop finds its cache alive.
#[test]
fn a_close_cleaning_on_its_own_thread_survives_a_panicking_job() {
    let (pool, faults) = faulty_without_workers();
    faults.panic_register(&[1]);
    let held = pool.take(1 << 16);
    drop(pool.take(1 << 16)); // queued for registration, no worker runs
    let closed = catch_unwind(AssertUnwindSafe(move || drop(pool)));
    assert!(closed.is_ok(), "the last handle's drop panicked");
    // The held buffer's drop goes to the reaper; nothing freed under it.
    within(Duration::from_secs(10), move || drop(held));
}
