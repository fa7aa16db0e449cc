//! Everything at once. Takers on several threads (some short-lived, so
//! caches are inherited), cross-thread drops, and a control thread looping
//! flush / clear / shutdown / set_max_pooled_bytes / stats, on the host
//! backend and on the fault backend (which "pins"). Checks: no double
//! hand-out, all-zero takes, no hang (watchdog), and after quiescence the
//! stats balance, the cap holds, and every registration is undone by
//! shutdown. Also a soak over mixed sizes and devices.

#[cfg(feature = "testing")]
use std::collections::BTreeMap;
use std::collections::HashSet;
#[cfg(feature = "testing")]
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
#[cfg(feature = "testing")]
use std::time::{Duration, Instant};

#[cfg(feature = "testing")]
use pinpool::testing::{Faults, TestFence};
#[cfg(feature = "testing")]
use pinpool::{BackendKind, PinnedBuffer, Pool, SizeClasses};

use crate::common::all_zero;
#[cfg(feature = "testing")]
use crate::common::{faulty_on, within};

#[test]
fn stress_no_buffer_is_handed_out_twice_and_all_come_back_zeroed() {
    const THREADS: usize = 8;
    const ROUNDS: usize = 2000;
    // No provisioning: a buffer pinned ahead of demand is made ready (and
    // counted in `recycled`) without a take, which the balance below does
    // not count (seen about once in fifty runs on a loaded box).
    let pool = pinpool::Pool::builder()
        .backend(pinpool::BackendKind::Host)
        .devices(2)
        .cleaner_threads(2)
        .provision(false)
        .build()
        .unwrap();
    let live: Arc<Mutex<HashSet<usize>>> = Arc::default();
    let start = Arc::new(Barrier::new(THREADS));
    let (tx, rx) = std::sync::mpsc::channel::<pinpool::PinnedBuffer>();
    let rx = Arc::new(Mutex::new(rx));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (pool, live, start, tx, rx) = (
                pool.clone(),
                live.clone(),
                start.clone(),
                tx.clone(),
                rx.clone(),
            );
            std::thread::spawn(move || {
                start.wait();
                for i in 0..ROUNDS {
                    let size = 1 << (6 + (t + i) % 12);
                    let mut buf = pool.take_on((t + i) % 2, size).unwrap();
                    assert!(all_zero(&buf), "taken buffer not zeroed");
                    assert!(
                        live.lock().unwrap().insert(buf.as_ptr() as usize),
                        "buffer handed out twice"
                    );
                    let n = buf.len().min(64);
                    buf[..n].fill(0xFF);
                    buf.set_dirty_len(n);
                    live.lock().unwrap().remove(&(buf.as_ptr() as usize));
                    if i % 3 == 0 {
                        tx.send(buf).unwrap(); // dropped by another thread
                    } else {
                        drop(buf);
                    }
                    if let Ok(other) = rx.lock().unwrap().try_recv() {
                        drop(other);
                    }
                }
            })
        })
        .collect();
    drop(tx);
    for w in workers {
        w.join().unwrap();
    }
    for buf in rx.lock().unwrap().try_iter() {
        drop(buf);
    }
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.hits + stats.misses, (THREADS * ROUNDS) as u64);
    assert_eq!(stats.in_cleaner, 0);
    assert_eq!(
        stats.recycled,
        stats.misses + stats.hits - (stats.released - stats.evictions)
    );
    assert!(stats.hit_rate() > 0.5, "hit rate {}", stats.hit_rate());
}

#[cfg(feature = "testing")]
use crate::common::Rng;

#[cfg(feature = "testing")]
const SIZES: &[usize] = &[
    0,
    1,
    3,
    4096,
    5000,
    60 << 10,
    200 << 10,
    1 << 20,
    (5 << 20) + 7,
];

#[cfg(feature = "testing")]
#[derive(Default)]
struct Shared {
    live: Mutex<HashSet<usize>>,
    problems: Mutex<Vec<String>>,
    takes: AtomicU64,
    max_take_us: AtomicU64,
    total_take_us: AtomicU64,
    stop: AtomicBool,
}

#[cfg(feature = "testing")]
impl Shared {
    fn problem(&self, p: String) {
        let mut v = self.problems.lock().unwrap();
        if v.len() < 20 {
            v.push(p);
        }
    }

    fn check_new(&self, buf: &PinnedBuffer, min: usize) {
        self.takes.fetch_add(1, Ordering::Relaxed);
        let ptr = buf.as_ptr() as usize;
        if buf.len() < min.max(1) {
            self.problem(format!("take({min}) gave {} bytes", buf.len()));
        }
        // Sample large buffers, check small ones whole.
        let bad = if buf.len() <= 64 << 10 {
            buf.iter().any(|&b| b != 0)
        } else {
            buf[..32 << 10].iter().any(|&b| b != 0)
                || buf[buf.len() - (4 << 10)..].iter().any(|&b| b != 0)
                || buf.iter().step_by(1021).any(|&b| b != 0)
        };
        if bad {
            self.problem(format!(
                "non-zero bytes in a {}-byte buffer {ptr:#x}",
                buf.len()
            ));
        }
        if !self.live.lock().unwrap().insert(ptr) {
            self.problem(format!("double hand-out of {ptr:#x}"));
        }
    }

