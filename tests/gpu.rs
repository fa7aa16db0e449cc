//! The CUDA backend on real hardware. Every test is `#[ignore]`d: run them
//! on a GPU machine with `--ignored` (or `--include-ignored`), one at a
//! time (`--test-threads=1`) so the bandwidth figures are not disturbed;
//! [`gpu`] makes them take turns anyway (see `Gpu` for why they must).
//! Asked to run without a GPU, they fail loudly. The tests that need two
//! GPUs are in `multi_gpu.rs`.

use std::ffi::c_void;
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys, CudaStream};
use pinpool::{BackendKind, Pool};

mod common;
use common::gpu::*;

#[test]
#[ignore = "needs a GPU"]
fn auto_picks_cuda_and_regions_register() {
    let _ctx = gpu();
    let pool = Pool::builder().build().unwrap();
    assert_eq!(pool.backend(), BackendKind::Cuda);
    let mut region = vec![1u8; 1 << 20];
    // SAFETY: `region` stays alive and unmoved until unregistered below.
    assert!(unsafe { pool.register_region(region.as_mut_ptr(), region.len()) });
    let mut flags = 0;
    // SAFETY: valid out-pointer; the region is registered.
    unsafe { sys::cuMemHostGetFlags(&mut flags, region.as_mut_ptr().cast()) }
        .result()
        .expect("a registered region is known to the driver");
    // SAFETY: registered above; no copy reads it.
    unsafe { pool.unregister_region(region.as_mut_ptr()) };
    let mut flags = 0;
    // SAFETY: as above.
    let after = unsafe { sys::cuMemHostGetFlags(&mut flags, region.as_mut_ptr().cast()) }.result();
    assert!(after.is_err(), "the region should no longer be registered");
}

#[test]
#[ignore = "needs a GPU"]
fn pool_hit_is_page_locked_and_portable() {
    let _ctx = gpu();
    let pool = cuda_pool();
    for size in [4096, 1 << 20, 64 << 20] {
        let miss = pool.take(size);
        assert!(!miss.is_pinned(), "a miss is pageable");
        drop(miss);
        pool.flush();
        let buf = pool.take(size);
        assert!(buf.is_pinned());
        let mut flags = 0;
        // SAFETY: valid out-pointer; `buf` is live.
        unsafe { sys::cuMemHostGetFlags(&mut flags, buf.as_ptr() as *mut c_void) }
            .result()
            .expect("the driver knows a pool hit as page-locked");
        assert_ne!(
            flags & sys::CU_MEMHOSTALLOC_PORTABLE,
            0,
            "registered without the portable flag"
        );
    }
    let stats = pool.stats();
    assert_eq!(stats.registrations, 3);
    assert_eq!(stats.registration_failures, 0);
    pool.shutdown();
}

