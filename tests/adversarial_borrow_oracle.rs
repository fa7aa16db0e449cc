//! Borrowing at the default 100% slack under churn: every hand-out is
//! all-zero, at least as long as asked, never handed to two holders at
//! once; after quiescence the pooled bytes fit the cap and agree with the
//! per-device sums, and registrations balance unregistrations once
//! everything is cleared.
#![cfg(feature = "testing")]

mod adversarial_util;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use adversarial_util::{all_zero, within};
use pinpool::testing::Faults;
use pinpool::Pool;

fn check_quiet(pool: &Pool, what: &str) {
    let p = pool.clone();
    within(Duration::from_secs(10), "flush", move || p.flush());
    let s = pool.stats();
    assert_eq!(s.in_cleaner, 0, "{what}");
    assert!(
        s.pooled_bytes <= s.max_pooled_bytes,
        "{what}: {} pooled over cap {}",
        s.pooled_bytes,
        s.max_pooled_bytes
    );
    let by_device: usize = s.per_device.iter().map(|d| d.pooled_bytes).sum();
    assert_eq!(
        by_device, s.pooled_bytes,
        "{what}: estimate vs per-device sums"
    );
    let bufs: usize = s.per_class.iter().map(|c| c.pooled_buffers).sum();
    assert_eq!(bufs, s.pooled_buffers, "{what}: per-class buffers");
}

#[test]
fn borrowing_oracle_under_churn() {
    let faults = Arc::new(Faults::default());
    let pool = Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(2)
        .devices(2)
        .max_pooled_bytes(6 << 20)
        .provision(false)
        .build()
        .unwrap();
    let live: Arc<Mutex<HashSet<usize>>> = Arc::default();
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut round = 0;
    while Instant::now() < deadline {
        std::thread::scope(|s| {
            for t in 0..3usize {
                let (pool, live) = (&pool, &live);
                s.spawn(move || {
                    let mut held = Vec::new();
                    for i in 0..300usize {
                        let k = (i * 7 + t * 13 + round) % 23;
                        let min = 1 + (k * 37_123) % (1 << 20) + if k % 3 == 0 { 3 } else { 0 };
                        let device = (i + t) % 2;
                        let mut b = pool.take_on(device, min).unwrap();
                        assert!(b.len() >= min, "len {} < {min}", b.len());
                        assert!(all_zero(&b), "take_on({device}, {min}): non-zero bytes in a {}-byte buffer (pooled {})", b.len(), b.was_pooled());
                        assert!(live.lock().unwrap().insert(b.as_ptr() as usize), "handed out twice");
                        // Write everywhere up to what dirty says: sometimes
                        // the whole (possibly borrowed) buffer, sometimes a
                        // prefix of the request.
                        let dirty = match i % 3 { 0 => b.len(), 1 => min, _ => min.min(100) };
                        b[..dirty].fill(0xA5);
                        b.set_dirty_len(dirty);
                        held.push(b);
                        if held.len() > 4 {
                            let b = held.swap_remove(i % 4);
                            live.lock().unwrap().remove(&(b.as_ptr() as usize));
                            drop(b);
                        }
                        if i % 97 == 0 {
                            pool.flush();
                        }
                    }
                    for b in held {
                        live.lock().unwrap().remove(&(b.as_ptr() as usize));
                        drop(b);
                    }
                });
            }
        });
        check_quiet(&pool, &format!("round {round}"));
        round += 1;
    }
    let s = pool.stats();
    assert!(s.borrowed > 0, "no borrowing happened");
    pool.clear();
    let p = pool.clone();
    within(Duration::from_secs(10), "flush", move || p.flush());
    let s = pool.stats();
    assert_eq!(s.pooled_bytes, 0);
    assert_eq!(s.leaked_bytes, 0);
    assert_eq!(
        faults.registered(),
        faults.unregistered(),
        "registrations vs unregistrations after clear"
    );
}
