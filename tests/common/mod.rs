//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::time::{Duration, Instant};

#[cfg(feature = "testing")]
use pinpool::{testing::Faults, PinnedBuffer};
use pinpool::{BackendKind, Pool, SizeClasses};
#[cfg(feature = "testing")]
use std::sync::Arc;

pub mod shrink;

// === pools ===

/// A host-backend pool with `devices` shards and two cleaner workers.
pub fn host_pool(devices: usize) -> Pool {
    Pool::builder()
        .backend(BackendKind::Host)
        .devices(devices)
        .cleaner_threads(2)
        .regions(false)
        .build()
        .expect("a host pool always builds")
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

/// A host-backend pool with `workers` cleaner workers (one device).
pub fn host(workers: usize) -> Pool {
    Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(workers)
        .build()
        .unwrap()
}

/// The builder of [`host_pow2`].
pub fn host_pow2_builder(workers: usize) -> pinpool::PoolBuilder {
    Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(workers)
        .size_classes(SizeClasses::PowersOfTwo)
}

/// A host-backend pool with powers-of-two size classes and `workers`
/// cleaner workers.
pub fn host_pow2(workers: usize) -> Pool {
    host_pow2_builder(workers).build().unwrap()
}

/// The builder of a pool on the fault-injecting backend with `workers`
/// cleaner workers, and its faults. The pools below are built from it and
/// pin buffers one by one (`regions` off): they test the paths of buffers
/// registered on their own; regions have tests of their own (`regions`,
/// `working_set`, `defaults`).
#[cfg(feature = "testing")]
pub fn faulty_builder(workers: usize) -> (pinpool::PoolBuilder, Arc<Faults>) {
    let faults = Arc::new(Faults::default());
    let builder = Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(workers)
        .regions(false);
    (builder, faults)
}

/// A pool on the fault-injecting backend with `workers` cleaner workers,
/// and its faults (see [`faulty_builder`]).
#[cfg(feature = "testing")]
pub fn faulty(workers: usize) -> (Pool, Arc<Faults>) {
    let (builder, faults) = faulty_builder(workers);
    (builder.build().unwrap(), faults)
}

/// A pool on the fault-injecting backend with `devices` devices and two
/// cleaner workers, and its faults.
#[cfg(feature = "testing")]
pub fn faulty_on(devices: usize) -> (Pool, Arc<Faults>) {
    let (builder, faults) = faulty_builder(2);
    (builder.devices(devices).build().unwrap(), faults)
}

/// A pool on the fault-injecting backend with `workers` cleaner workers
/// and `classes`, and its faults.
#[cfg(feature = "testing")]
pub fn faulty_with_classes(workers: usize, classes: SizeClasses) -> (Pool, Arc<Faults>) {
    let (builder, faults) = faulty_builder(workers);
    (builder.size_classes(classes).build().unwrap(), faults)
}

// === draws ===

/// A xorshift generator: the same draws every run.
pub struct Rng(pub u64);

impl Rng {
    /// The next draw.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Below `n`.
    #[allow(dead_code)]
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Log-uniform in `[lo, hi]`.
    #[allow(dead_code)]
    pub fn log_uniform(&mut self, lo: usize, hi: usize) -> usize {
        let (a, b) = ((lo as f64).ln(), (hi as f64).ln());
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        (a + u * (b - a)).exp() as usize
    }
}

// === buffers ===

/// Thirty rounds of a workload that pins and gives back through every
/// path: a few buffers of log-uniform sizes from 1000 bytes to 6 MiB held
/// 15 ms, and now and then a `reserve`, a `trim` or a `clear`; then eight
/// buffers of 1 MiB taken and dropped, left for the idle trim.
pub fn pin_and_give_back(pool: &Pool) {
    let mut rng = Rng(9);
    for round in 0..30 {
        let n = 1 + rng.below(12) as usize;
        let held: Vec<_> = (0..n)
            .map(|_| pool.take(rng.log_uniform(1000, 6 << 20)))
            .collect();
        std::thread::sleep(Duration::from_millis(15));
        drop(held);
        match round % 10 {
            3 => pool.reserve(0, &[(2 << 20, 3), (100_000, 4)]).unwrap(),
            5 => pool.trim(),
            7 => pool.clear(),
            _ => {}
        }
        pool.flush();
    }
    drop((0..8).map(|_| pool.take(1 << 20)).collect::<Vec<_>>());
}

/// Whether every byte of `buf` is zero.
pub fn all_zero(buf: &[u8]) -> bool {
    first_nonzero(buf).is_none()
}

/// The index of the first byte of `buf` that is not zero, if any: compared
/// 64 KiB at a time with zeros (a `memcmp`, fast in test builds too, where
/// a loop over bytes reads a large buffer at about a byte a nanosecond).
pub fn first_nonzero(buf: &[u8]) -> Option<usize> {
    static ZEROS: [u8; 1 << 16] = [0; 1 << 16];
    buf.chunks(ZEROS.len()).enumerate().find_map(|(i, chunk)| {
        (chunk != &ZEROS[..chunk.len()])
            .then(|| i * ZEROS.len() + chunk.iter().position(|&b| b != 0).unwrap_or(0))
    })
}

/// A pinned buffer: a miss, dropped, registered by the cleaner, taken again.
#[cfg(feature = "testing")]
pub fn pinned(pool: &Pool, size: usize) -> PinnedBuffer {
    drop(pool.take(size));
    pool.flush();
    let buf = pool.take(size);
    assert!(buf.is_pinned());
    buf
}

// === waiting ===

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

/// Runs `f` on its own thread; panics if it has not finished within
/// `limit` (a hang fails the test instead of stalling the run). Under
/// AddressSanitizer (`cfg(pinpool_asan)`, set by build.rs), which slows
/// the pool several times over while every test of the binary runs at
/// once on the CI box's two cores, the limit is five times longer: still
/// a bound that a hang cannot pass.
pub fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let limit = if cfg!(pinpool_asan) { limit * 5 } else { limit };
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

/// Whether the state of the pool built on `faults` was freed within
/// `limit`: the state holds the fault backend's `Arc<Faults>`, so a strong
/// count of 1 means it is gone.
#[cfg(feature = "testing")]
pub fn state_freed(faults: &Arc<Faults>, limit: Duration) -> bool {
    eventually(limit, || Arc::strong_count(faults) == 1)
}

// === the process ===

/// Threads of this process (Linux: entries of `/proc/self/task`).
pub fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

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

/// Runs the test `test` of `module` (`module_path!()` where it is
/// defined) again, alone, in a child process of its own with `env` set,
/// for a test of process-wide state (the reaper thread, the global pool,
/// the process's threads or memory, what a thread start or a panic does to
/// the whole process). Returns `None` in the child, which then does the
/// test's work, and in the parent the child's output once it passed.
pub fn in_child(module: &str, test: &str, env: &[(&str, &str)]) -> Option<String> {
    const CHILD: &str = "PINPOOL_TEST_CHILD";
    // The test's name as the harness knows it: its path below the crate.
    let name = match module.split_once("::") {
        Some((_crate, path)) => format!("{path}::{test}"),
        None => test.to_owned(),
    };
    if std::env::var(CHILD).as_deref() == Ok(name.as_str()) {
        return None;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args([
            name.as_str(),
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, &name)
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
        "{name} failed in its child process ({}):\n{text}",
        out.status
    );
    Some(text)
}

// === thread exit ===

/// Runs `f` once, when the thread-local holding it is destroyed.
pub struct OnExit(pub Option<Box<dyn FnOnce()>>);

impl Drop for OnExit {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

pub mod gpu;
