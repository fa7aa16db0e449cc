//! the cleaner's two lanes. `Lanes::pop` always serves the
//! recycle lane first (`try_recv` on it, then `select_biased!` with it
//! ahead of the register lane), so while other threads keep the recycle
//! lane non-empty, a first registration (a pool-miss buffer) never runs:
//! the buffer is never pinned, and a `flush()` issued after its drop never
//! returns. Worker 0 never reads the register lane at all when there are
//! several workers, and the others prefer recycling too.
#![cfg(feature = "testing")]

mod adversarial_util;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use adversarial_util::faulty;

fn starved(workers: usize) {
    let (pool, faults) = faulty(workers);
    let stop = Arc::new(AtomicBool::new(false));
    // Pinned buffers for the churn, so its drops are recycled (device
    // synchronize + zeroing), not registered.
    let warm: Vec<_> = (0..4).map(|_| pool.take(1 << 20)).collect();
    drop(warm);
    pool.flush();
    let churn: Vec<_> = (0..2)
        .map(|_| {
            let (pool, stop) = (pool.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let bufs: Vec<_> = (0..4).map(|_| pool.take(1 << 20)).collect();
                    drop(bufs);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    // A pool miss of another class: its drop needs a first registration.
    let registered = faults.registered();
    let miss = pool.take(3 << 20);
    assert!(!miss.is_pinned());
    drop(miss);
    let (tx, rx) = std::sync::mpsc::channel();
    let p = pool.clone();
    std::thread::spawn(move || {
        let t0 = Instant::now();
        p.flush();
        let _ = tx.send(t0.elapsed());
    });
    let flushed = rx.recv_timeout(Duration::from_secs(3));
    let stats = pool.stats();
    let registrations = faults.registered() - registered;
    stop.store(true, Ordering::Relaxed);
    for c in churn {
        c.join().unwrap();
    }
    assert!(
        flushed.is_ok(),
        "flush() did not return within 3 s while other threads kept recycling \
         ({registrations} registrations meanwhile, {} registrations skipped, \
         {} in the cleaner, {:.2}% hits)",
        stats.registrations_skipped,
        stats.in_cleaner,
        stats.hit_rate() * 100.0
    );
}

#[test]
fn recycling_traffic_starves_registrations_one_worker() {
    starved(1);
}

#[test]
fn recycling_traffic_starves_registrations_two_workers() {
    starved(2);
}

/// Two threads in a loop shaped like the real client's (take small buffers
/// of a few classes, write a little of each, a copy whose event has
/// completed, drop, keeping a few in hand), and a third thread that calls
/// `flush()` now and then (a segment boundary), from a cold pool on the
/// fault backend, which pins like CUDA. A flush moves the loop threads'
/// deferred buffers to the cleaner; their next takes miss; each miss's drop
/// needs a registration; with the register backlog full, further misses are
/// freed through `Job::Release` on the recycle lane, which is always served
/// first, so registrations stop, every take misses, and the pool never
/// recovers: the seed's "misses breed more misses".
#[test]
fn a_take_drop_loop_with_occasional_flushes_collapses_into_misses() {
    let (pool, faults) = faulty(1);
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads: Vec<_> = (0..2)
        .map(|t| {
            let (pool, stop) = (pool.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut held = Vec::new();
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let mut buf = pool.take(4096 << ((i + t) % 5));
                    buf[..64].fill(1);
                    buf.set_dirty_len(64);
                    let fence = pinpool::testing::TestFence::default();
                    fence.record(&mut buf);
                    fence.complete();
                    held.push(buf);
                    if held.len() > 3 {
                        held.remove(i % 3);
                    }
                    i += 1;
                }
            })
        })
        .collect();
    {
        let (pool, stop) = (pool.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
                // A flush that cannot finish would stall this thread; that
                // is fine here: the hit rate is what is measured.
                let p = pool.clone();
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    p.flush();
                    let _ = tx.send(());
                });
                while rx.recv_timeout(Duration::from_millis(50)).is_err() {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                }
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(1000));
    let early = pool.stats();
    std::thread::sleep(Duration::from_millis(500));
    let late = pool.stats();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let hits = late.hits - early.hits;
    let takes = hits + late.misses - early.misses;
    let rate = hits as f64 / takes.max(1) as f64;
    assert!(
        rate > 0.5,
        "after 1 s, {:.2}% of {takes} takes hit; {} registrations, {} skipped, \
         {} buffers in the cleaner",
        rate * 100.0,
        faults.registered(),
        late.registrations_skipped,
        late.in_cleaner
    );
}
