//! First pinning of a 1 GiB pool miss (GPU only): pinpool's path (parallel
//! touch on huge pages, then one registration, by the cleaner) against the
//! seed's path (one registration of untouched pageable memory) and
//! `cuMemHostAlloc`.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use cudarc::driver::{result, sys};
use pinpool::{BackendKind, Pool};

const SIZE: usize = 1 << 30;

fn first_pin(c: &mut Criterion) {
    let Some(gpu) = pinpool_sim::gpu::detect() else {
        eprintln!("first_pin: skipped, no GPU");
        return;
    };
    gpu[0].bind_to_thread().unwrap();
    let mut group = c.benchmark_group("first_pin/1GiB");
    group.sample_size(10);
    group.bench_function("pinpool_8_workers", |b| {
        let pool = Pool::builder()
            .backend(BackendKind::Cuda)
            .cleaner_threads(8)
            .build()
            .unwrap();
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let mut buf = pool.take(SIZE);
                assert!(!buf.was_pooled());
                buf[..SIZE / 4].fill(1);
                buf.set_dirty_len(SIZE / 4);
                let t0 = Instant::now();
                drop(buf);
                pool.flush();
                total += t0.elapsed();
                pool.clear();
            }
            total
        })
    });
    group.bench_function("register_untouched", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let mut mem = vec![0u8; SIZE];
                let t0 = Instant::now();
                // SAFETY: `mem` is live and unregistered before it is freed.
                unsafe {
                    sys::cuMemHostRegister_v2(
                        mem.as_mut_ptr().cast(),
                        SIZE,
                        sys::CU_MEMHOSTREGISTER_PORTABLE,
                    )
                }
                .result()
                .unwrap();
                total += t0.elapsed();
                // SAFETY: registered just above; nothing copies from it.
                unsafe { sys::cuMemHostUnregister(mem.as_mut_ptr().cast()) }
                    .result()
                    .unwrap();
            }
            total
        })
    });
    group.bench_function("cu_mem_host_alloc", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t0 = Instant::now();
                // SAFETY: freed below; a context is bound.
                let ptr =
                    unsafe { result::malloc_host(SIZE, sys::CU_MEMHOSTALLOC_PORTABLE) }.unwrap();
                total += t0.elapsed();
                // SAFETY: allocated just above, unused.
                unsafe { result::free_host(ptr) }.unwrap();
            }
            total
        })
    });
    group.finish();
}

criterion_group!(benches, first_pin);
criterion_main!(benches);