    fn release(&self, buf: PinnedBuffer) {
        self.live.lock().unwrap().remove(&(buf.as_ptr() as usize));
        drop(buf);
    }
}

#[cfg(feature = "testing")]
fn dirty(buf: &mut PinnedBuffer, rng: &mut Rng) {
    let cap = if rng.below(16) == 0 {
        buf.len()
    } else {
        buf.len().min(96 << 10)
    };
    let n = rng.below(cap as u64 + 1) as usize;
    buf[..n].fill(0xA5);
    buf.set_dirty_len(n);
}

#[cfg(feature = "testing")]
fn taker(
    pool: &Pool,
    shared: &Shared,
    seed: u64,
    peer: &std::sync::mpsc::SyncSender<PinnedBuffer>,
    fences: &Mutex<Vec<TestFence>>,
    use_fences: bool,
    rounds: usize,
) {
    let mut rng = Rng(seed | 1);
    let mut held: Vec<PinnedBuffer> = Vec::new();
    let devices = pool.stats().devices;
    for _ in 0..rounds {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        let min = SIZES[rng.below(SIZES.len() as u64) as usize];
        let device = rng.below(devices as u64) as usize;
        let t0 = Instant::now();
        let got = pool.take_on(device, min);
        let took = t0.elapsed().as_micros() as u64;
        shared.max_take_us.fetch_max(took, Ordering::Relaxed);
        shared.total_take_us.fetch_add(took, Ordering::Relaxed);
        let mut buf = match got {
            Ok(b) => b,
            Err(e) => {
                shared.problem(format!("take_on({device}, {min}) failed: {e}"));
                continue;
            }
        };
        shared.check_new(&buf, min);
        if buf.device() != device {
            shared.problem(format!("asked device {device}, got {}", buf.device()));
        }
        dirty(&mut buf, &mut rng);
        if use_fences && rng.below(4) == 0 {
            let f = TestFence::default();
            f.record(&mut buf);
            fences.lock().unwrap().push(f);
        }
        held.push(buf);
        if held.len() > 6 || rng.below(3) == 0 {
            let i = rng.below(held.len() as u64) as usize;
            let buf = held.swap_remove(i);
            if rng.below(3) == 0 {
                shared.live.lock().unwrap().remove(&(buf.as_ptr() as usize));
                if let Err(e) = peer.try_send(buf) {
                    drop(match e {
                        std::sync::mpsc::TrySendError::Full(b) => b,
                        std::sync::mpsc::TrySendError::Disconnected(b) => b,
                    });
                }
            } else {
                shared.release(buf);
            }
        }
    }
    for buf in held {
        shared.release(buf);
    }
}