/// Median H2D bandwidth in GB/s of `runs` copies of `src` on `stream`.
fn h2d_gbps(stream: &CudaStream, dst: &DeviceBytes, src: &[u8], runs: usize) -> f64 {
    let ctx = stream.context();
    let mut rates = Vec::new();
    for _ in 0..runs {
        let start = ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .unwrap();
        let end = ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .unwrap();
        start.record(stream).unwrap();
        copy_async(stream, dst, src);
        end.record(stream).unwrap();
        let ms = start.elapsed_ms(&end).unwrap() as f64;
        rates.push(src.len() as f64 / (ms / 1e3) / 1e9);
    }
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

#[test]
#[ignore = "needs a GPU"]
fn h2d_from_pooled_buffer_matches_cu_mem_host_alloc() {
    const SIZE: usize = 256 << 20;
    let ctx = gpu();
    let stream = ctx.new_stream().unwrap();
    let pool = cuda_pool();
    let dst = DeviceBytes::new(SIZE);
    let mut pooled = pinned(&pool, SIZE);
    pooled.fill(3);
    // SAFETY: freed below with `free_host`; a context is current.
    let host = unsafe { result::malloc_host(SIZE, 0) }.expect("cuMemHostAlloc") as *mut u8;
    // SAFETY: `host` holds SIZE bytes, written before being read.
    let host_slice = unsafe {
        std::ptr::write_bytes(host, 3, SIZE);
        std::slice::from_raw_parts(host, SIZE)
    };
    let mut pageable = vec![3u8; SIZE];
    pageable[0] = 4;
    // Interleave to share whatever the machine is doing.
    let mut pool_rate = Vec::new();
    let mut alloc_rate = Vec::new();
    let mut pageable_rate = Vec::new();
    for _ in 0..5 {
        pool_rate.push(h2d_gbps(&stream, &dst, &pooled, 3));
        alloc_rate.push(h2d_gbps(&stream, &dst, host_slice, 3));
        pageable_rate.push(h2d_gbps(&stream, &dst, &pageable, 1));
    }
    stream.synchronize().unwrap();
    // SAFETY: allocated above by `malloc_host`; no copy is in flight.
    unsafe { result::free_host(host.cast()) }.unwrap();
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (p, a, g) = (
        median(&mut pool_rate),
        median(&mut alloc_rate),
        median(&mut pageable_rate),
    );
    println!("H2D 256 MiB: pooled {p:.1} GB/s, cuMemHostAlloc {a:.1} GB/s, pageable {g:.1} GB/s, pooled/alloc {:.3}", p / a);
    assert!(
        p >= 0.95 * a,
        "pooled {p:.1} GB/s is below 95% of cuMemHostAlloc's {a:.1} GB/s"
    );
    drop(pooled);
    pool.shutdown();
}

/// Writes `pattern`, copies it behind a closed gate, drops the buffer
/// (after recording its last use if `record`), and checks the buffer is not
/// recycled until the gate opens and the copy lands.
fn in_flight_copy_gates_reuse(record: bool) {
    const SIZE: usize = 8 << 20;
    let ctx = gpu();
    let stream = ctx.new_stream().unwrap();
    let pool = cuda_pool();
    let dst = DeviceBytes::new(SIZE);
    let mut buf = pinned(&pool, SIZE);
    let ptr = buf.as_ptr() as usize;
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i % 251) as u8 + 1;
    }
    let expected = buf.to_vec();
    let recycled_before = pool.stats().recycled;
    let gate = Gate::close(&stream);
    copy_async(&stream, &dst, &buf);
    if record {
        buf.record_last_use(&stream).unwrap();
    }
    drop(buf);
    let flushed = flush_in_background(&pool);
    assert!(
        flushed.recv_timeout(Duration::from_millis(300)).is_err(),
        "flush returned while the copy was still held"
    );
    assert_eq!(
        pool.stats().recycled,
        recycled_before,
        "recycled while the copy was in flight"
    );
    assert_eq!(pool.stats().pooled_buffers, 0);
    gate.open();
    flushed
        .recv_timeout(Duration::from_secs(10))
        .expect("flush returns once the copy lands");
    assert!(
        dst.read() == expected,
        "the device must hold the written bytes, not zeros"
    );
    let again = pool.take(SIZE);
    assert_eq!(
        again.as_ptr() as usize,
        ptr,
        "the buffer came back to the pool"
    );
    assert!(again.iter().all(|&b| b == 0));
    drop(again);
    pool.shutdown();
}

#[test]
#[ignore = "needs a GPU"]
fn recorded_event_gates_reuse() {
    in_flight_copy_gates_reuse(true);
}

#[test]
#[ignore = "needs a GPU"]
fn without_event_device_sync_gates_reuse() {
    in_flight_copy_gates_reuse(false);
}

#[test]
#[ignore = "needs a GPU"]
fn first_pinning_of_a_1_gib_miss() {
    const SIZE: usize = 1 << 30;
    let _ctx = gpu();
    let pool = Pool::builder()
        .backend(BackendKind::Cuda)
        .regions(false)
        .cleaner_threads(8)
        .build()
        .unwrap();
    let mut buf = pool.take(SIZE);
    assert!(!buf.is_pinned());
    buf[..SIZE / 4].fill(1);
    buf.set_dirty_len(SIZE / 4);
    let started = Instant::now();
    drop(buf);
    pool.flush();
    let ready = started.elapsed();
    let stats = pool.stats();
    println!(
        "1 GiB miss: drop-to-ready {:.3} s (register call {:.3} s), 8 workers",
        ready.as_secs_f64(),
        stats.registration_time.as_secs_f64()
    );
    assert_eq!(stats.registrations, 1);
    let buf = pool.take(SIZE);
    assert!(buf.is_pinned());
    assert!(buf[..SIZE / 4].iter().all(|&b| b == 0));
    drop(buf);
    pool.shutdown();
}

