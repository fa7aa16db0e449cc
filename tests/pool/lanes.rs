//! The cleaner's two lanes, recycle and register. `Lanes::pop` serves the
//! recycle lane first, so while other threads keep it non-empty a first
//! registration (a pool-miss buffer) could wait for ever: the buffer never
//! pinned, and a `flush()` issued after its drop never returning. Worker 0
//! reads the register lane only when it is alone, and the registering
//! workers take the register lane first every 8th pop: first registrations
//! (and their chunk jobs, which travel on the register lane) still finish,
//! and a flush returns, while a busy client keeps the recycle lane full.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pinpool::testing::Faults;
use pinpool::Pool;

use crate::common::{faulty, within};

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
    // Starved, it would never return; under AddressSanitizer on two
    // cores a slow moment took it past 3 s once.
    let bound = Duration::from_secs(if cfg!(pinpool_asan) { 10 } else { 3 });
    let flushed = rx.recv_timeout(bound);
    let stats = pool.stats();
    let registrations = faults.registered() - registered;
    stop.store(true, Ordering::Relaxed);
    for c in churn {
        c.join().unwrap();
    }
    assert!(
        flushed.is_ok(),
        "flush() did not return within {bound:?} while other threads kept recycling \
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

#[test]
fn registrations_progress_under_recycle_load() {
    let faults = Arc::new(Faults::default());
    let pool = Pool::builder()
        .regions(false)
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
