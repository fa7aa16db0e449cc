//! Registering workers take the register lane first every 8th pop: first
//! registrations (and their chunk jobs, which travel on the register lane)
//! still finish, and a flush returns, while a busy client keeps the recycle
//! lane full.
#![cfg(feature = "testing")]

mod adversarial_util;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use adversarial_util::within;
use pinpool::testing::Faults;
use pinpool::Pool;

#[test]
fn registrations_progress_under_recycle_load() {
    let faults = Arc::new(Faults::default());
    let pool = Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(2)
        .provision(false)
        .thread_cache_bytes(0)
        .max_pooled_bytes(1 << 30)
        .build()
        .unwrap();
    // Pin some small buffers for the churn.
    drop((0..8).map(|_| pool.take(1 << 16)).collect::<Vec<_>>());
    pool.flush();
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (pool, stop) = (pool.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let mut b = pool.take(1 << 16);
                b[0] = 1;
                b.set_dirty_len(1);
                drop(b);
            }
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let before = faults.registered();
    drop((0..24).map(|_| pool.take(8 << 20)).collect::<Vec<_>>());
    let p = pool.clone();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        within(
            Duration::from_secs(10),
            "flush under recycle load",
            move || p.flush(),
        )
    }));
    stop.store(true, Ordering::Relaxed);
    churn.join().unwrap();
    r.unwrap();
    let s = pool.stats();
    assert!(
        faults.registered() - before + s.registrations_skipped >= 24,
        "registered {} skipped {}",
        faults.registered() - before,
        s.registrations_skipped
    );
}