#[test]
#[ignore = "needs a GPU"]
fn cudarc_copies_record_last_use_by_themselves() {
    const SIZE: usize = 4 << 20;
    let ctx = gpu();
    let stream = ctx.new_stream().unwrap();
    let pool = cuda_pool();
    let mut dst = stream.alloc_zeros::<u8>(SIZE).unwrap();
    let mut dst32 = stream.alloc_zeros::<u32>(SIZE / 4).unwrap();
    stream.synchronize().unwrap();
    let mut buf = pinned(&pool, SIZE);
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i % 253) as u8 + 1;
    }
    let expected = buf.to_vec();
    let expected32: Vec<u32> = buf.typed::<u32>().to_vec();
    let gate = Gate::close(&stream);
    stream.memcpy_htod(&buf, &mut dst).unwrap();
    stream.memcpy_htod(&buf.typed::<u32>(), &mut dst32).unwrap();
    drop(buf); // no record_last_use: the copies recorded it
    let flushed = flush_in_background(&pool);
    assert!(
        flushed.recv_timeout(Duration::from_millis(300)).is_err(),
        "recycled while cudarc's copies were held"
    );
    gate.open();
    flushed
        .recv_timeout(Duration::from_secs(10))
        .expect("flush returns once the copies land");
    assert!(
        stream.clone_dtoh(&dst).unwrap() == expected,
        "the byte copy read zeros"
    );
    assert!(
        stream.clone_dtoh(&dst32).unwrap() == expected32,
        "the typed copy read zeros"
    );
    pool.shutdown();
}

/// The README's staging pattern with a size that is not a class size: a
/// typed prefix of exactly the rows is what cudarc copies (the whole buffer
/// would be longer than the device slice), it records the last use like the
/// whole buffer, and a device-to-host copy into a byte prefix widens the
/// dirty length so the next taker still gets zeros.
#[test]
#[ignore = "needs a GPU"]
fn prefix_copies_of_a_size_that_is_not_a_class_size() {
    const ROWS: usize = 250_007; // 1_000_028 bytes: the class is longer
    let ctx = gpu();
    let stream = ctx.new_stream().unwrap();
    let pool = cuda_pool();
    let rows: Vec<u32> = (0..ROWS as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let mut dst = stream.alloc_zeros::<u32>(ROWS).unwrap();
    stream.synchronize().unwrap();
    let mut buf = pinned(&pool, ROWS * 4);
    assert!(buf.len() > ROWS * 4, "the test needs a rounded-up class");
    buf.typed_prefix_mut::<u32>(ROWS).copy_from_slice(&rows);
    let gate = Gate::close(&stream);
    stream
        .memcpy_htod(&buf.typed_prefix::<u32>(ROWS), &mut dst)
        .unwrap();
    // Reading the buffer (its address here) need not wait for an upload
    // from it: this returns while the copy is still held.
    let ptr = buf.as_ptr() as usize;
    drop(buf); // the prefix's copy recorded the last use
    let flushed = flush_in_background(&pool);
    assert!(
        flushed.recv_timeout(Duration::from_millis(300)).is_err(),
        "recycled while the prefix's copy was held"
    );
    gate.open();
    flushed.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(
        stream.clone_dtoh(&dst).unwrap() == rows,
        "the device got other rows"
    );

    let mut buf = pool.take(ROWS * 4);
    assert_eq!(buf.as_ptr() as usize, ptr);
    buf.set_dirty_len(0);
    let len = ROWS * 4;
    let src = stream.clone_htod(&vec![9u8; len]).unwrap();
    stream.memcpy_dtoh(&src, &mut buf.prefix_mut(len)).unwrap();
    drop(buf);
    pool.flush();
    let again = pool.take(ROWS * 4);
    assert_eq!(again.as_ptr() as usize, ptr);
    assert!(
        again.iter().all(|&b| b == 0),
        "bytes copied into the prefix leaked to the next taker"
    );
    drop(again);
    pool.shutdown();
}

/// A copy through cudarc on one stream, while another stream of the same
/// device is held: the buffer must come back once its own copy is done. A
/// buffer whose copies were not recorded would fall back to a whole-device
/// synchronize and wait for the held stream.
#[test]
#[ignore = "needs a GPU"]
fn cudarc_copies_wait_for_their_own_stream_only() {
    const SIZE: usize = 1 << 20;
    let ctx = gpu();
    let held = ctx.new_stream().unwrap();
    let copying = ctx.new_stream().unwrap();
    let pool = cuda_pool();
    let mut dst = copying.alloc_zeros::<u8>(SIZE).unwrap();
    copying.synchronize().unwrap();
    let mut buf = pinned(&pool, SIZE);
    buf.fill(5);
    let gate = Gate::close(&held);
    copying.memcpy_htod(&buf, &mut dst).unwrap();
    drop(buf);
    let flushed = flush_in_background(&pool);
    let back = flushed.recv_timeout(Duration::from_secs(5));
    gate.open();
    back.expect("the buffer waited for an unrelated stream: its copy's event was not recorded");
    assert!(copying.clone_dtoh(&dst).unwrap().iter().all(|&b| b == 5));
    held.synchronize().unwrap();
    pool.shutdown();
}

/// Opens `gate` after `delay`, on another thread.
fn open_later(gate: Gate, delay: Duration) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        gate.open();
    })
}

