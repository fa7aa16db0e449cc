//! The staging loop provers run, on a real GPU: each thread, with its own
//! stream, loops take / write 64 bytes / H2D copy of the buffer / drop.
//! Side by side in one run, for 1 to 16 threads and 4 KiB and 1 MiB
//! buffers:
//!
//! - `pinpool-cudarc`: the copy through cudarc's `memcpy_htod`, which
//!   records the buffer's last use by itself;
//! - `pinpool-raw`: a raw `cuMemcpyHtoDAsync` and `record_last_use`;
//! - `hand-written`: the baseline, two fixed `cuMemHostAlloc` buffers per
//!   thread with one reused event each, synchronized before reuse;
//! - `hand-cudarc`: the same loop copying through cudarc's `memcpy_htod`
//!   (its host slice records the loop's reused event), the baseline of the
//!   cudarc path: cudarc adds its own work per copy (binding the context,
//!   waiting for and recording the destination slice's events), which
//!   neither pinpool nor the raw loops pay;
//! - `cross-thread`: pinpool, taken on one thread and copied and dropped on
//!   another (pairs of threads; the figure counts buffers).
//!
//! The pinpool variants of one thread count share a fresh pool; after each
//! size, the figures of the tight loops' pools (hit rate, drop-to-ready p50
//! and p99) are printed per thread count.
//!
//! The pools take `PINPOOL_CONF` settings (e.g. `regions=on`).
//!
//! Millions of operations per second over all threads, the median of
//! `PINPOOL_BENCH_REPS` (default 3) runs of `PINPOOL_BENCH_SECS` (default
//! 0.5) seconds each. On a machine without a GPU it says so and exits 0.
//!
//! Run with `cargo bench -p pinpool-benches --bench staging` (or the staged binary with
//! `--bench`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream, HostSlice, SyncOnDrop};
use pinpool::{BackendKind, Pool};

const THREADS: [usize; 5] = [1, 2, 4, 8, 16];
const SIZES: [(usize, &str); 2] = [(4 << 10, "4KiB"), (1 << 20, "1MiB")];

fn env_f64(key: &str, default: f64) -> f64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `body(thread, stop)` on `threads` threads for `secs`; returns the
/// operations per second over all threads.
fn run(threads: usize, secs: f64, body: impl Fn(usize, &AtomicBool) -> u64 + Sync) -> f64 {
    let stop = AtomicBool::new(false);
    let start = Barrier::new(threads + 1);
    let (ops, elapsed) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (body, stop, start) = (&body, &stop, &start);
                scope.spawn(move || {
                    start.wait();
                    body(t, stop)
                })
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        let ops: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        (ops, t0.elapsed())
    });
    ops as f64 / elapsed.as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Per-thread GPU state: a stream and a device buffer.
struct Lane {
    stream: Arc<CudaStream>,
    dst: cudarc::driver::CudaSlice<u8>,
}

impl Lane {
    fn new(ctx: &Arc<CudaContext>, size: usize) -> Self {
        ctx.bind_to_thread().unwrap();
        let stream = ctx.new_stream().unwrap();
        let dst = stream.alloc_zeros::<u8>(size).unwrap();
        stream.synchronize().unwrap();
        Self { stream, dst }
    }

    fn dst_ptr(&self) -> sys::CUdeviceptr {
        use cudarc::driver::DevicePtr;
        let (ptr, _sync) = self.dst.device_ptr(&self.stream);
        ptr
    }
}

fn pinpool_cudarc(pool: &Pool, ctx: &Arc<CudaContext>, size: usize, stop: &AtomicBool) -> u64 {
    let mut lane = Lane::new(ctx, size);
    let mut ops = 0;
    while !stop.load(Ordering::Relaxed) {
        let mut buf = pool.take(size);
        buf[..64].fill(1);
        buf.set_dirty_len(64);
        lane.stream.memcpy_htod(&buf, &mut lane.dst).unwrap();
        drop(buf);
        ops += 1;
    }
    lane.stream.synchronize().unwrap();
    ops
}

fn pinpool_raw(pool: &Pool, ctx: &Arc<CudaContext>, size: usize, stop: &AtomicBool) -> u64 {
    let lane = Lane::new(ctx, size);
    let dst = lane.dst_ptr();
    let mut ops = 0;
    while !stop.load(Ordering::Relaxed) {
        let mut buf = pool.take(size);
        buf[..64].fill(1);
        buf.set_dirty_len(64);
        // SAFETY: `dst` holds `size` bytes; the buffer stays alive until its
        // recorded event completes (the pool waits on it).
        unsafe { result::memcpy_htod_async(dst, &buf[..size], lane.stream.cu_stream()) }.unwrap();
        buf.record_last_use(&lane.stream).unwrap();
        drop(buf);
        ops += 1;
    }
    lane.stream.synchronize().unwrap();
    ops
}

