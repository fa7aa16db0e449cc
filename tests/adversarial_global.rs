//! the seed-compatible free functions on the global pool,
//! configured through `PINPOOL_CONF`, raced against each other. One test:
//! the global pool is process-wide.

mod adversarial_util;

use std::time::{Duration, Instant};

use adversarial_util::{all_zero, within};
use pinpool::{BackendKind, Pool};

#[test]
fn global_free_functions() {
    // Set before the global pool is first built (nothing else in this
    // binary touches it). Unknown keys are ignored with a warning.
    std::env::set_var(
        "PINPOOL_CONF",
        "backend=host, cleaner_threads=2, max_pooled_bytes=64MiB, bogus=1, size_classes=pow2",
    );
    let pool = Pool::global();
    assert_eq!(pool.backend(), BackendKind::Host);
    let config = pool.config();
    assert_eq!(
        config.cleaner_threads, 2,
        "PINPOOL_CONF was not applied: {config:?}"
    );
    assert_eq!(config.max_pooled_bytes, 64 << 20);
    assert!(std::ptr::eq(pool, Pool::global()));

    let mut b = pinpool::take(3);
    assert_eq!(b.len(), 4);
    b.copy_from_slice(&[1, 2, 3, 4]);
    drop(b);
    assert_eq!(pinpool::take(5000).len(), 8192, "pow2 classes");
    pinpool::set_max_pooled_bytes(0);
    pool.flush();
    assert_eq!(pool.stats().pooled_bytes, 0);
    pinpool::set_max_pooled_bytes(64 << 20);
    pinpool::shutdown();
    let b = pinpool::take(1 << 20);
    assert!(all_zero(&b));
    drop(b);
    pinpool::clear();
    let mut region = vec![0u8; 8192];
    // SAFETY: `region` is live; the host backend registers nothing.
    unsafe {
        assert!(!pinpool::register_region(region.as_mut_ptr(), region.len()));
        pinpool::unregister_region(region.as_mut_ptr());
    }

    // Races: takes and drops against shutdown, clear and cap changes.
    within(Duration::from_secs(30), "global races", || {
        let deadline = Instant::now() + Duration::from_millis(1500);
        std::thread::scope(|s| {
            for t in 0..2usize {
                s.spawn(move || {
                    let mut i = t;
                    while Instant::now() < deadline {
                        let mut b = pinpool::take(1 + (i * 4099) % (3 << 20));
                        assert!(all_zero(&b[..b.len().min(8192)]));
                        let n = b.len().min(100);
                        b[..n].fill(7);
                        b.set_dirty_len(n);
                        i += 1;
                    }
                });
            }
            s.spawn(move || {
                let mut i = 0;
                while Instant::now() < deadline {
                    match i % 3 {
                        0 => pinpool::shutdown(),
                        1 => pinpool::clear(),
                        _ => pinpool::set_max_pooled_bytes([0, 1 << 20, 64 << 20][(i / 3) % 3]),
                    }
                    i += 1;
                    std::thread::sleep(Duration::from_micros(300));
                }
            });
        });
        pinpool::set_max_pooled_bytes(64 << 20);
        pinpool::shutdown();
    });
    let stats = pool.stats();
    assert_eq!(
        (stats.in_cleaner, stats.pooled_buffers),
        (0, 0),
        "{stats:#?}"
    );
}
