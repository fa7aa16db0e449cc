//! `flush()` "blocks until every buffer dropped before the call (on any
//! thread) has been recycled or released", while other threads keep taking
//! and dropping, and returns on an idle pool.

#[cfg(feature = "testing")]
use std::cell::RefCell;
#[cfg(feature = "testing")]
use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(feature = "testing")]
use std::sync::Arc;
#[cfg(feature = "testing")]
use std::time::Duration;

#[cfg(feature = "testing")]
use pinpool::testing::TestFence;
#[cfg(feature = "testing")]
use pinpool::{BackendKind, PinnedBuffer, Pool};

use crate::common::host_pool;
#[cfg(feature = "testing")]
use crate::common::within;

#[test]
fn flush_on_an_idle_pool_returns() {
    let pool = host_pool(1);
    pool.flush();
    pool.shutdown();
    pool.flush();
}

// === a probe dropped along every path ===
//
// A probe buffer of a class nobody else uses is dropped along every path
// (own cache, cleaner, another thread, an exiting thread, a thread-local
// destructor, with a fence completed just before) and then the probe
// thread flushes: its class must show it pooled.

#[cfg(feature = "testing")]
const PROBE: usize = 3 << 20; // a class of its own (3 MiB)

#[cfg(feature = "testing")]
fn probe_pooled(pool: &Pool) -> usize {
    pool.stats()
        .per_class
        .iter()
        .find(|c| c.size == PROBE)
        .map_or(0, |c| c.pooled_buffers)
}

#[cfg(feature = "testing")]
struct DropOnExit(RefCell<Option<PinnedBuffer>>);
#[cfg(feature = "testing")]
impl Drop for DropOnExit {
    fn drop(&mut self) {
        drop(self.0.borrow_mut().take());
    }
}
#[cfg(feature = "testing")]
thread_local!(static HELD: DropOnExit = const { DropOnExit(RefCell::new(None)) });

#[cfg(feature = "testing")]
fn drop_via(path: usize, mut buf: PinnedBuffer) {
    match path {
        0 => {
            buf.set_dirty_len(100); // deferred in the owner's cache
            drop(buf);
        }
        1 => drop(buf), // 3 MiB dirty: the cleaner
        2 => {
            buf.set_dirty_len(100);
            // Another thread drops it and finishes before we flush.
            std::thread::spawn(move || drop(buf)).join().unwrap();
        }
        3 => {
            // A thread-local destructor drops it while the thread exits.
            std::thread::spawn(move || HELD.with(|h| *h.0.borrow_mut() = Some(buf)))
                .join()
                .unwrap();
        }
        4 => {
            let f = TestFence::default();
            f.record(&mut buf);
            buf.set_dirty_len(100);
            drop(buf);
            f.complete();
        }
        _ => {
            let f = TestFence::default();
            f.record(&mut buf);
            drop(buf); // to the cleaner, parked
            std::thread::sleep(Duration::from_micros(200));
            f.complete();
        }
    }
}

#[cfg(feature = "testing")]
fn run(pool: Pool, fenced_churn: bool) {
    // Warm the churn's classes, so that its takes hit (a cold pool on the
    // fault backend never warms up under churn: see lanes.rs).
    let warm: Vec<_> = (0..5)
        .flat_map(|k| (0..12).map(move |_| 4096usize << k))
        .map(|s| pool.take(s))
        .collect();
    drop(warm);
    pool.flush();
    let stop = Arc::new(AtomicBool::new(false));
    within(Duration::from_secs(240), "flush probe", move || {
        std::thread::scope(|s| {
            for t in 0..2 {
                let (pool, stop) = (&pool, &stop);
                s.spawn(move || {
                    let mut i = 0usize;
                    let mut held = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let mut b = pool.take(4096 << ((i + t) % 5));
                        b[..64].fill(1);
                        if i.is_multiple_of(3) {
                            b.set_dirty_len(64);
                        }
                        if fenced_churn {
                            // Keeps the churn's drops off the cleaner's
                            // recycle lane (see lanes.rs).
                            let f = TestFence::default();
                            f.record(&mut b);
                            f.complete();
                            b.set_dirty_len(64);
                        }
                        held.push(b);
                        if held.len() > 3 {
                            held.remove(i % 3);
                        }
                        i += 1;
                        // A busy client, not an overload: unpaused, two
                        // threads on a two-core machine outrun one cleaner
                        // worker, and every flush waits behind the backlog.
                        if i.is_multiple_of(16) {
                            std::thread::sleep(Duration::from_micros(50));
                        }
                        // And one the cleaner keeps up with: where it falls
                        // behind by a full recycling backlog (a slow
                        // sanitizer run), drops are shed, the probe's
                        // among them. A flush now and then bounds the
                        // backlog; the other thread's drops go on meanwhile.
                        if i.is_multiple_of(512) {
                            pool.flush();
                        }
                    }
                });
            }
            let (pool, stop) = (&pool, &stop);
            s.spawn(move || {
                let mut shed = 0;
                for round in 0..30 {
                    let path = round % 6;
                    let mut buf = pool.take(PROBE);
                    assert_eq!(buf.len(), PROBE);
                    assert!(buf.iter().step_by(4096).all(|&b| b == 0));
                    buf[..100].fill(9);
                    // A probe that missed may be freed unregistered when the
                    // registration backlog is full, and any probe when the
                    // recycling backlog is (by design): then its absence
                    // says nothing of the flush. The counts are the pool's,
                    // so a shed churn buffer also excuses a round: the
                    // count of excused rounds is bounded below.
                    let shed_so_far =
                        |s: &pinpool::Stats| s.registrations_skipped + s.zeroing_skipped;
                    let skipped = shed_so_far(&pool.stats());
                    drop_via(path, buf);
                    {
                        let (tx, rx) = std::sync::mpsc::channel();
                        let p2 = pool.clone();
                        let h = std::thread::spawn(move || {
                            p2.flush();
                            let _ = tx.send(());
                        });
                        if rx.recv_timeout(Duration::from_secs(5)).is_err() {
                            let st = pool.stats();
                            stop.store(true, Ordering::Relaxed);
                            panic!(
                                "round {round}, path {path}: flush hung: in_cleaner {} {st}",
                                st.in_cleaner
                            );
                        }
                        h.join().unwrap();
                    }
                    let mut n = probe_pooled(pool);
                    // Stats are a racy snapshot: a buffer moving between two
                    // lists can be missed for a moment. Only a probe that stays
                    // missing is a failure.
                    let t0 = std::time::Instant::now();
                    // A take of the probe may miss (the probe waiting in
                    // another thread's cache), so more than one may be
                    // pooled; none is the failure.
                    while n == 0 && t0.elapsed() < Duration::from_millis(200) {
                        std::thread::sleep(Duration::from_millis(1));
                        n = probe_pooled(pool);
                    }
                    if n == 0 && shed_so_far(&pool.stats()) > skipped {
                        shed += 1;
                        continue;
                    }
                    if n == 0 {
                        stop.store(true, Ordering::Relaxed);
                        panic!(
                            "round {round}, path {path}: flush returned with the probe \
                             not back ({n} pooled): {:#?}",
                            pool.stats()
                        );
                    }
                }
                stop.store(true, Ordering::Relaxed);
                assert!(
                    shed <= 10,
                    "{shed} of 30 rounds saw drops shed past a full backlog: \
                     too few rounds checked the flush"
                );
            });
        });
    });
}