fn hand_written(ctx: &Arc<CudaContext>, size: usize, stop: &AtomicBool) -> u64 {
    let lane = Lane::new(ctx, size);
    let dst = lane.dst_ptr();
    let stream = lane.stream.cu_stream();
    // SAFETY: a context is bound (see `Lane::new`); freed below.
    let bufs: Vec<*mut u8> = (0..2)
        .map(|_| unsafe { result::malloc_host(size, 0) }.unwrap() as *mut u8)
        .collect();
    let events: Vec<sys::CUevent> = (0..2)
        .map(|_| result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).unwrap())
        .collect();
    let mut ops = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let i = (ops % 2) as usize;
        // SAFETY: live events, buffers of `size` bytes, a live stream; each
        // buffer is reused only after its event (recorded after its last
        // copy) has completed.
        unsafe {
            result::event::synchronize(events[i]).unwrap();
            std::ptr::write_bytes(bufs[i], 1, 64);
            let src = std::slice::from_raw_parts(bufs[i], size);
            result::memcpy_htod_async(dst, src, stream).unwrap();
            result::event::record(events[i], stream).unwrap();
        }
        ops += 1;
    }
    lane.stream.synchronize().unwrap();
    // SAFETY: no copy is in flight (the stream was synchronized).
    unsafe {
        for e in events {
            result::event::destroy(e).unwrap();
        }
        for b in bufs {
            result::free_host(b.cast()).unwrap();
        }
    }
    ops
}

/// Even threads take and hand over; odd threads copy and drop.
fn cross_thread(
    pool: &Pool,
    ctx: &Arc<CudaContext>,
    size: usize,
    threads: usize,
    secs: f64,
) -> f64 {
    let pairs = (threads / 2).max(1);
    let channels: Vec<_> = (0..pairs)
        .map(|_| crossbeam_channel::bounded::<pinpool::PinnedBuffer>(64))
        .collect();
    run(pairs * 2, secs, |t, stop| {
        let (tx, rx) = &channels[t / 2];
        if t % 2 == 0 {
            ctx.bind_to_thread().unwrap();
            while !stop.load(Ordering::Relaxed) {
                let mut buf = pool.take(size);
                buf[..64].fill(1);
                buf.set_dirty_len(64);
                if tx.send_timeout(buf, Duration::from_millis(10)).is_err() {
                    continue;
                }
            }
            0
        } else {
            let lane = Lane::new(ctx, size);
            let dst = lane.dst_ptr();
            let mut ops = 0;
            loop {
                match rx.recv_timeout(Duration::from_millis(10)) {
                    Ok(mut buf) => {
                        // SAFETY: as in `pinpool_raw`.
                        unsafe {
                            result::memcpy_htod_async(dst, &buf[..size], lane.stream.cu_stream())
                        }
                        .unwrap();
                        buf.record_last_use(&lane.stream).unwrap();
                        drop(buf);
                        ops += 1;
                    }
                    Err(_) if stop.load(Ordering::Relaxed) => break,
                    Err(_) => {}
                }
            }
            lane.stream.synchronize().unwrap();
            ops
        }
    })
}

/// A `cuMemHostAlloc` buffer whose copies through cudarc record `event`.
struct HandPinned {
    ptr: *mut u8,
    len: usize,
    event: CudaEvent,
}

impl HostSlice<u8> for HandPinned {
    fn len(&self) -> usize {
        self.len
    }

    unsafe fn stream_synced_slice<'a>(
        &'a self,
        stream: &'a CudaStream,
    ) -> (&'a [u8], SyncOnDrop<'a>) {
        // SAFETY: `ptr` holds `len` bytes for the buffer's life; the loop
        // writes it only after `event` (recorded after the copy) completed.
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr, self.len) };
        (bytes, SyncOnDrop::Record(Some((&self.event, stream))))
    }

    unsafe fn stream_synced_mut_slice<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (&'a mut [u8], SyncOnDrop<'a>) {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        let bytes = unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) };
        (bytes, SyncOnDrop::Record(Some((&self.event, stream))))
    }
}