/// Host access through `DerefMut` right after a cudarc H2D copy waits for
/// the copy: the device receives the bytes written before the copy, not
/// the ones written after.
#[test]
#[ignore = "needs a GPU"]
fn host_write_after_a_cudarc_copy_waits_for_it() {
    const SIZE: usize = 1 << 20;
    let ctx = gpu();
    let stream = ctx.new_stream().unwrap();
    let pool = cuda_pool();
    let mut dst = stream.alloc_zeros::<u8>(SIZE).unwrap();
    stream.synchronize().unwrap();
    let mut buf = pinned(&pool, SIZE);
    buf.fill(7);
    let gate = Gate::close(&stream);
    stream.memcpy_htod(&buf, &mut dst).unwrap();
    let opener = open_later(gate, Duration::from_millis(300));
    let started = Instant::now();
    buf.fill(9); // must wait for the copy to have read the 7s
    let waited = started.elapsed();
    opener.join().unwrap();
    assert!(
        stream.clone_dtoh(&dst).unwrap().iter().all(|&b| b == 7),
        "the host write raced the DMA reading the buffer (waited {waited:?})"
    );
    drop(buf);
    pool.shutdown();
}

/// Host reads after a cudarc D2H copy into the buffer wait for the copy.
#[test]
#[ignore = "needs a GPU"]
fn host_read_after_a_cudarc_copy_into_the_buffer_waits_for_it() {
    const SIZE: usize = 1 << 20;
    let ctx = gpu();
    let stream = ctx.new_stream().unwrap();
    let pool = cuda_pool();
    let src = stream.clone_htod(&vec![5u8; SIZE]).unwrap();
    stream.synchronize().unwrap();
    let mut buf = pinned(&pool, SIZE);
    let gate = Gate::close(&stream);
    stream.memcpy_dtoh(&src, &mut buf).unwrap();
    let opener = open_later(gate, Duration::from_millis(300));
    let seen = buf[SIZE - 1];
    opener.join().unwrap();
    assert_eq!(
        seen, 5,
        "a host read saw the buffer before the copy wrote it"
    );
    drop(buf);
    pool.shutdown();
}

/// A device-to-host copy into a buffer whose dirty length was narrowed
/// widens it: the next taker gets zeros, not the copied bytes.
#[test]
#[ignore = "needs a GPU"]
fn copy_into_the_buffer_widens_its_dirty_length() {
    const SIZE: usize = 1 << 20;
    let ctx = gpu();
    let stream = ctx.new_stream().unwrap();
    let pool = cuda_pool();
    let src = stream.clone_htod(&vec![6u8; SIZE]).unwrap();
    stream.synchronize().unwrap();
    let mut buf = pinned(&pool, SIZE);
    let ptr = buf.as_ptr() as usize;
    buf.set_dirty_len(0);
    stream.memcpy_dtoh(&src, &mut buf).unwrap();
    drop(buf);
    pool.flush();
    let again = pool.take(SIZE);
    assert_eq!(again.as_ptr() as usize, ptr);
    assert!(
        again.iter().all(|&b| b == 0),
        "bytes copied into the buffer leaked to the next taker"
    );
    drop(again);
    pool.shutdown();
}

/// A cudarc copy on the default stream while another thread drops the
/// context's last extra stream: cudarc then skips the event it was handed,
/// so the pool must not depend on cudarc recording it.
#[test]
#[ignore = "needs a GPU"]
fn copy_whose_event_cudarc_skips_still_gates_reuse() {
    const SIZE: usize = 1 << 20;
    let ctx = gpu();
    let pool = cuda_pool();
    let default = ctx.default_stream();
    let dst = DeviceBytes::new(SIZE);
    let mut buf = pinned(&pool, SIZE);
    buf.fill(4);
    let extra = ctx.new_stream().unwrap(); // the context is in multi-stream mode
    let gate = Gate::close(&default);
    let opener;
    {
        // What `memcpy_htod` does, with the extra stream dropped between
        // taking the slice and enqueueing the copy.
        // SAFETY: the slice is used for one copy on `default`, and the
        // returned guard is dropped after it was enqueued.
        let (slice, guard) =
            unsafe { cudarc::driver::HostSlice::stream_synced_slice(&buf, &default) };
        drop(extra);
        copy_async(&default, &dst, slice);
        opener = open_later(gate, Duration::from_millis(300));
        drop(guard);
    }
    drop(buf);
    pool.flush();
    opener.join().unwrap();
    default.synchronize().unwrap();
    assert!(
        dst.read().iter().all(|&b| b == 4),
        "the buffer was re-zeroed while the copy was still reading it"
    );
    pool.shutdown();
}

