//! Take + drop of a ready buffer (a thread-cache hit) at 1-16 threads:
//! pinpool against the seed design and a fresh allocation per take, with
//! take and drop latency on one thread.
//!
//! Each thread loops take / write 64 bytes / drop. Throughput is reported
//! as operations per second over all threads.
//!
//! The loop records no events, so on the CUDA backend every recycled
//! buffer waits for a device synchronize (the documented fallback) and the
//! loop measures synchronizes, not the pool. It therefore runs on the host
//! backend unless `PINPOOL_BENCH_BACKEND=cuda` is set (the seed design then
//! registers its buffers too).

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pinpool::{BackendKind, Pool};
use pinpool_sim::seed::SeedPool;

const SIZE: usize = 4096;
const THREADS: [usize; 5] = [1, 2, 4, 8, 16];

/// Whether to run on the CUDA backend (see the module docs).
fn cuda() -> bool {
    std::env::var("PINPOOL_BENCH_BACKEND").is_ok_and(|v| v == "cuda")
}

fn pool() -> Pool {
    let backend = if cuda() {
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
    let seed = SeedPool::new(if cuda() {
        pinpool_sim::gpu::detect()
    } else {
        None
    });
    let mut group = c.benchmark_group(format!("hot_path/take_drop_{label}"));
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
        "{label}: pinpool hit rate {:.4} over {} takes, {} misses, {} in the cleaner, drop-to-ready p99 {:?}, {} of {} recycled by takers",
        s.hit_rate(),
        s.hits + s.misses,
        s.misses,
        s.in_cleaner,
        s.drop_to_ready_p99,
        s.cleaned_by_takers,
        s.recycled
    );
    let s = seed.stats();
    let mut ready = s.ready_latency.clone();
    ready.sort();
    eprintln!(
        "{label}: seed hit rate {:.4} over {} takes, drop-to-ready p99 {:?}",
        s.hits as f64 / (s.hits + s.misses).max(1) as f64,
        s.hits + s.misses,
        ready.get(ready.len().saturating_sub(1) * 99 / 100)
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

/// The single-thread loop with and without a TRACE-level subscriber: the
/// take/drop fast path emits nothing, so the two should match.
fn tracing_cost(c: &mut Criterion) {
    let pool = pool();
    drop(pool.take(SIZE));
    pool.flush();
    let op = || {
        let mut buf = pool.take(SIZE);
        buf[..64].fill(1);
        buf.set_dirty_len(64);
        drop(black_box(buf));
    };
    let mut group = c.benchmark_group("hot_path/tracing_4KiB");
    group.bench_function("no_subscriber", |b| b.iter(op));
    group.bench_function("trace_subscriber", |b| {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(std::io::sink)
            .finish();
        tracing::subscriber::with_default(subscriber, || b.iter(op));
    });
    group.finish();
}

criterion_group!(benches, take_drop, latency, tracing_cost);
criterion_main!(benches);