#[cfg(feature = "testing")]
fn run(pool: Pool, faults: Option<Arc<Faults>>, secs: u64) {
    let shared = Arc::new(Shared::default());
    let fences: Arc<Mutex<Vec<TestFence>>> = Arc::default();
    let use_fences = faults.is_some();
    let (tx, rx) = std::sync::mpsc::sync_channel::<PinnedBuffer>(256);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let final_cap = 24 << 20;
    {
        let (pool, shared, fences) = (pool.clone(), shared.clone(), fences.clone());
        within(Duration::from_secs(60), "stress", move || {
            std::thread::scope(|s| {
                // A dropper for cross-thread drops.
                s.spawn(|| {
                    for buf in rx {
                        drop(buf);
                    }
                });
                // Long-lived takers.
                for t in 0..2u64 {
                    let (pool, shared, tx, fences) = (&pool, &shared, tx.clone(), &fences);
                    s.spawn(move || {
                        let mut n = 0;
                        while Instant::now() < deadline {
                            taker(
                                pool,
                                shared,
                                0x9E37_79B9 * (t + 1) + n,
                                &tx,
                                fences,
                                use_fences,
                                500,
                            );
                            n += 1;
                        }
                    });
                }
                // Short-lived takers: threads exit, new ones inherit caches.
                {
                    let (pool, shared, tx, fences) = (&pool, &shared, tx.clone(), &fences);
                    s.spawn(move || {
                        let mut n = 0u64;
                        while Instant::now() < deadline {
                            std::thread::scope(|s2| {
                                let tx = tx.clone();
                                s2.spawn(move || {
                                    taker(pool, shared, 77 + n, &tx, fences, use_fences, 40)
                                });
                            });
                            n += 1;
                        }
                    });
                }
                // Fence completer.
                {
                    let fences = &fences;
                    s.spawn(move || {
                        while Instant::now() < deadline {
                            let batch: Vec<_> = std::mem::take(&mut *fences.lock().unwrap());
                            std::thread::sleep(Duration::from_micros(300));
                            for f in batch {
                                f.complete();
                            }
                        }
                    });
                }
                // Control; at the deadline it stops the takers after their
                // current round, so a slow machine (or a sanitizer) makes
                // the run no longer than the watchdog allows.
                {
                    let (pool, shared) = (&pool, &shared);
                    s.spawn(move || {
                        let mut rng = Rng(12345);
                        while Instant::now() < deadline {
                            match rng.below(6) {
                                0 => pool.flush(),
                                1 => pool.clear(),
                                2 => pool.shutdown(),
                                3 => pool.set_max_pooled_bytes(
                                    [0, 4096, 1 << 20, 8 << 20, 64 << 20][rng.below(5) as usize],
                                ),
                                _ => {
                                    let _ = pool.stats();
                                }
                            }
                            std::thread::sleep(Duration::from_micros(rng.below(2000)));
                        }
                        shared.stop.store(true, Ordering::Relaxed);
                        pool.set_max_pooled_bytes(final_cap);
                    });
                }
                drop(tx);
            });
            // Complete every remaining fence before the final flush.
            for f in std::mem::take(&mut *fences.lock().unwrap()) {
                f.complete();
            }
        });
    }
    let problems = shared.problems.lock().unwrap().clone();
    assert!(problems.is_empty(), "{problems:#?}");
    let p2 = pool.clone();
    let stats = within(Duration::from_secs(30), "final flush", move || settled(&p2));
    assert_eq!(stats.in_cleaner, 0, "in cleaner after flush: {stats:#?}");
    assert_eq!(stats.max_pooled_bytes, final_cap);
    assert!(
        stats.pooled_bytes <= final_cap,
        "pooled {} > cap {} after quiescence: {stats:#?}",
        stats.pooled_bytes,
        final_cap
    );
    let dev_bytes: usize = stats.per_device.iter().map(|d| d.pooled_bytes).sum();
    let dev_bufs: usize = stats.per_device.iter().map(|d| d.pooled_buffers).sum();
    let class_bufs: usize = stats.per_class.iter().map(|c| c.pooled_buffers).sum();
    assert_eq!(
        dev_bytes, stats.pooled_bytes,
        "per-device bytes vs total: {stats:#?}"
    );
    assert_eq!(dev_bufs, stats.pooled_buffers);
    assert_eq!(class_bufs, stats.pooled_buffers);
    let takes = shared.takes.load(Ordering::Relaxed);
    eprintln!(
        "max take {} us, total take time {} ms",
        shared.max_take_us.load(Ordering::Relaxed),
        shared.total_take_us.load(Ordering::Relaxed) / 1000
    );
    eprintln!(
        "takes {takes}, hits {}, evictions {}, released {}, recycled {}, syncs {}",
        stats.hits, stats.evictions, stats.released, stats.recycled, stats.device_syncs
    );
    assert_eq!(stats.hits + stats.misses, takes, "hits + misses vs takes");
    let dev_takes: u64 = stats.per_device.iter().map(|d| d.hits + d.misses).sum();
    assert_eq!(dev_takes, takes);
    assert_eq!(stats.leaked_bytes, 0, "{stats:#?}");
    assert_eq!(stats.worker_panics, 0);
    let p2 = pool.clone();
    within(Duration::from_secs(20), "final shutdown", move || {
        p2.shutdown()
    });
    let stats = pool.stats();
    assert_eq!(
        (stats.pooled_buffers, stats.pooled_bytes, stats.in_cleaner),
        (0, 0, 0)
    );
    if let Some(faults) = faults {
        assert_eq!(stats.pinned_bytes, 0, "{stats:#?}");
        assert_eq!(
            faults.registered(),
            faults.unregistered(),
            "registrations not undone by shutdown"
        );
    }
}

