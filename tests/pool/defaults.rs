//! The defaults that follow the working set: with no cap given, the cap on
//! pooled bytes follows the bytes in use; with no budget given, the pinned
//! budget is a share of the memory the process may use.

use std::time::{Duration, Instant};

use pinpool::{BackendKind, LimitSource, Pool};

const MIB: usize = 1 << 20;

/// Waits up to `limit` for `done`.
fn eventually(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn following(floor: usize, window: Duration) -> Pool {
    Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(2)
        .provision(false)
        .min_pooled_bytes(floor)
        .idle_trim(window)
        .build()
        .unwrap()
}

#[test]
fn the_cap_rises_with_the_bytes_in_use_and_keeps_what_they_drop() {
    let pool = following(MIB, Duration::from_secs(60));
    let stats = pool.stats();
    assert_eq!(stats.max_pooled_bytes, MIB, "a pool starts at the floor");
    assert_eq!(stats.max_pooled_bytes_from, LimitSource::Default);
    assert_eq!(pool.config().max_pooled_bytes, None);
    let held: Vec<_> = (0..16).map(|_| pool.take(MIB)).collect();
    // The cleaner samples the bytes in use every 10 ms.
    eventually(Duration::from_secs(10), "the cap rising", || {
        pool.stats().max_pooled_bytes >= 16 * MIB
    });
    assert_eq!(pool.stats().max_pooled_bytes, 20 * MIB, "a quarter more");
    drop(held);
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.pooled_bytes, 16 * MIB, "{stats:#?}");
    assert_eq!(stats.evictions, 0, "{stats:#?}");
    let again: Vec<_> = (0..16).map(|_| pool.take(MIB)).collect();
    assert!(again.iter().all(|b| b.was_pooled()));
    // A given cap does not move.
    pool.set_max_pooled_bytes(2 * MIB);
    std::thread::sleep(Duration::from_millis(100));
    let stats = pool.stats();
    assert_eq!(stats.max_pooled_bytes, 2 * MIB);
    assert_eq!(stats.max_pooled_bytes_from, LimitSource::Given);
    assert_eq!(pool.config().max_pooled_bytes, Some(2 * MIB));
}

#[test]
fn the_cap_falls_a_window_after_the_bytes_in_use_do() {
    let window = Duration::from_millis(400);
    let pool = following(MIB, window);
    let held: Vec<_> = (0..16).map(|_| pool.take(MIB)).collect();
    eventually(Duration::from_secs(10), "the cap rising", || {
        pool.stats().max_pooled_bytes == 20 * MIB
    });
    let dropped = Instant::now();
    drop(held);
    pool.flush();
    assert_eq!(pool.stats().pooled_bytes, 16 * MIB);
    // Two buffers in use from now on: once the larger use is a window
    // past, the cap falls to a quarter more than their 2 MiB, evicting
    // down to it.
    let small: Vec<_> = (0..2).map(|_| pool.take(MIB)).collect();
    eventually(Duration::from_secs(10), "the cap falling", || {
        pool.stats().max_pooled_bytes < 16 * MIB
    });
    assert!(
        dropped.elapsed() >= window * 7 / 8,
        "the cap fell {:?} after the bytes in use did, within its window",
        dropped.elapsed()
    );
    let stats = pool.stats();
    assert_eq!(stats.max_pooled_bytes, 2 * MIB + MIB / 2, "{stats:#?}");
    assert!(stats.pooled_bytes <= stats.max_pooled_bytes, "{stats:#?}");
    drop(small);
}

#[test]
fn the_budget_bounds_the_following_cap_and_defaults_to_a_share_of_memory() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .min_pooled_bytes(64 * MIB)
        .max_pinned_bytes(8 * MIB)
        .build()
        .unwrap();
    let stats = pool.stats();
    assert_eq!(stats.max_pooled_bytes, 8 * MIB, "{stats:#?}");
    assert_eq!(stats.max_pinned_bytes_from, LimitSource::Given);
    let pool = Pool::builder().backend(BackendKind::Host).build().unwrap();
    let stats = pool.stats();
    assert_eq!(stats.max_pinned_bytes_from, LimitSource::Default);
    assert_eq!(pool.config().max_pinned_bytes, None);
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map(|kib| kib * 1024);
    if let Some(total) = total {
        assert!(
            stats.max_pinned_bytes > 0 && stats.max_pinned_bytes <= total / 4,
            "{} of {total}",
            stats.max_pinned_bytes
        );
    }
    assert!(format!("{stats:#}").contains("by default"), "{stats:#}");
}
