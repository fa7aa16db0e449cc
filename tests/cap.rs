//! The byte cap: largest first, lowering evicts at once, thread caches count.

mod common;
use common::host_pool;

const SIZE: usize = 1 << 16;
const SMALL: usize = 1 << 12;

#[test]
fn cap_evicts_largest_first() {
    let pool = host_pool(1);
    pool.set_max_pooled_bytes(2 * SIZE + SMALL);
    let small = pool.take(SMALL);
    let bufs: Vec<_> = (0..3).map(|_| pool.take(SIZE)).collect();
    drop(small);
    pool.flush();
    drop(bufs);
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.pooled_bytes, 2 * SIZE + SMALL);
    assert_eq!(
        stats.evictions + stats.released,
        2,
        "one SIZE buffer evicted or refused, counted once each way"
    );
    // The small buffer survived: it is the one evicted last.
    assert!(stats.pooled_buffers == 3);
}

#[test]
fn lowering_the_cap_evicts_immediately_largest_first() {
    let pool = host_pool(1);
    let bufs: Vec<_> = [SIZE, SIZE, SMALL].iter().map(|&s| pool.take(s)).collect();
    drop(bufs);
    pool.flush();
    assert_eq!(pool.stats().pooled_bytes, 2 * SIZE + SMALL);
    pool.set_max_pooled_bytes(SIZE + SMALL);
    let stats = pool.stats();
    assert_eq!(stats.pooled_bytes, SIZE + SMALL);
    assert_eq!(stats.evictions, 1);
    pool.set_max_pooled_bytes(SMALL);
    assert_eq!(
        pool.stats().pooled_bytes,
        SMALL,
        "the small buffer goes last"
    );
}

#[test]
fn buffer_larger_than_the_cap_is_never_pooled() {
    let pool = host_pool(1);
    pool.set_max_pooled_bytes(SIZE);
    drop(pool.take(2 * SIZE));
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.pooled_bytes, 0);
    assert_eq!(stats.released, 1);
}

/// Setters racing each other leave one cap: the one the pool reports in
/// its settings, in its statistics, and the one its evictions keep to.
#[test]
fn racing_cap_setters_agree_on_one_cap() {
    let pool = host_pool(1);
    let bufs: Vec<_> = (0..8).map(|_| pool.take(SIZE)).collect();
    drop(bufs);
    pool.flush();
    for round in 0..3000usize {
        let barrier = std::sync::Barrier::new(8);
        std::thread::scope(|s| {
            for t in 0..8usize {
                let (pool, barrier) = (&pool, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    pool.set_max_pooled_bytes((round * 8 + t + 1) * SIZE);
                });
            }
        });
        let set = pool.config().max_pooled_bytes;
        let stats = pool.stats();
        assert_eq!(
            set, stats.max_pooled_bytes,
            "round {round}: the settings and the statistics disagree"
        );
        assert!(
            stats.pooled_bytes <= set,
            "round {round}: pooled above the cap"
        );
    }
}