fn hand_cudarc(ctx: &Arc<CudaContext>, size: usize, stop: &AtomicBool) -> u64 {
    let mut lane = Lane::new(ctx, size);
    let bufs: Vec<HandPinned> = (0..2)
        .map(|_| HandPinned {
            // SAFETY: a context is bound (see `Lane::new`); freed below.
            ptr: unsafe { result::malloc_host(size, 0) }.unwrap() as *mut u8,
            len: size,
            event: ctx.new_event(None).unwrap(),
        })
        .collect();
    let mut ops = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let buf = &bufs[(ops % 2) as usize];
        buf.event.synchronize().unwrap();
        // SAFETY: the buffer's last copy has completed (its event above).
        unsafe { std::ptr::write_bytes(buf.ptr, 1, 64) };
        lane.stream.memcpy_htod(buf, &mut lane.dst).unwrap();
        ops += 1;
    }
    lane.stream.synchronize().unwrap();
    for buf in bufs {
        // SAFETY: no copy is in flight (the stream was synchronized).
        unsafe { result::free_host(buf.ptr.cast()) }.unwrap();
    }
    ops
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        // `cargo test` runs bench targets with no arguments: nothing to do.
        return;
    }
    // SAFETY: only tries to load the driver library.
    let present = unsafe { sys::is_culib_present() };
    let ctx = present.then(|| CudaContext::new(0).ok()).flatten();
    let Some(ctx) = ctx else {
        println!("staging: no GPU on this machine; the staging benchmark measures pinned copies and has nothing to run");
        return;
    };
    let secs = env_f64("PINPOOL_BENCH_SECS", 0.5);
    let reps = env_f64("PINPOOL_BENCH_REPS", 3.0) as usize;
    let new_pool = |size: usize| {
        let pool = Pool::builder()
            .backend(BackendKind::Cuda)
            .from_env()
            .build()
            .expect("the CUDA backend builds on a GPU machine");
        // Warm the pool: enough pinned buffers for the widest run.
        let warm: Vec<_> = (0..64).map(|_| pool.take(size)).collect();
        drop(warm);
        pool.flush();
        // The warm-up's first registrations are not the loops' figures.
        pool.reset_peaks();
        pool
    };
    println!(
        "staging: {}, median of {reps} runs of {secs} s; M ops/s over all threads",
        ctx.name().unwrap_or_default()
    );
    for (size, label) in SIZES {
        println!("\n{label}: threads | pinpool-cudarc | pinpool-raw | hand-written | hand-cudarc | cross-thread | cudarc/hand | raw/hand | cudarc/hand-cudarc");
        let mut tight = Vec::new();
        for threads in THREADS {
            let measure = |f: &dyn Fn() -> f64| median((0..reps).map(|_| f()).collect()) / 1e6;
            // A fresh pool per thread count for the tight loops, so that its
            // drop-to-ready figures are theirs alone.
            let pool = new_pool(size);
            let warm = pool.stats();
            let cudarc_path = measure(&|| {
                run(threads, secs, |_, stop| {
                    pinpool_cudarc(&pool, &ctx, size, stop)
                })
            });
            let raw = measure(&|| {
                run(threads, secs, |_, stop| {
                    pinpool_raw(&pool, &ctx, size, stop)
                })
            });
            pool.flush();
            tight.push((threads, warm, pool.stats()));
            let hand = measure(&|| run(threads, secs, |_, stop| hand_written(&ctx, size, stop)));
            let hand_cu = measure(&|| run(threads, secs, |_, stop| hand_cudarc(&ctx, size, stop)));
            let cross = measure(&|| cross_thread(&pool, &ctx, size, threads, secs));
            println!(
                "{label}: {threads:>7} | {cudarc_path:>14.4} | {raw:>11.4} | {hand:>12.4} | {hand_cu:>11.4} | {cross:>12.4} | {:>11.3} | {:>8.3} | {:>18.3}",
                cudarc_path / hand,
                raw / hand,
                cudarc_path / hand_cu
            );
            pool.shutdown();
        }
        for (threads, warm, s) in tight {
            let registrations = s.registrations - warm.registrations;
            let registering = s.registration_time - warm.registration_time;
            println!(
                "{label}: {threads:>2} threads, tight loops: hit rate {:.5} ({} misses), drop-to-ready p50 {:?} p99 {:?}, {} re-zeroed by their owners, {} by the cleaner, {} registrations in the loops taking {:?} on average",
                s.hit_rate(),
                s.misses,
                s.drop_to_ready_p50,
                s.drop_to_ready_p99,
                s.cleaned_by_takers,
                s.recycled - s.cleaned_by_takers,
                registrations,
                registering / (registrations.max(1) as u32)
            );
        }
    }
}
