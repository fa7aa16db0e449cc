//! The cleaner: re-zeroing throughput with 1-8 workers (32 buffers of 16
//! MiB, 4 of 256 MiB), and drop-to-ready latency for 4 KiB to 16 MiB
//! buffers.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pinpool::{BackendKind, PinnedBuffer, Pool};

fn pool(workers: usize) -> Pool {
    let backend = if pinpool_sim::gpu::detect().is_some() {
        BackendKind::Cuda
    } else {
        BackendKind::Host
    };
    Pool::builder()
        .backend(backend)
        .cleaner_threads(workers)
        .max_pooled_bytes(8 << 30)
        .build()
        .expect("build the pool")
}

/// Takes `count` buffers of `size` bytes, registered where the backend pins
/// (a first take / drop / flush cycle), and writes them all.
fn dirty_buffers(pool: &Pool, count: usize, size: usize) -> Vec<PinnedBuffer> {
    let mut bufs: Vec<_> = (0..count).map(|_| pool.take(size)).collect();
    for buf in &mut bufs {
        buf.fill(1);
    }
    bufs
}

/// Bytes re-zeroed per second: `count` written buffers of `size` bytes
/// dropped at once, timed until `flush` returns.
fn rezero(c: &mut Criterion, count: usize, size: usize) {
    let mut group = c.benchmark_group(format!("cleaner/rezero_{count}x{}MiB", size >> 20));
    group.sample_size(10);
    group.throughput(Throughput::Bytes((count * size) as u64));
    for workers in [1, 2, 4, 8] {
        let pool = pool(workers);
        drop(dirty_buffers(&pool, count, size));
        pool.flush();
        group.bench_with_input(BenchmarkId::from_parameter(workers), &workers, |b, _| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let bufs = dirty_buffers(&pool, count, size);
                    let t0 = Instant::now();
                    drop(bufs);
                    pool.flush();
                    total += t0.elapsed();
                }
                total
            })
        });
        assert_eq!(
            pool.stats().misses,
            count as u64,
            "every timed take should be a hit"
        );
    }
    group.finish();
}

/// 32 buffers of 16 MiB (zeroed with ordinary stores), and 4 of 256 MiB
/// (dirty prefixes of 32 MiB or more are zeroed with streaming stores,
/// which bypass the caches).
fn rezero_throughput(c: &mut Criterion) {
    rezero(c, 32, 16 << 20);
    rezero(c, 4, 256 << 20);
}

/// From the drop of one fully written buffer to `flush` returning with it
/// ready again.
fn drop_to_ready(c: &mut Criterion) {
    let pool = pool(8);
    let mut group = c.benchmark_group("cleaner/drop_to_ready");
    for size in [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20] {
        drop(pool.take(size));
        pool.flush();
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let mut buf = pool.take(size);
                    buf.fill(1);
                    let t0 = Instant::now();
                    drop(buf);
                    pool.flush();
                    total += t0.elapsed();
                }
                total
            })
        });
    }
    group.finish();
}

criterion_group!(benches, rezero_throughput, drop_to_ready);
criterion_main!(benches);
