//! A reuse oracle under load: a pinned buffer dropped without events may
//! come back from the pool only after a device synchronize completed after
//! its drop began (the fault backend counts a synchronize once its hold is
//! over, just before it returns). Synchronizes are held and released at
//! random meanwhile, and a control thread runs flush / clear / shutdown /
//! set_max_pooled_bytes. Also: no double hand-out, all-zero takes, and no
//! backend call on a thread that only takes and drops.
#![cfg(feature = "testing")]

mod adversarial_util;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use adversarial_util::{all_zero, eventually, within};
use pinpool::testing::Faults;
use pinpool::{PinnedBuffer, Pool};

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
