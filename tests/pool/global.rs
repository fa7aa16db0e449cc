//! The seed-compatible free functions on the global pool, which is
//! process-wide.

use std::time::{Duration, Instant};

use pinpool::{BackendKind, Pool};

use crate::common::{all_zero, in_child, within};

#[test]
fn global_free_functions_work() {
    let mut buf = pinpool::take(3);
    assert_eq!(buf.len(), 4);
    buf[0] = 1;
    drop(buf);
    pinpool::Pool::global().flush();
    assert!(all_zero(&pinpool::take(4)));
    pinpool::clear();
    pinpool::set_max_pooled_bytes(pinpool::DEFAULT_MIN_POOLED_BYTES);
    let mut region = vec![0u8; 4096];
    // SAFETY: `region` is live until after unregister_region.
    let pinned = unsafe { pinpool::register_region(region.as_mut_ptr(), region.len()) };
    if pinned {
        // SAFETY: registered just above; nothing is copying from it.
        unsafe { pinpool::unregister_region(region.as_mut_ptr()) };
    }
    assert_eq!(
        pinned,
        pinpool::Pool::global().backend() == pinpool::BackendKind::Cuda
    );
}

/// The free functions configured through `PINPOOL_CONF`, raced against
/// each other, alone in a child process whose global pool is built from the
/// variable.
#[test]
fn global_free_functions() {
    // Set for the child before its global pool is first built. Unknown keys
    // are ignored with a warning.
    const TEST: &str = "global_free_functions";
    const CONF: &str =
        "backend=host, cleaner_threads=2, max_pooled_bytes=64MiB, bogus=1, size_classes=pow2";
    if in_child(module_path!(), TEST, &[("PINPOOL_CONF", CONF)]).is_some() {
        return;
    }
    let pool = Pool::global();
    assert_eq!(pool.backend(), BackendKind::Host);
    let config = pool.config();
    assert_eq!(
        config.cleaner_threads, 2,
        "PINPOOL_CONF was not applied: {config:?}"
    );
    assert_eq!(config.max_pooled_bytes, Some(64 << 20));
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
