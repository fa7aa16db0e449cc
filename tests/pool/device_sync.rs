//! The device-synchronize fallback for pinned buffers dropped without
//! events. The contract: "memory whose copies are not known to have
//! finished is leaked (counted), never unregistered or unmapped". With the
//! fault backend's `hold_synchronize`, a device synchronize that has not
//! returned means the copies are not known to have finished, so no
//! unregistration may happen while it is held; a synchronize that started
//! before a buffer's drop does not count for it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pinpool::testing::{Faults, TestFence};
use pinpool::{PinnedBuffer, Pool};

use crate::common::{all_zero, eventually, faulty, faulty_builder, within};

/// `faulty(workers)` with provisioning off, for tests that count pooled
/// buffers exactly: after a buffer leaks, a provisioning tick may pin a
/// buffer for its class (in use plus ready fall short of the class's
/// high-water mark), so the count would depend on whether a tick ran.
fn faulty_unprovisioned(workers: usize) -> (Pool, Arc<Faults>) {
    let (builder, faults) = faulty_builder(workers);
    (builder.provision(false).build().unwrap(), faults)
}

/// A pinned, event-less buffer released because the zeroing backlog is
/// full still waits for a device synchronize that started after its drop
/// (seen failing before the fix: the release branch took no note of the
/// synchronizes started, so an earlier one counted).
#[test]
fn zero_backlog_release_of_eventless_pinned_buffer_skips_the_device_sync() {
    const BIG: usize = 80 << 20; // above the 64 MiB zero backlog of a small cap
    let (pool, faults) = faulty(1);
    // Pin the big buffer (its first trip registers it) and a small one.
    drop(pool.take(BIG));
    drop(pool.take(1 << 16));
    pool.flush();
    let big = pool.take(BIG);
    assert!(
        big.is_pinned(),
        "the big buffer was pinned on its first trip"
    );
    // One device synchronize completes (the small buffer, event-less).
    let small = pool.take(1 << 16);
    assert!(small.is_pinned());
    drop(small);
    pool.flush();
    assert!(faults.synchronize_calls() >= 1);
    // A small cap: the zero backlog limit is now 64 MiB, below the big
    // buffer's dirty prefix, so its drop takes the "release" branch.
    pool.set_max_pooled_bytes(1 << 20);
    faults.hold_synchronize();
    let unregistered_before = faults.unregistered();
    drop(big); // event-less pinned: needs a synchronize that starts now
    std::thread::sleep(Duration::from_millis(300));
    let unregistered_while_held = faults.unregistered() - unregistered_before;
    let syncs_while_held = faults.synchronize_calls();
    faults.release();
    let skipped = pool.stats().zeroing_skipped;
    within(Duration::from_secs(10), "flush", move || pool.flush());
    assert_eq!(skipped, 1, "the drop took the zero-backlog branch");
    let _ = syncs_while_held;
    assert_eq!(
        unregistered_while_held, 0,
        "a pinned buffer dropped without events was unregistered while every \
         device synchronize was still held (stale sync_gen note)"
    );
}

/// "One slow event must not hold up unrelated buffers": a device
/// synchronize for one event-less buffer blocks the worker running it; a
/// second event-less buffer of that device waits parked instead of
/// blocking another worker, which stays free for a buffer whose own copy
/// has finished (seen failing before the fix: both workers blocked).
#[test]
fn a_slow_device_sync_holds_up_every_worker() {
    let (pool, faults) = faulty(2);
    // Pin two small buffers and a 1 MiB one.
    let bufs: Vec<_> = (0..2).map(|_| pool.take(1 << 16)).collect();
    let big = pool.take(1 << 20);
    drop(bufs);
    drop(big);
    pool.flush();
    let bufs: Vec<_> = (0..2).map(|_| pool.take(1 << 16)).collect();
    let mut fenced = pool.take(1 << 20);
    assert!(bufs.iter().all(|b| b.is_pinned()) && fenced.is_pinned());
    let fence = TestFence::default();
    fence.record(&mut fenced);
    fence.complete(); // its copy is done: it is ready to recycle
    faults.hold_synchronize();
    drop(bufs); // two event-less pinned buffers: two workers wanted
    std::thread::sleep(Duration::from_millis(50));
    let before = pool.stats().recycled;
    drop(fenced); // 1 MiB dirty: goes to the cleaner, which should recycle it
    let recycled = eventually(Duration::from_millis(500), || {
        pool.stats().recycled > before
    });
    faults.release();
    within(Duration::from_secs(10), "flush", move || pool.flush());
    assert!(
        recycled,
        "a buffer whose copy had finished waited behind a device synchronize \
         of unrelated buffers (every worker was blocked)"
    );
}

