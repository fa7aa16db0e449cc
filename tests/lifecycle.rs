//! shutdown, clear, and working again afterwards.

mod common;
use common::host_pool;

#[test]
fn shutdown_drains_everything_and_pool_works_after() {
    let pool = host_pool(1);
    let mut buf = pool.take(1 << 15);
    buf.fill(0xEF);
    drop(buf);
    pool.shutdown();
    let stats = pool.stats();
    assert_eq!(
        stats.pooled_buffers, 0,
        "shutdown left buffers pooled (thread caches included)"
    );
    assert_eq!(stats.in_cleaner, 0);
    let buf = pool.take(1 << 15);
    assert_eq!(pool.stats().misses, 2, "the take after shutdown misses");
    drop(buf);
    pool.flush();
    assert_eq!(pool.stats().pooled_buffers, 1, "the cleaner came back");
    assert!(common::all_zero(&pool.take(1 << 15)));
    assert_eq!(pool.stats().hits, 1);
}

#[test]
fn clear_empties_shards_and_caches() {
    let pool = host_pool(2);
    let bufs: Vec<_> = (0..4)
        .map(|i| pool.take_on(i % 2, 1 << 14).unwrap())
        .collect();
    drop(bufs);
    pool.flush();
    assert_eq!(pool.stats().pooled_buffers, 4);
    pool.clear();
    let stats = pool.stats();
    assert_eq!((stats.pooled_buffers, stats.pooled_bytes), (0, 0));
    assert_eq!(stats.released, 4);
}

#[test]
fn flush_on_an_idle_pool_returns() {
    let pool = host_pool(1);
    pool.flush();
    pool.shutdown();
    pool.flush();
}

#[test]
fn clones_share_one_pool() {
    let pool = host_pool(1);
    let other = pool.clone();
    drop(pool.take(4096));
    other.flush();
    assert_eq!(other.stats().pooled_buffers, 1);
    drop(pool);
    assert!(!other.take(4096).is_pinned());
    assert_eq!(other.stats().hits, 1);
}
