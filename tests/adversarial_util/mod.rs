//! Helpers for the adversarial tests.
#![allow(dead_code)]

#[path = "../common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use pinpool::{BackendKind, Pool, SizeClasses};

/// Runs `f` on its own thread; panics if it has not finished within
/// `limit` (a hang fails the test instead of stalling the run).
pub fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        let out = f();
        let _ = tx.send(());
        out
    });
    match rx.recv_timeout(limit) {
        Ok(()) => worker.join().expect("the checked thread panicked"),
        Err(_) if worker.is_finished() => worker.join().expect("the checked thread panicked"),
        Err(_) => panic!("{what}: still running after {limit:?} (hung)"),
    }
}

/// Polls `cond` until it holds or `limit` passes; returns whether it held.
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub fn host(workers: usize) -> Pool {
    Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(workers)
        .build()
        .unwrap()
}

pub fn host_with(workers: usize, devices: usize, classes: SizeClasses, cap: usize) -> Pool {
    Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(workers)
        .devices(devices)
        .size_classes(classes)
        .max_pooled_bytes(cap)
        .build()
        .unwrap()
}

#[cfg(feature = "testing")]
pub fn faulty(workers: usize) -> (Pool, Arc<pinpool::testing::Faults>) {
    let faults = Arc::new(pinpool::testing::Faults::default());
    let pool = Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(workers)
        .build()
        .unwrap();
    (pool, faults)
}

pub fn all_zero(buf: &[u8]) -> bool {
    buf.iter().all(|&b| b == 0)
}

/// Threads of this process (`/proc/self/task`).
pub fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Resident bytes of this process.
pub fn resident_bytes() -> usize {
    common::resident_bytes()
}