#[cfg(feature = "testing")]
#[test]
fn flush_covers_drops_on_every_path_host() {
    run(
        Pool::builder()
            .backend(BackendKind::Host)
            .cleaner_threads(2)
            .build()
            .unwrap(),
        false,
    );
}

#[cfg(feature = "testing")]
#[test]
fn flush_covers_drops_on_every_path_faults() {
    let faults = Arc::new(pinpool::testing::Faults::default());
    run(
        Pool::builder()
            .regions(false)
            .faults(faults)
            .cleaner_threads(1)
            .build()
            .unwrap(),
        true,
    );
}

/// A steady stream of drops by threads other than the takers, and of a
/// thread's own drops, all fully dirty (so through the cleaner): each flush
/// waits only for the drops before it, so each returns promptly, on the
/// host backend and on one that pins. A drop that read a stale barrier
/// (one whose epoch never flips: each side of a cache's books keeps its own
/// copy of the barrier's address) would count in one parity for good, and
/// a flush would wait for a moment with no drop in flight at all: seconds,
/// or never.
#[cfg(feature = "testing")]
#[test]
fn a_flush_returns_promptly_under_a_stream_of_remote_drops() {
    use std::sync::mpsc;
    let pins = Pool::builder()
        .faults(Arc::new(pinpool::testing::Faults::default()))
        .cleaner_threads(2)
        .regions(false)
        .build()
        .unwrap();
    let host = Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(2)
        .build()
        .unwrap();
    for (name, pool) in [("host", host), ("pins", pins)] {
        pool.set_max_pooled_bytes(1 << 30);
        let stop = AtomicBool::new(false);
        let mut worst = Duration::ZERO;
        std::thread::scope(|s| {
            let (tx, rx) = mpsc::sync_channel::<PinnedBuffer>(8);
            let rx = Arc::new(std::sync::Mutex::new(rx));
            for _ in 0..2 {
                let (pool, stop, tx) = (&pool, &stop, tx.clone());
                s.spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let mut b = pool.take(256 << 10);
                        b[0] = 1;
                        let n = b.len();
                        b.set_dirty_len(n);
                        if tx.send(b).is_err() {
                            break;
                        }
                    }
                });
            }
            drop(tx);
            let (own_pool, own_stop) = (&pool, &stop);
            s.spawn(move || {
                while !own_stop.load(Ordering::Relaxed) {
                    let mut b = own_pool.take(256 << 10);
                    let n = b.len();
                    b.set_dirty_len(n);
                    drop(b);
                }
            });
            for _ in 0..2 {
                let rx = rx.clone();
                s.spawn(move || loop {
                    let next = rx.lock().unwrap().recv();
                    match next {
                        Ok(b) => drop(b),
                        Err(_) => break,
                    }
                });
            }
            // Stops the streams however this closure ends, a hung flush's
            // panic included, so that the scope's threads end.
            struct StopOnDrop<'a>(&'a AtomicBool);
            impl Drop for StopOnDrop<'_> {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::Relaxed);
                }
            }
            let _stop = StopOnDrop(&stop);
            std::thread::sleep(Duration::from_millis(100));
            for i in 0..6 {
                let p = pool.clone();
                let t0 = std::time::Instant::now();
                within(
                    Duration::from_secs(8),
                    &format!("{name}: flush {i} under a stream of drops"),
                    move || p.flush(),
                );
                worst = worst.max(t0.elapsed());
            }
        });
        eprintln!("{name}: slowest flush {worst:?}");
    }
}
