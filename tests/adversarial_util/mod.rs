//! Helpers for the adversarial tests.
#![allow(dead_code)]

#[path = "../common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use pinpool::{BackendKind, Pool, SizeClasses};

#[allow(unused_imports)] // not every test binary uses every helper
pub use common::within;

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
#[allow(unused_imports)]
pub use common::faulty;

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
