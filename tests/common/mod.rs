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

/// Runs `f` on its own thread; panics if it has not finished within
/// `limit` (a hang fails the test instead of stalling the run).
pub fn within<T: Send + 'static>(
    limit: std::time::Duration,
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

/// A pool on the fault-injecting backend with `workers` cleaner workers,
/// and its faults.
#[cfg(feature = "testing")]
pub fn faulty(workers: usize) -> (Pool, std::sync::Arc<pinpool::testing::Faults>) {
    let faults = std::sync::Arc::new(pinpool::testing::Faults::default());
    let pool = Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(workers)
        .build()
        .unwrap();
    (pool, faults)
}

/// Runs the test named `test` again, alone, in a child process of its own
/// with `env` set, for a test of process-wide state (the reaper thread,
/// what a thread start or a panic does to the whole process). Returns
/// `None` in the child, which then does the test's work, and in the parent
/// the child's output once it passed.
pub fn in_child(test: &str, env: &[(&str, &str)]) -> Option<String> {
    const CHILD: &str = "PINPOOL_TEST_CHILD";
    if std::env::var(CHILD).as_deref() == Ok(test) {
        return None;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, test)
        .envs(env.iter().copied())
        .output()
        .expect("the test binary runs again");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{test} failed in its child process ({}):\n{text}",
        out.status
    );
    Some(text)
}