/// No pool call leaves the caller's current CUDA context changed, even
/// when it waits on (or releases) events of another context.
#[test]
#[ignore = "needs a GPU"]
fn pool_calls_leave_the_current_context_alone() {
    const SIZE: usize = 64 << 10;
    let ctx = gpu();
    let stream = ctx.new_stream().unwrap();
    let pool = cuda_pool();
    let dst = DeviceBytes::new(SIZE);
    // A context of our own, not the primary one the pool's events use.
    let mut own: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; device 0 exists (see `gpu`).
    unsafe { sys::cuCtxCreate_v2(&mut own, 0, 0) }
        .result()
        .expect("cuCtxCreate");
    let current = || {
        result::ctx::get_current()
            .unwrap()
            .unwrap_or(std::ptr::null_mut())
    };
    for round in 0..3 {
        ctx.bind_to_thread().unwrap();
        let mut buf = pool.take(SIZE);
        buf[..64].fill(1);
        buf.set_dirty_len(64);
        copy_async(&stream, &dst, &buf[..64]);
        buf.record_last_use(&stream).unwrap();
        drop(buf);
        stream.synchronize().unwrap();
        // SAFETY: `own` is a live context created above.
        unsafe { result::ctx::set_current(own) }.unwrap();
        let again = pool.take(SIZE); // may re-zero the buffer, releasing its event
        assert_eq!(
            current(),
            own,
            "take changed the current context (round {round})"
        );
        drop(again);
        assert_eq!(current(), own, "drop changed the current context");
        pool.flush();
        assert_eq!(current(), own, "flush changed the current context");
    }
    pool.shutdown();
    assert_eq!(current(), own, "shutdown changed the current context");
    let buf = pool.take(SIZE);
    drop(pool);
    drop(buf);
    assert_eq!(
        current(),
        own,
        "a drop after the pool closed changed the current context"
    );
    // SAFETY: created above; nothing uses it any more.
    unsafe { sys::cuCtxDestroy_v2(own) }.result().unwrap();
}

/// Four 1 KiB buffers carved from one registered page: each is page-locked,
/// copies its own bytes (not a neighbour's), and comes back zeroed; one
/// page is pinned for all four, and unpinned at shutdown.
#[test]
#[ignore = "needs a GPU"]
fn sub_page_buffers_share_a_registered_page() {
    const SIZE: usize = 1024;
    let ctx = gpu();
    let stream = ctx.new_stream().unwrap();
    let pool = cuda_pool();
    drop(pool.take(SIZE));
    pool.flush();
    let page = pool.stats().pinned_bytes as usize;
    assert!(page >= 4096 && page.is_power_of_two(), "pinned {page}");
    let count = page / SIZE;
    let mut bufs: Vec<_> = (0..count).map(|_| pool.take(SIZE)).collect();
    let mut dsts: Vec<_> = (0..count)
        .map(|_| stream.alloc_zeros::<u8>(SIZE).unwrap())
        .collect();
    stream.synchronize().unwrap();
    for (i, (buf, dst)) in bufs.iter_mut().zip(&mut dsts).enumerate() {
        assert!(buf.was_pooled() && buf.is_pinned(), "buffer {i}");
        let mut flags = 0;
        // SAFETY: valid out-pointer; `buf` is live.
        unsafe { sys::cuMemHostGetFlags(&mut flags, buf.as_ptr() as *mut c_void) }
            .result()
            .expect("the driver knows a carved buffer as page-locked");
        buf.fill(i as u8 + 1);
        stream.memcpy_htod(&*buf, dst).unwrap();
    }
    assert_eq!(pool.stats().pinned_bytes as usize, page, "one slab for all");
    drop(bufs);
    pool.flush();
    for (i, dst) in dsts.iter().enumerate() {
        let got = stream.clone_dtoh(dst).unwrap();
        assert!(
            got.iter().all(|&b| b == i as u8 + 1),
            "copy {i} read another buffer"
        );
    }
    let again: Vec<_> = (0..count).map(|_| pool.take(SIZE)).collect();
    assert!(again
        .iter()
        .all(|b| b.was_pooled() && b.iter().all(|&x| x == 0)));
    drop(again);
    pool.shutdown();
    let stats = pool.stats();
    assert_eq!((stats.pinned_bytes, stats.leaked_bytes), (0, 0));
}

