//! Failed and panicking backend calls: a failed registration frees its
//! buffer, a panicking worker loses nothing, a failed unregistration is
//! counted; the pool serves on.

use std::time::{Duration, Instant};

use crate::common::{faulty_on, pinned};

#[test]
fn failed_registration_frees_the_buffer_and_is_counted() {
    let (pool, faults) = faulty_on(1);
    faults.fail_register(&[1]);
    let mut buf = pool.take(1 << 16);
    buf.fill(3); // usable by its owner as long as it is held
    drop(buf);
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.registration_failures, 1);
    assert_eq!(
        stats.pooled_buffers, 0,
        "an unpinned buffer must not be pooled as pinned"
    );
    assert_eq!(stats.released, 1);
    let again = pinned(&pool, 1 << 16); // the next one registers fine
    assert!(again.iter().all(|&b| b == 0));
}

#[test]
fn panicking_worker_releases_its_buffer_and_the_pool_serves_on() {
    let (pool, faults) = faulty_on(1);
    faults.panic_register(&[1]);
    drop(pool.take(1 << 16));
    pool.flush(); // returns: the buffer was released, not lost
                  // The panic is counted once the worker has caught it, which may be just
                  // after the unwinding released the buffer and let `flush` return.
    let deadline = Instant::now() + Duration::from_secs(5);
    while pool.stats().worker_panics == 0 {
        assert!(Instant::now() < deadline, "the panic was never counted");
        std::thread::sleep(Duration::from_millis(1));
    }
    let stats = pool.stats();
    assert_eq!(stats.worker_panics, 1);
    assert_eq!(stats.in_cleaner, 0);
    assert_eq!(stats.released, 1);
    let again = pinned(&pool, 1 << 16);
    drop(again);
    pool.flush();
    assert_eq!(pool.stats().pooled_buffers, 1, "the pool kept serving");
}

#[test]
fn failed_unregistration_is_counted() {
    let (pool, faults) = faulty_on(1);
    drop(pinned(&pool, 1 << 16));
    pool.flush();
    faults.fail_unregister(&[1]);
    pool.clear();
    let stats = pool.stats();
    assert_eq!(stats.unregister_failures, 1);
    assert_eq!(stats.pooled_buffers, 0);
}