/// Flushes until the pool is quiet and returns its statistics then. With
/// a pinning backend, provisioning (on by default) may pin buffers ahead of
/// demand after a flush returns: each is counted in the cleaner until it is
/// ready, and one admitted while a snapshot is read is in the pooled bytes
/// but not yet in the per-device counts. Provisioning stops once every
/// slot's mark is met within the cap, so the pool does become quiet: a
/// snapshot with nothing in the cleaner whose per-device bytes add up to the
/// total, read twice with no change.
#[cfg(feature = "testing")]
fn settled(pool: &Pool) -> pinpool::Stats {
    let deadline = Instant::now() + Duration::from_secs(20);
    // Regions wholly free past the cap go at a provisioning tick once they
    // have been free for 100 ms (see `PoolBuilder::regions`): a flush does
    // not wait for them.
    let quiet = |s: &pinpool::Stats| {
        s.in_cleaner == 0
            && s.per_device.iter().map(|d| d.pooled_bytes).sum::<usize>() == s.pooled_bytes
            && s.pooled_bytes <= s.max_pooled_bytes
    };
    let mut last: Option<pinpool::Stats> = None;
    loop {
        pool.flush();
        let stats = pool.stats();
        let same = last.as_ref().is_some_and(|l| {
            (l.pooled_bytes, l.pooled_buffers, l.registrations)
                == (
                    stats.pooled_bytes,
                    stats.pooled_buffers,
                    stats.registrations,
                )
        });
        if (quiet(&stats) && same) || Instant::now() > deadline {
            return stats;
        }
        last = Some(stats);
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(feature = "testing")]
#[test]
fn everything_at_once_host_fine() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .devices(2)
        .cleaner_threads(2)
        .max_pooled_bytes(32 << 20)
        .thread_cache_bytes(2 << 20)
        .build()
        .unwrap();
    run(pool, None, 3);
}

#[cfg(feature = "testing")]
#[test]
fn everything_at_once_host_pow2_one_worker() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .devices(3)
        .cleaner_threads(1)
        .size_classes(SizeClasses::PowersOfTwo)
        .max_pooled_bytes(16 << 20)
        .build()
        .unwrap();
    run(pool, None, 3);
}

#[cfg(feature = "testing")]
#[test]
fn everything_at_once_faults() {
    let faults = Arc::new(Faults::default());
    let pool = Pool::builder()
        .faults(faults.clone())
        .devices(2)
        .cleaner_threads(3)
        .max_pooled_bytes(32 << 20)
        .build()
        .unwrap();
    run(pool, Some(faults), 3);
}

/// Many threads over mixed sizes and devices with cross-thread drops for
/// `secs`: every take is zeroed, no two live buffers overlap, and the
/// accounting is exact at the end. Returns the operations done.
#[cfg(feature = "testing")]
fn soak(secs: u64) -> u64 {
    const THREADS: usize = 16;
    let (pool, faults) = faulty_on(2);
    let live: Arc<Mutex<BTreeMap<usize, usize>>> = Arc::default();
    let (tx, rx) = std::sync::mpsc::channel::<pinpool::PinnedBuffer>();
    let rx = Arc::new(Mutex::new(rx));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let ops: u64 = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (pool, live, tx, rx) = (&pool, live.clone(), tx.clone(), rx.clone());
                scope.spawn(move || {
                    let mut ops = 0u64;
                    let mut i = t;
                    while Instant::now() < deadline {
                        i = i.wrapping_mul(31).wrapping_add(7);
                        let size = 1 << (4 + i % 17);
                        let mut buf = pool.take_on(i % 2, size).unwrap();
                        assert!(buf.iter().all(|&b| b == 0), "a taken buffer was not zeroed");
                        let (start, end) =
                            (buf.as_ptr() as usize, buf.as_ptr() as usize + buf.len());
                        {
                            let mut live = live.lock().unwrap();
                            let overlaps = live
                                .range(..end)
                                .next_back()
                                .is_some_and(|(_, &e)| e > start);
                            assert!(!overlaps, "two live buffers share bytes");
                            live.insert(start, end);
                        }
                        let n = buf.len().min(1 + i % 4096);
                        buf[..n].fill(0xA5);
                        buf.set_dirty_len(n);
                        live.lock().unwrap().remove(&start);
                        if i % 3 == 0 {
                            tx.send(buf).unwrap();
                        } else {
                            drop(buf);
                        }
                        if let Ok(other) = rx.lock().unwrap().try_recv() {
                            drop(other);
                        }
                        ops += 1;
                    }
                    ops
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    drop(tx);
    for buf in rx.lock().unwrap().try_iter() {
        drop(buf);
    }
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.hits + stats.misses, ops);
    assert_eq!(stats.in_cleaner, 0);
    let by_class: usize = stats.per_class.iter().map(|c| c.pooled_buffers).sum();
    assert_eq!(by_class, stats.pooled_buffers);
    assert!(stats.pooled_bytes <= stats.max_pooled_bytes);
    pool.shutdown();
    assert_eq!(
        faults.unregistered(),
        faults.registered(),
        "registrations leaked"
    );
    assert_eq!(pool.stats().pooled_bytes, 0);
    ops
}

#[cfg(feature = "testing")]
#[test]
fn soak_5s() {
    let ops = soak(5);
    println!("soak: {ops} operations in 5 s");
}

#[cfg(feature = "testing")]
#[test]
#[ignore = "60 s; run with --ignored soak"]
fn soak_60s() {
    let ops = soak(60);
    println!("soak: {ops} operations in 60 s");
}