/// A pageable miss buffer dropped while the registration backlog is full
/// is freed by its dropper, but its CUDA events (a copy through cudarc
/// records one even from pageable memory) go to the cleaner: the dropping
/// thread destroys no event and takes no lock of its pool's spare
/// events.
#[cfg(feature = "testing")]
#[test]
#[ignore = "needs a GPU"]
fn a_miss_shed_past_the_registration_backlog_leaves_its_events_to_the_cleaner() {
    use pinpool::testing::{fence_calls_on, FenceCalls};
    const SIZE: usize = 4 << 20; // one registration job each (no chunks)
    let ctx = gpu();
    let stream = ctx.new_stream().unwrap();
    let pool = Pool::builder()
        .backend(BackendKind::Cuda)
        .regions(false)
        .cleaner_threads(1) // a registration backlog of 64 + 16
        .provision(false)
        .build()
        .unwrap();
    let mut dst = stream.alloc_zeros::<u8>(4096).unwrap();
    stream.synchronize().unwrap();
    // Far more first registrations than the backlog holds, dropped just
    // before the buffer under test. The only worker drains the backlog as
    // it fills, so the buffer finds it full only if it is dropped before
    // the worker takes the next job: the round is repeated until it is.
    let mut shed = None;
    for _ in 0..20 {
        let misses: Vec<_> = (0..200).map(|_| pool.take(SIZE)).collect();
        let mut last = pool.take(SIZE);
        assert!(!last.is_pinned());
        // Two copies (two events), a host write that waits for them (they
        // become spares), one more copy (a spare reused): the buffer holds
        // a pending event and a spare one.
        stream.memcpy_htod(&last.prefix(4096), &mut dst).unwrap();
        stream.memcpy_htod(&last.prefix(4096), &mut dst).unwrap();
        last[0] = 1;
        stream.memcpy_htod(&last.prefix(4096), &mut dst).unwrap();
        drop(misses);
        let skipped = pool.stats().registrations_skipped;
        let dropper = std::thread::spawn(move || {
            drop(last);
            fence_calls_on(std::thread::current().id())
        });
        let calls = dropper.join().unwrap();
        let was_shed = pool.stats().registrations_skipped > skipped;
        pool.flush();
        // Unpinned again for the next round.
        pool.clear();
        if was_shed {
            shed = Some(calls);
            break;
        }
    }
    let calls =
        shed.expect("in 20 rounds the backlog always had room: the buffer was queued, not shed");
    assert_eq!(
        calls,
        FenceCalls::default(),
        "the drop destroyed an event or locked the event pool"
    );
    pool.flush();
    assert_eq!(pool.stats().in_cleaner, 0);
    pool.shutdown();
}

/// The current context of the calling thread (null if none).
fn current_context() -> sys::CUcontext {
    result::ctx::get_current()
        .unwrap()
        .unwrap_or(std::ptr::null_mut())
}

/// Dropping the last handle with no buffer out drops the pool's state on
/// the calling thread, releasing the pool's references to the primary
/// contexts there: the thread's current context stays what it was.
#[test]
#[ignore = "needs a GPU"]
fn dropping_the_last_handle_keeps_the_threads_context() {
    let gpu = gpu();
    let ctx = std::sync::Arc::clone(&gpu);
    std::thread::spawn(move || {
        // SAFETY: null unbinds.
        unsafe { result::ctx::set_current(std::ptr::null_mut()) }.unwrap();
        let pool = cuda_pool();
        drop(pinned(&pool, 1 << 20));
        pool.flush();
        drop(pool);
        assert_eq!(
            current_context(),
            std::ptr::null_mut(),
            "dropping the pool changed the current context"
        );
        let mut own: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; device 0 exists (see `gpu`).
        unsafe { sys::cuCtxCreate_v2(&mut own, 0, 0) }
            .result()
            .expect("cuCtxCreate");
        let pool = cuda_pool();
        drop(pinned(&pool, 1 << 20));
        pool.flush();
        assert_eq!(current_context(), own);
        drop(pool);
        assert_eq!(
            current_context(),
            own,
            "dropping the pool changed the current context"
        );
        // SAFETY: created above; nothing uses it any more.
        unsafe { sys::cuCtxDestroy_v2(own) }.result().unwrap();
        drop(ctx);
    })
    .join()
    .expect("the test's thread");
}

