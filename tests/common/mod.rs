//! Helpers shared by the integration tests.
#![allow(dead_code)]

use pinpool::{BackendKind, Pool};

/// A host-backend pool with `devices` shards and two cleaner workers.
pub fn host_pool(devices: usize) -> Pool {
    Pool::builder()
        .backend(BackendKind::Host)
        .devices(devices)
        .cleaner_threads(2)
        .build()
        .expect("a host pool always builds")
}

/// Whether every byte of `buf` is zero.
pub fn all_zero(buf: &[u8]) -> bool {
    buf.iter().all(|&b| b == 0)
}

/// A host-backend pool with `devices` shards and `workers` cleaner workers.
pub fn host_pool_with(devices: usize, workers: usize) -> Pool {
    Pool::builder()
        .backend(BackendKind::Host)
        .devices(devices)
        .cleaner_threads(workers)
        .build()
        .expect("a host pool always builds")
}

pub mod gpu;

/// Resident bytes of this process (Linux: `/proc/self/statm`).
pub fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}
