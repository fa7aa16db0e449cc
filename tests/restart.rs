//! After `shutdown`, drops start no thread; the pool still works. Its own
//! test binary: it counts the process's threads, which other tests running
//! beside it would change.

mod common;

/// Threads of this process (Linux: entries of `/proc/self/task`).
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// After `shutdown`, dropping buffers must not start cleaner workers on the
/// dropping thread (spawning is neither cheap nor non-blocking); the pool
/// still works: a later take or flush brings the cleaner back.
#[test]
fn drop_after_shutdown_spawns_nothing_and_the_pool_works_again() {
    let pool = common::host_pool_with(1, 2);
    let bufs: Vec<_> = (0..4).map(|_| pool.take(1 << 20)).collect();
    pool.shutdown();
    let before = threads();
    drop(bufs);
    let after = threads();
    assert!(
        after <= before,
        "dropping buffers started {} threads",
        after - before
    );
    pool.flush();
    assert_eq!(pool.stats().in_cleaner, 0);
    assert!(pool.take(1 << 20).was_pooled(), "the pool works again");
}
