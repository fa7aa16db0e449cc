//! Take + drop of a ready buffer (a thread-cache hit) at 1-16 threads:
//! pinpool against the seed design and a fresh allocation per take, with
//! take and drop latency on one thread.
//!
//! Each thread loops take / write 64 bytes / drop. Throughput is reported
//! as operations per second over all threads.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pinpool::{BackendKind, Pool};
use pinpool_sim::seed::SeedPool;

const SIZE: usize = 4096;
const THREADS: [usize; 5] = [1, 2, 4, 8, 16];

fn pool() -> Pool {
    let backend = if pinpool_sim::gpu::detect().is_some() {
        BackendKind::Cuda
    } else {
        BackendKind::Host
    };
    Pool::builder()
        .backend(backend)
        .build()
        .expect("build the pool")
}

/// Runs `op` `iters` times on each of `threads` threads; returns the wall
/// time from a common start to the last thread's end.
fn on_threads(threads: usize, iters: u64, op: impl Fn() + Sync) -> Duration {
    let start = Barrier::new(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    start.wait();
                    let t0 = Instant::now();
                    for _ in 0..iters {
                        op();
                    }
                    t0.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .max()
            .unwrap()
    })
}

fn take_drop(c: &mut Criterion) {
    take_drop_sized(c, SIZE, "4KiB", &THREADS);
    take_drop_sized(c, 1 << 20, "1MiB", &[16]);
}

/// The take / write 64 bytes / drop loop on `size`-byte buffers.
fn take_drop_sized(c: &mut Criterion, size: usize, label: &str, thread_counts: &[usize]) {
    let pinpool = pool();
    let seed = SeedPool::new(pinpool_sim::gpu::detect());
    let mut group = c.benchmark_group(format!("hot_path/take_drop_{label}"));
    group.measurement_time(Duration::from_secs(3));
    for &threads in thread_counts {
        group.throughput(Throughput::Elements(threads as u64));
        group.bench_with_input(BenchmarkId::new("pinpool", threads), &threads, |b, &t| {
            b.iter_custom(|iters| {
                on_threads(t, iters, || {
                    let mut buf = pinpool.take(size);
                    buf[..64].fill(1);
                    buf.set_dirty_len(64);
                    drop(black_box(buf));
                })
            })
        });
        group.bench_with_input(BenchmarkId::new("seed", threads), &threads, |b, &t| {
            b.iter_custom(|iters| {
                on_threads(t, iters, || {
                    let mut buf = seed.take(0, size);
                    buf.bytes()[..64].fill(1);
                    buf.set_dirty_len(64);
                    drop(black_box(buf));
                })
            })
        });
        group.bench_with_input(
            BenchmarkId::new("fresh_alloc", threads),
            &threads,
            |b, &t| {
                b.iter_custom(|iters| {
                    on_threads(t, iters, || {
                        let mut buf = vec![0u8; size];
                        buf[..64].fill(1);
                        drop(black_box(buf));
                    })
                })
            },
        );
    }
    group.finish();
    let s = pinpool.stats();
    eprintln!(
        "pinpool after hot_path: hit rate {:.4}, drop-to-ready p99 {:?}",
        s.hit_rate(),
        s.drop_to_ready_p99
    );
    let s = seed.stats();
    eprintln!(
        "seed after hot_path: hit rate {:.4}",
        s.hits as f64 / (s.hits + s.misses).max(1) as f64
    );
    seed.shutdown();
}

/// Take latency and drop latency of a ready buffer on one thread, timed
/// apart.
fn latency(c: &mut Criterion) {
    let pool = pool();
    drop(pool.take(SIZE));
    pool.flush();
    let mut group = c.benchmark_group("hot_path/latency_4KiB");
    group.bench_function("take", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t0 = Instant::now();
                let buf = black_box(pool.take(SIZE));
                total += t0.elapsed();
                drop(buf);
            }
            total
        })
    });
    group.bench_function("drop", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let mut buf = pool.take(SIZE);
                buf.set_dirty_len(64);
                let t0 = Instant::now();
                drop(black_box(buf));
                total += t0.elapsed();
            }
            total
        })
    });
    group.finish();
}

criterion_group!(benches, take_drop, latency);
criterion_main!(benches);