/// Cleaner workers never run outside the CPUs the thread that started them
/// may use (an operator's `taskset`), whatever NUMA placement decides.
#[test]
#[ignore = "needs a GPU"]
fn cleaner_workers_stay_inside_the_starting_threads_cpus() {
    // Alone in a child process: the check reads every cleaner thread of
    // the process, and other tests' pools have theirs.
    if common::in_child(
        module_path!(),
        "cleaner_workers_stay_inside_the_starting_threads_cpus",
        &[],
    )
    .is_some()
    {
        return;
    }
    let _ctx = gpu();
    let nodes = std::fs::read_to_string("/sys/devices/system/node/online").unwrap_or_default();
    println!("NUMA nodes online: {}", nodes.trim());
    std::thread::spawn(|| {
        let cpu = *thread_cpus().last().unwrap();
        // SAFETY: `cpu_set_t` is plain data, valid when zeroed.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `cpu` came from the kernel's list, below CPU_SETSIZE.
        unsafe { libc::CPU_SET(cpu, &mut set) };
        // SAFETY: pid 0 is this thread; the kernel reads the set.
        let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
        assert_eq!(rc, 0);
        let pool = cuda_pool();
        drop(pinned(&pool, 1 << 20));
        let workers = cleaner_cpus();
        assert!(!workers.is_empty(), "no cleaner worker found");
        for allowed in &workers {
            assert_eq!(allowed, &[cpu], "a cleaner worker escaped CPU {cpu}");
        }
        drop(pool);
    })
    .join()
    .expect("the test's thread");
}

/// A process under an explicit memory policy (`numactl --membind`) keeps
/// it: the pool binds no range of its own. (On a machine with one NUMA
/// node nothing is ever bound, and this passes trivially; it says so.)
#[test]
#[ignore = "needs a GPU"]
fn an_explicit_memory_policy_of_the_process_is_kept() {
    let _ctx = gpu();
    let memory = std::fs::read_to_string("/sys/devices/system/node/has_memory").unwrap();
    println!("NUMA nodes with memory: {}", memory.trim());
    std::thread::spawn(move || {
        // MPOL_BIND over every node with memory: the explicit policy
        // `numactl --membind=all` sets.
        let mut mask = [0 as libc::c_ulong; 16];
        for node in parse_list(&memory) {
            mask[node / 64] |= 1 << (node % 64);
        }
        // SAFETY: the kernel reads the mask's words; nothing is written.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_set_mempolicy,
                libc::MPOL_BIND,
                mask.as_ptr(),
                (mask.len() * 64 + 1) as libc::c_ulong,
            )
        };
        assert_eq!(rc, 0, "set_mempolicy: {}", std::io::Error::last_os_error());
        let pool = cuda_pool();
        let buf = pool.take(8 << 20); // a miss: a fresh mapping
        let mut mode: libc::c_int = -1;
        const MPOL_F_ADDR: libc::c_ulong = 2;
        // SAFETY: the kernel writes one int; `buf` is a live mapping.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_get_mempolicy,
                &mut mode as *mut libc::c_int,
                std::ptr::null_mut::<libc::c_ulong>(),
                0 as libc::c_ulong,
                buf.as_ptr() as *mut c_void,
                MPOL_F_ADDR,
            )
        };
        assert_eq!(rc, 0, "get_mempolicy: {}", std::io::Error::last_os_error());
        assert_ne!(
            mode,
            libc::MPOL_PREFERRED,
            "the pool overrode the process's MPOL_BIND"
        );
        drop(buf);
        drop(pool);
    })
    .join()
    .expect("the test's thread");
}

/// A `Vec` in pooled pinned memory: filled, copied behind a closed gate,
/// its last use recorded through `PinnedAlloc` (or not: then the device is
/// synchronized), and freed; its buffer is reused only once the copy has
/// landed, and comes back zero.
#[cfg(feature = "allocator-api2")]
fn vec_copy_gates_reuse(record: bool) {
    use allocator_api2::alloc::{Allocator, Layout};
    use allocator_api2::vec::Vec as PinnedVec;
    use pinpool::PinnedAlloc;

    const SIZE: usize = 8 << 20;
    let ctx = gpu();
    let stream = ctx.new_stream().unwrap();
    let pool = cuda_pool();
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    drop(PinnedVec::<u8, _>::with_capacity_in(SIZE, alloc.clone()));
    pool.flush();
    let dst = DeviceBytes::new(SIZE);
    let mut v: PinnedVec<u8, _> = PinnedVec::with_capacity_in(SIZE, alloc.clone());
    assert!(alloc.is_pinned(v.as_ptr()).unwrap(), "a pinned hit");
    v.extend((0..SIZE).map(|i| (i % 251) as u8 + 1));
    let expected = v.to_vec();
    let ptr = v.as_ptr() as usize;
    let gate = Gate::close(&stream);
    copy_async(&stream, &dst, &v);
    if record {
        alloc.record_last_use(v.as_ptr(), &stream).unwrap();
    }
    drop(v);
    let flushed = flush_in_background(&pool);
    assert!(
        flushed.recv_timeout(Duration::from_millis(300)).is_err(),
        "flush returned while the copy was still held"
    );
    assert_eq!(pool.stats().pooled_buffers, 0, "reused during the copy");
    gate.open();
    flushed
        .recv_timeout(Duration::from_secs(10))
        .expect("flush returns once the copy lands");
    assert!(dst.read() == expected, "the device holds the written bytes");
    let layout = Layout::from_size_align(SIZE, 4096).unwrap();
    let again = alloc.allocate_zeroed(layout).unwrap();
    assert_eq!(
        again.cast::<u8>().as_ptr() as usize,
        ptr,
        "the buffer came back"
    );
    // SAFETY: a live zeroed block of at least `SIZE` bytes.
    let bytes = unsafe { std::slice::from_raw_parts(again.cast::<u8>().as_ptr(), SIZE) };
    assert!(bytes.iter().all(|&b| b == 0));
    // SAFETY: allocated above with `layout`, not used after.
    unsafe { alloc.deallocate(again.cast(), layout) };
    pool.shutdown();
}

