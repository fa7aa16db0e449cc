//! Life-cycle calls racing while device synchronizes are held: everything
//! returns once they are released, and nothing registered stays registered.
#![cfg(feature = "testing")]

mod adversarial_util;

use std::time::Duration;

use adversarial_util::{eventually, faulty, within};

#[test]
fn shutdown_flush_clear_close_while_syncs_are_held() {
    for round in 0..5 {
        let (pool, faults) = faulty(if round % 2 == 0 { 1 } else { 2 });
        let bufs: Vec<_> = (0..16).map(|i| pool.take(4096 << (i % 6))).collect();
        drop(bufs);
        pool.flush();
        let bufs: Vec<_> = (0..16).map(|i| pool.take(4096 << (i % 6))).collect();
        faults.hold_synchronize();
        let mut threads = Vec::new();
        let (a, b, c) = (pool.clone(), pool.clone(), pool.clone());
        threads.push(std::thread::spawn(move || drop(bufs)));
        threads.push(std::thread::spawn(move || a.shutdown()));
        threads.push(std::thread::spawn(move || b.flush()));
        threads.push(std::thread::spawn(move || {
            c.clear();
            drop(c.take(1 << 20));
        }));
        let late = pool.take(1 << 16);
        let d = pool.clone();
        threads.push(std::thread::spawn(move || drop(d)));
        std::thread::sleep(Duration::from_millis(200));
        faults.release();
        within(Duration::from_secs(10), "life-cycle calls", move || {
            for t in threads {
                t.join().unwrap();
            }
        });
        within(Duration::from_secs(10), "close", move || drop(pool));
        drop(late);
        let ok = eventually(Duration::from_secs(5), || {
            faults.registered() == faults.unregistered()
        });
        assert!(
            ok,
            "round {round}: registered {} unregistered {}",
            faults.registered(),
            faults.unregistered()
        );
    }
}