/// The same for a failed device synchronize (pinned buffer, no events).
#[test]
fn failed_synchronize_leaks_the_buffer_instead_of_freeing_it() {
    let (pool, faults) = faulty(1);
    drop(pool.take(1 << 16));
    pool.flush();
    let buf = pool.take(1 << 16);
    let next = faults.synchronize_calls() + 1;
    faults.fail_synchronize(&[next]);
    drop(buf);
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.fence_failures, 1);
    assert_eq!(
        faults.unregistered(),
        0,
        "memory a copy may still read was unregistered"
    );
}

/// Every device synchronize fails: event-less pinned buffers must be leaked
/// (counted), flush must return, and after the pool is closed and every
/// buffer dropped, registrations = unregistrations + leaked buffers.
#[test]
fn failing_syncs_leak_counted_flush_returns_nothing_lost() {
    let (pool, faults) = faulty(2);
    let bufs: Vec<_> = (0..64).map(|i| pool.take(4096 << (i % 5))).collect();
    drop(bufs);
    pool.flush();
    let registered = faults.registered();
    assert!(registered > 0);
    let all: Vec<u64> = (1..100_000).collect();
    faults.fail_synchronize(&all);
    faults.hold_synchronize();
    let bufs: Vec<_> = (0..64).map(|i| pool.take(4096 << (i % 5))).collect();
    let pinned = bufs.iter().filter(|b| b.is_pinned()).count() as u64;
    // Drop them from several threads while syncs are held.
    let mut handles = Vec::new();
    let mut it = bufs.into_iter();
    for _ in 0..4 {
        let chunk: Vec<_> = it.by_ref().take(16).collect();
        handles.push(std::thread::spawn(move || drop(chunk)));
    }
    for h in handles {
        h.join().unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    faults.release();
    let p = pool.clone();
    within(Duration::from_secs(10), "flush", move || p.flush());
    let s = pool.stats();
    assert_eq!(
        s.fence_failures, pinned,
        "every event-less pinned buffer leaked"
    );
    // The pool still works, and shutdown returns.
    let p = pool.clone();
    within(Duration::from_secs(10), "shutdown", move || p.shutdown());
    let p = pool.clone();
    within(Duration::from_secs(10), "take after shutdown", move || {
        drop(p.take(4096));
        p.flush();
    });
    within(Duration::from_secs(10), "close", move || drop(pool));
    let ok = eventually(Duration::from_secs(5), || {
        faults.registered() == faults.unregistered() + pinned
    });
    assert!(
        ok,
        "registered {} != unregistered {} + leaked {pinned}",
        faults.registered(),
        faults.unregistered()
    );
}

/// A device synchronize that started *before* an event-less pinned buffer
/// was dropped must not count for it. Every synchronize after the first
/// (held) one fails, so a correct pool must leak the second buffer; a pool
/// that counted the earlier synchronize recycles it. (This covers the
/// cleaner's non-blocking check and synchronize, `settled` and `try_sync`;
/// the blocking `wait` of bulk releases and closed pools' late buffers has
/// tests of its own: `zero_backlog_release_...` above and the reaper's.)
#[test]
fn a_sync_started_before_the_drop_does_not_cover_it() {
    let (pool, faults) = faulty_unprovisioned(2);
    let pair: Vec<_> = (0..2).map(|_| pool.take(1 << 16)).collect();
    drop(pair);
    pool.flush();
    let mut pair: Vec<_> = (0..2).map(|_| pool.take(1 << 16)).collect();
    assert!(pair.iter().all(|b| b.is_pinned() && b.was_pooled()));
    let x = pair.pop().unwrap();
    let y = pair.pop().unwrap();
    let c0 = faults.synchronize_calls();
    let syncs0 = pool.stats().device_syncs;
    faults.hold_synchronize();
    drop(y); // a worker starts synchronize N (held)
    std::thread::sleep(Duration::from_millis(300));
    let later: Vec<u64> = (c0 + 2..c0 + 10_000).collect();
    faults.fail_synchronize(&later);
    drop(x); // dropped after N started: only N+1 or later covers it
    std::thread::sleep(Duration::from_millis(300));
    faults.release();
    let p = pool.clone();
    within(Duration::from_secs(10), "flush", move || p.flush());
    let s = pool.stats();
    assert!(s.device_syncs > syncs0, "a synchronize ran");
    assert_eq!(
        (s.pooled_buffers, s.fence_failures),
        (1, 1),
        "x was recycled on the strength of a synchronize that started before \
         its drop ({} synchronize calls)",
        faults.synchronize_calls() - c0
    );
}

/// Same, with one worker: the synchronize for y runs on the worker, and x is
/// dropped while it is held.
#[test]
fn a_sync_started_before_the_drop_does_not_cover_it_one_worker() {
    let (pool, faults) = faulty_unprovisioned(1);
    let pair: Vec<_> = (0..2).map(|_| pool.take(1 << 16)).collect();
    drop(pair);
    pool.flush();
    let mut pair: Vec<_> = (0..2).map(|_| pool.take(1 << 16)).collect();
    let x = pair.pop().unwrap();
    let y = pair.pop().unwrap();
    let c0 = faults.synchronize_calls();
    faults.hold_synchronize();
    drop(y);
    std::thread::sleep(Duration::from_millis(300));
    let later: Vec<u64> = (c0 + 2..c0 + 10_000).collect();
    faults.fail_synchronize(&later);
    drop(x);
    faults.release();
    let p = pool.clone();
    within(Duration::from_secs(10), "flush", move || p.flush());
    let s = pool.stats();
    assert_eq!((s.pooled_buffers, s.fence_failures), (1, 1));
}

// === the reuse oracle ===

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[derive(Default)]
struct State {
    live: Mutex<HashSet<usize>>,
    /// Pointer -> synchronize calls counted before its event-less drop.
    dropped: Mutex<HashMap<usize, u64>>,
    problems: Mutex<Vec<String>>,
    stop: AtomicBool,
    /// Event-less buffers that came back and were checked.
    checked: std::sync::atomic::AtomicU64,
}

impl State {
    fn problem(&self, p: String) {
        let mut v = self.problems.lock().unwrap();
        if v.len() < 10 {
            v.push(p);
        }
    }
}

fn got(state: &State, faults: &Faults, buf: &PinnedBuffer) {
    let ptr = buf.as_ptr() as usize;
    if !state.live.lock().unwrap().insert(ptr) {
        state.problem(format!("double hand-out of {ptr:#x}"));
    }
    if !all_zero(buf) {
        state.problem(format!("non-zero hand-out of {ptr:#x}"));
    }
    let before = state.dropped.lock().unwrap().remove(&ptr);
    if let Some(c0) = before {
        if buf.was_pooled() && buf.is_pinned() {
            state.checked.fetch_add(1, Ordering::Relaxed);
            let now = faults.synchronize_calls();
            if now <= c0 {
                state.problem(format!(
                    "{ptr:#x} dropped without events came back with no synchronize \
                     completed since its drop ({c0} calls before, {now} now)"
                ));
            }
        }
    }
}

fn gone(state: &State, faults: &Faults, buf: PinnedBuffer) {
    let ptr = buf.as_ptr() as usize;
    let pinned = buf.is_pinned();
    // Counted before the drop, and the entry in place before the buffer
    // can come back.
    if pinned {
        state
            .dropped
            .lock()
            .unwrap()
            .insert(ptr, faults.synchronize_calls());
    } else {
        state.dropped.lock().unwrap().remove(&ptr);
    }
    state.live.lock().unwrap().remove(&ptr);
    drop(buf);
}

/// A reuse oracle under load: a pinned buffer dropped without events may
/// come back from the pool only after a device synchronize completed after
/// its drop began (the fault backend counts a synchronize once its hold is
/// over, just before it returns). Synchronizes are held and released at
/// random meanwhile, and a control thread runs flush / clear / shutdown /
/// set_max_pooled_bytes. Also: no double hand-out, all-zero takes, and no
/// backend call on a thread that only takes and drops.
#[test]
fn eventless_reuse_waits_for_a_later_sync_under_load() {
    let faults = Arc::new(Faults::default());
    let pool = Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(2)
        .max_pooled_bytes(8 << 20)
        .build()
        .unwrap();
    let state = Arc::new(State::default());
    let sizes = [4096usize, 20 << 10, 64 << 10, 300 << 10, 2 << 20];
    let mut workers = Vec::new();
    let (tx, rx) = std::sync::mpsc::channel::<PinnedBuffer>();
    let rx = Arc::new(Mutex::new(rx));
    for t in 0..3u64 {
        let (pool, faults, state, tx, rx) = (
            pool.clone(),
            faults.clone(),
            state.clone(),
            tx.clone(),
            rx.clone(),
        );
        workers.push(std::thread::spawn(move || {
            let mut rng = Rng(0x9e37_79b9 + t * 7919);
            let mut held: Vec<PinnedBuffer> = Vec::new();
            while !state.stop.load(Ordering::Relaxed) {
                match rng.below(10) {
                    0..=4 => {
                        let mut b = pool.take(sizes[rng.below(sizes.len() as u64) as usize]);
                        got(&state, &faults, &b);
                        let n = b.len().min(1000);
                        b[..n].fill(0xA5);
                        held.push(b);
                    }
                    5..=7 if !held.is_empty() => {
                        let i = rng.below(held.len() as u64) as usize;
                        gone(&state, &faults, held.swap_remove(i));
                    }
                    8 if !held.is_empty() => {
                        // Cross-thread drop.
                        let _ = tx.send(held.swap_remove(0));
                    }
                    _ => {
                        let b = rx.lock().unwrap().try_recv();
                        if let Ok(b) = b {
                            gone(&state, &faults, b);
                        }
                    }
                }
                if held.len() > 12 {
                    gone(&state, &faults, held.swap_remove(0));
                }
            }
            for b in held {
                gone(&state, &faults, b);
            }
            while let Ok(b) = rx.lock().unwrap().try_recv() {
                gone(&state, &faults, b);
            }
            faults.calls_on(std::thread::current().id())
        }));
    }
    drop(tx);
    let control = {
        let (pool, faults, state) = (pool.clone(), faults.clone(), state.clone());
        std::thread::spawn(move || {
            let mut rng = Rng(12345);
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(3) {
                match rng.below(8) {
                    0 => faults.hold_synchronize(),
                    1 | 2 => faults.release(),
                    3 => {
                        faults.release();
                        pool.flush();
                    }
                    4 => pool.clear(),
                    5 => {
                        faults.release();
                        pool.shutdown();
                    }
                    6 => pool.set_max_pooled_bytes([1 << 20, 8 << 20][rng.below(2) as usize]),
                    _ => {}
                }
                std::thread::sleep(Duration::from_millis(rng.below(20)));
            }
            faults.release();
            state.stop.store(true, Ordering::Relaxed);
        })
    };
    within(Duration::from_secs(30), "the load", move || {
        control.join().unwrap();
        for (i, w) in workers.into_iter().enumerate() {
            let calls = w.join().unwrap();
            assert_eq!(
                calls, 0,
                "taker/dropper thread {i} made {calls} backend calls"
            );
        }
    });
    let problems = state.problems.lock().unwrap().clone();
    let p = pool.clone();
    within(Duration::from_secs(10), "shutdown", move || p.shutdown());
    let leaked = pool.stats().leaked_bytes;
    within(Duration::from_secs(10), "close", move || drop(pool));
    let balanced = eventually(Duration::from_secs(5), || {
        faults.registered() == faults.unregistered()
    });
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(
        state.checked.load(Ordering::Relaxed) > 0,
        "no event-less buffer came back: the oracle checked nothing"
    );
    assert!(
        balanced,
        "registered {} unregistered {} (leaked bytes {leaked})",
        faults.registered(),
        faults.unregistered()
    );
}