#[cfg(feature = "allocator-api2")]
#[test]
#[ignore = "needs a GPU"]
fn pinned_vec_recorded_copy_gates_reuse() {
    vec_copy_gates_reuse(true);
}

#[cfg(feature = "allocator-api2")]
#[test]
#[ignore = "needs a GPU"]
fn pinned_vec_without_record_device_sync_gates_reuse() {
    vec_copy_gates_reuse(false);
}

/// With the defaults (regions), misses held together make one region grow
/// for them, and the same takes again are carved from it: page-locked, in
/// fewer registrations than misses (one region, or a few while the cleaner
/// races the takes), not one per buffer.
#[test]
#[ignore = "needs a GPU"]
fn by_default_misses_grow_a_region_that_the_next_takes_carve() {
    let _ctx = gpu();
    let pool = Pool::builder()
        .backend(BackendKind::Cuda)
        .provision(false)
        .build()
        .unwrap();
    let sizes = [300 << 10, 1 << 20, 2 << 20, 700 << 10, 3 << 20, 5 << 20];
    let first: Vec<_> = sizes.iter().map(|&n| pool.take(n)).collect();
    assert!(!first[0].is_pinned(), "the first take misses, pageable");
    // Held across provisioning ticks (every 10 ms), which count the demand.
    std::thread::sleep(std::time::Duration::from_millis(100));
    drop(first);
    pool.flush();
    let again: Vec<_> = sizes.iter().map(|&n| pool.take(n)).collect();
    let stats = pool.stats();
    assert!(
        again.iter().all(|b| b.is_pinned() && b.was_pooled()),
        "{stats:#?}"
    );
    assert!(
        stats.regions >= 1 && stats.registrations < sizes.len() as u64,
        "{stats:#?}"
    );
    assert!(
        stats.region_bytes >= sizes.iter().sum::<usize>(),
        "{stats:#?}"
    );
    drop(again);
    pool.flush();
    assert_eq!(
        pool.stats().registrations,
        stats.registrations,
        "registered again for the same demand"
    );
    pool.shutdown();
    assert_eq!(pool.stats().regions, 0);
}

/// With the defaults (regions; an idle-trim time of 2 s here), a workload
/// that shrinks, from segments of buffers up to 8 MiB to segments of
/// buffers up to 256 KiB, gives back what its large segments pinned within
/// two idle-trim times: at most 1.25 times what the small segments hold at
/// once, plus one smallest region (2 MiB). Prints the figures.
#[test]
#[ignore = "needs a GPU"]
fn a_shrinking_workload_gives_back_its_large_regions() {
    use common::shrink::pinned_after;
    let _ctx = gpu();
    let pool = || {
        Pool::builder()
            .backend(BackendKind::Cuda)
            .idle_trim(Duration::from_secs(2))
            .build()
            .unwrap()
    };
    let fresh = pinned_after(&pool(), false, 256 << 10, 1).pinned;
    let after = pinned_after(&pool(), true, 256 << 10, 1);
    let (shrunk, held, large) = (after.pinned, after.held, after.large);
    eprintln!(
        "shrinking: {} KiB pinned two idle-trim times after shrinking from {} KiB, \
         {} KiB by a pool that only ran the small segments, {} KiB held at most: {:.3} \
         (at most {} buffers in the cleaner at once)",
        shrunk >> 10,
        large >> 10,
        fresh >> 10,
        held >> 10,
        shrunk as f64 / held as f64,
        after.backlog
    );
    assert!(
        shrunk <= (held as f64 * 1.25) as u64 + (2 << 20),
        "{shrunk} bytes pinned after shrinking from {large}, {held} held at once"
    );
}
