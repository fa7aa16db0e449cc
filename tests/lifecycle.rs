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

#[test]
fn strict_conf_names_the_bad_pair_and_applies_nothing() {
    for bad in [
        "cleaner_threads=0,max_pooled_bytes=32GiB",
        "max_pooled_bytes=32GiB,nope=1",
        "backend=gpu",
        "idle_trim=0s",
        "borrow=101",
        "devices",
    ] {
        match pinpool::Pool::builder().try_conf(bad) {
            Err(pinpool::Error::Setting { pair, .. }) => {
                assert!(bad.contains(&pair), "{pair} not in {bad}")
            }
            Err(other) => panic!("{bad}: {other}"),
            Ok(_) => panic!("{bad}: accepted"),
        }
    }
}

#[test]
fn conf_text_sets_values_and_skips_bad_pairs() {
    let pool = pinpool::Pool::builder()
        .conf("backend=host,devices=2, thread_cache_bytes=1MiB, cleaner_threads=0, max_pooled_bytes=3GiB, nope=1")
        .build()
        .unwrap();
    let config = pool.config();
    assert_eq!(config.devices, Some(2));
    assert_eq!(config.thread_cache_bytes, 1 << 20);
    assert_eq!(config.max_pooled_bytes, 3 << 30);
    assert_eq!(
        config.cleaner_threads,
        pinpool::Config::default().cleaner_threads,
        "a bad value keeps the default"
    );
    assert_eq!(pool.stats().devices, 2);
}

#[test]
fn stats_display_is_a_readable_table() {
    let pool = host_pool(1);
    drop(pool.take(4096));
    pool.flush();
    let line = pool.stats().to_string();
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(line.contains("1 misses"), "{line}");
    let text = format!("{:#}", pool.stats());
    assert!(text.contains("host backend"), "{text}");
    assert!(text.contains("4.0 KiB"), "sizes in human units: {text}");
    assert!(text.lines().count() >= 8, "{text}");
}

#[test]
fn stats_break_down_by_device_and_class() {
    let pool = host_pool(2);
    let bufs = [
        pool.take_on(0, 4096).unwrap(),
        pool.take_on(1, 4096).unwrap(),
        pool.take_on(1, 1 << 20).unwrap(),
    ];
    drop(bufs);
    pool.flush();
    let stats = pool.stats();
    let devices: Vec<(usize, usize)> = stats
        .per_device
        .iter()
        .map(|d| (d.device, d.pooled_buffers))
        .collect();
    assert_eq!(devices, [(0, 1), (1, 2)]);
    assert_eq!(stats.per_device[1].pooled_bytes, 4096 + (1 << 20));
    let classes: Vec<(usize, usize, u64)> = stats
        .per_class
        .iter()
        .map(|c| (c.size, c.pooled_buffers, c.misses))
        .collect();
    assert_eq!(classes, [(4096, 2, 2), (1 << 20, 1, 1)]);
}
