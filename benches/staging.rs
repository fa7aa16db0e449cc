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
//! 0.5) seconds each, timed from when every thread of a run has set up (its
//! stream and device memory; the hand-written loops' pinned buffers and
//! events) to when the run is told to stop, its setup and teardown left
//! out; `PINPOOL_BENCH_SIZES` (e.g. `4KiB`, default both)
//! picks the buffer sizes; `PINPOOL_BENCH_PIN=1` binds each loop's thread
//! `t` to the `t`-th CPU the process may run on (see `pin_to_cpu`). The
//! four single-thread-per-stream loops run in turn, one run of each, each
//! round starting from the next loop, and the ratios of each round are
//! printed too (a loop against its baseline seconds apart). With
//! `PINPOOL_BENCH_PHASES=1`, the four loops time each phase of each
//! operation (a clock read more per phase) and print per-phase histograms.
//! On a machine without a GPU it says so and exits 0.
//!
//! Run with `cargo bench -p pinpool-benches --bench staging` (or the staged binary with
//! `--bench`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
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

/// Whether `PINPOOL_BENCH_PIN=1`: each loop thread runs on one CPU only.
fn pinned() -> bool {
    std::env::var("PINPOOL_BENCH_PIN").is_ok_and(|v| v == "1")
}

/// Binds the calling thread to the `t`-th CPU (modulo their number) of
/// those the process may run on, so that every loop's thread `t` runs on
/// the same CPU and a loop and its baseline are compared on one CPU, not
/// on whichever the scheduler picked for each run (the CPUs of one H100
/// host ran the same loop up to twice as fast as one another). Panics if
/// the binding fails: a run labelled bound must be.
fn pin_to_cpu(t: usize) {
    // SAFETY: `sched_getaffinity` and `sched_setaffinity` on the calling
    // thread (pid 0) with sets of their own type and size; `CPU_ISSET` and
    // `CPU_SET` index below `CPU_SETSIZE`.
    unsafe {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, size, &mut allowed),
            0,
            "staging: sched_getaffinity failed"
        );
        let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| libc::CPU_ISSET(cpu, &allowed))
            .collect();
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpus[t % cpus.len()], &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size, &set),
            0,
            "staging: sched_setaffinity failed"
        );
    }
}

/// The timed window of one run of a loop, as its threads see it: each
/// sets up what it needs (a stream, device memory, the hand-written loops'
/// pinned buffers), calls [`begin`](Self::begin), loops while
/// [`running`](Self::running), waits for its last copies and calls
/// [`end`](Self::end), then tears down. Neither the setup nor the teardown
/// (freeing pinned buffers and events) is timed: they cost the loops
/// unequally, and more the more threads contend for the driver. The wait
/// for the copies a loop queued before the stop is: they count among its
/// operations.
struct Window<'a> {
    start: &'a Barrier,
    stop: &'a AtomicBool,
    /// When the last thread to end did.
    ended: &'a Mutex<Option<Instant>>,
    /// Whether this thread called `begin`.
    began: std::cell::Cell<bool>,
}

impl Window<'_> {
    /// Waits until every thread of the run has set up; the window opens
    /// when the last one has. Called once per thread.
    fn begin(&self) {
        assert!(!self.began.replace(true), "staging: a loop began twice");
        self.start.wait();
    }

    /// Whether the window is still open.
    #[inline]
    fn running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed)
    }

    /// Marks this thread's work done (its copies complete): the window's
    /// time ends when the last thread's does.
    fn end(&self) {
        let now = Instant::now();
        let mut ended = self.ended.lock().unwrap();
        *ended = Some(ended.map_or(now, |t| t.max(now)));
    }
}

/// Runs `body(thread, window)` on `threads` threads (each bound to a CPU
/// with `PINPOOL_BENCH_PIN=1`, see `pin_to_cpu`), the window open for
/// `secs` once every thread has set up (see [`Window`]); returns the
/// operations per second over all threads: what the bodies count, over the
/// time from the window's opening to the last thread's end. A body that
/// panics before it began still lets the others begin; the panic is then
/// raised here.
fn run(threads: usize, secs: f64, body: impl Fn(usize, &Window<'_>) -> u64 + Sync) -> f64 {
    let pin = pinned();
    let stop = AtomicBool::new(false);
    let start = Barrier::new(threads + 1);
    let ended = Mutex::new(None);
    let (ops, times) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (body, stop, start, ended) = (&body, &stop, &start, &ended);
                scope.spawn(move || {
                    if pin {
                        pin_to_cpu(t);
                    }
                    let window = Window {
                        start,
                        stop,
                        ended,
                        began: std::cell::Cell::new(false),
                    };
                    let ran =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(t, &window)));
                    ran.unwrap_or_else(|panic| {
                        if !window.began.get() {
                            start.wait();
                        }
                        std::panic::resume_unwind(panic)
                    })
                })
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        let stopped = Instant::now();
        let ops: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        (ops, (t0, stopped))
    });
    let (t0, stopped) = times;
    let end = ended.into_inner().unwrap().unwrap_or(stopped);
    ops as f64 / end.duration_since(t0).as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The phases the raw pool loop times, in its order.
const RAW_PHASES: [&str; 4] = ["take", "write+copy", "record", "drop"];
/// The phases the hand-written loop times: its wait for the buffer's last
/// copy stands where the pool's take does.
const HAND_PHASES: [&str; 3] = ["event sync", "write+copy", "record"];

/// The phases the pool loop through cudarc times (its copy records the
/// buffer's last use itself).
const CUDARC_PHASES: [&str; 4] = ["take", "write", "memcpy_htod", "drop"];
/// The phases the hand-written loop through cudarc times.
const HAND_CUDARC_PHASES: [&str; 3] = ["event sync", "write", "memcpy_htod"];

/// Sub-buckets per octave of the phase histograms.
const STEPS: usize = 4;

/// Per-phase histograms of nanoseconds (four buckets per octave), kept
/// when `PINPOOL_BENCH_PHASES=1`.
struct Phases {
    names: &'static [&'static str],
    counts: Vec<[u64; 64 * STEPS]>,
    total_ns: Vec<u64>,
    max_ns: Vec<u64>,
}

impl Phases {
    fn new(names: &'static [&'static str]) -> Self {
        Self {
            names,
            counts: vec![[0; 64 * STEPS]; names.len()],
            total_ns: vec![0; names.len()],
            max_ns: vec![0; names.len()],
        }
    }

    fn bucket(ns: u64) -> usize {
        if ns < STEPS as u64 {
            return ns as usize;
        }
        let octave = 63 - ns.leading_zeros() as usize;
        let step = ((ns >> (octave - 2)) & 3) as usize;
        octave * STEPS + step
    }

    /// The smallest value of `bucket`.
    fn floor(bucket: usize) -> u64 {
        if bucket < STEPS {
            return bucket as u64;
        }
        let (octave, step) = (bucket / STEPS, bucket % STEPS);
        (1u64 << octave) + ((step as u64) << (octave - 2))
    }

    #[inline]
    fn add(&mut self, phase: usize, ns: Option<u64>) {
        if let Some(ns) = ns {
            self.counts[phase][Self::bucket(ns)] += 1;
            self.total_ns[phase] += ns;
            self.max_ns[phase] = self.max_ns[phase].max(ns);
        }
    }

    fn merge(&mut self, other: &Phases) {
        for p in 0..self.names.len() {
            for (a, b) in self.counts[p].iter_mut().zip(other.counts[p].iter()) {
                *a += b;
            }
            self.total_ns[p] += other.total_ns[p];
            self.max_ns[p] = self.max_ns[p].max(other.max_ns[p]);
        }
    }

    fn quantile(&self, phase: usize, q: f64) -> u64 {
        let n: u64 = self.counts[phase].iter().sum();
        let want = ((n as f64) * q).ceil() as u64;
        let mut seen = 0;
        for (b, c) in self.counts[phase].iter().enumerate() {
            seen += c;
            if seen >= want.max(1) {
                return Self::floor(b);
            }
        }
        0
    }

    /// One line per phase: mean, p50, p99, p99.9 and max, and the share of
    /// the loop's time.
    fn report(&self, label: &str) {
        let all: u64 = self.total_ns.iter().sum::<u64>().max(1);
        for (p, name) in self.names.iter().enumerate() {
            let n: u64 = self.counts[p].iter().sum::<u64>().max(1);
            println!(
                "  {label} {name:>10}: mean {:>7} ns, p50 {:>7}, p99 {:>8}, p99.9 {:>9}, max {:>10}, {:>5.1}% of the time",
                self.total_ns[p] / n,
                self.quantile(p, 0.5),
                self.quantile(p, 0.99),
                self.quantile(p, 0.999),
                self.max_ns[p],
                100.0 * self.total_ns[p] as f64 / all as f64
            );
        }
    }
}

/// Laps between phases, read only when phases are kept.
struct Clock {
    last: Option<Instant>,
}

impl Clock {
    fn new(on: bool) -> Self {
        Self {
            last: on.then(Instant::now),
        }
    }

    #[inline]
    fn lap(&mut self) -> Option<u64> {
        let last = self.last.as_mut()?;
        let now = Instant::now();
        let ns = now.duration_since(*last).as_nanos() as u64;
        *last = now;
        Some(ns)
    }
}

/// One thread's phase timing in a loop: its own histograms, merged into
/// `into` when the loop ends; nothing read or kept without `into`.
struct Timer<'a> {
    mine: Phases,
    clock: Clock,
    into: Option<&'a Mutex<Phases>>,
}

impl<'a> Timer<'a> {
    fn new(names: &'static [&'static str], into: Option<&'a Mutex<Phases>>) -> Self {
        Self {
            mine: Phases::new(names),
            clock: Clock::new(into.is_some()),
            into,
        }
    }

    /// Ends `phase`: the time since the last lap.
    #[inline]
    fn lap(&mut self, phase: usize) {
        let ns = self.clock.lap();
        self.mine.add(phase, ns);
    }

    fn finish(self) {
        if let Some(all) = self.into {
            all.lock().unwrap().merge(&self.mine);
        }
    }
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

fn pinpool_cudarc(
    pool: &Pool,
    ctx: &Arc<CudaContext>,
    size: usize,
    window: &Window<'_>,
    phases: Option<&Mutex<Phases>>,
) -> u64 {
    let mut lane = Lane::new(ctx, size);
    let mut ops = 0;
    window.begin();
    let mut timer = Timer::new(&CUDARC_PHASES, phases);
    while window.running() {
        let mut buf = pool.take(size);
        timer.lap(0);
        buf[..64].fill(1);
        buf.set_dirty_len(64);
        timer.lap(1);
        lane.stream.memcpy_htod(&buf, &mut lane.dst).unwrap();
        timer.lap(2);
        drop(buf);
        timer.lap(3);
        ops += 1;
    }
    lane.stream.synchronize().unwrap();
    window.end();
    timer.finish();
    ops
}

fn pinpool_raw(
    pool: &Pool,
    ctx: &Arc<CudaContext>,
    size: usize,
    window: &Window<'_>,
    phases: Option<&Mutex<Phases>>,
) -> u64 {
    let lane = Lane::new(ctx, size);
    let dst = lane.dst_ptr();
    let mut ops = 0;
    window.begin();
    let mut timer = Timer::new(&RAW_PHASES, phases);
    while window.running() {
        let mut buf = pool.take(size);
        timer.lap(0);
        buf[..64].fill(1);
        buf.set_dirty_len(64);
        // SAFETY: `dst` holds `size` bytes; the buffer stays alive until its
        // recorded event completes (the pool waits on it).
        unsafe { result::memcpy_htod_async(dst, &buf[..size], lane.stream.cu_stream()) }.unwrap();
        timer.lap(1);
        buf.record_last_use(&lane.stream).unwrap();
        timer.lap(2);
        drop(buf);
        timer.lap(3);
        ops += 1;
    }
    lane.stream.synchronize().unwrap();
    window.end();
    timer.finish();
    ops
}

fn hand_written(
    ctx: &Arc<CudaContext>,
    size: usize,
    window: &Window<'_>,
    phases: Option<&Mutex<Phases>>,
) -> u64 {
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
    window.begin();
    let mut timer = Timer::new(&HAND_PHASES, phases);
    while window.running() {
        let i = (ops % 2) as usize;
        // SAFETY: live events, buffers of `size` bytes, a live stream; each
        // buffer is reused only after its event (recorded after its last
        // copy) has completed.
        unsafe {
            result::event::synchronize(events[i]).unwrap();
            timer.lap(0);
            std::ptr::write_bytes(bufs[i], 1, 64);
            let src = std::slice::from_raw_parts(bufs[i], size);
            result::memcpy_htod_async(dst, src, stream).unwrap();
            timer.lap(1);
            result::event::record(events[i], stream).unwrap();
            timer.lap(2);
        }
        ops += 1;
    }
    lane.stream.synchronize().unwrap();
    window.end();
    timer.finish();
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
    run(pairs * 2, secs, |t, window| {
        let (tx, rx) = &channels[t / 2];
        if t % 2 == 0 {
            ctx.bind_to_thread().unwrap();
            window.begin();
            while window.running() {
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
            let mut open = true;
            window.begin();
            loop {
                let got = rx.recv_timeout(Duration::from_millis(1));
                if open && !window.running() {
                    // The window's time ends once the copies counted in it
                    // are done; buffers still in the channel are dropped,
                    // not copied nor counted.
                    open = false;
                    lane.stream.synchronize().unwrap();
                    window.end();
                }
                match got {
                    Ok(mut buf) if open => {
                        // SAFETY: as in `pinpool_raw`.
                        unsafe {
                            result::memcpy_htod_async(dst, &buf[..size], lane.stream.cu_stream())
                        }
                        .unwrap();
                        buf.record_last_use(&lane.stream).unwrap();
                        drop(buf);
                        ops += 1;
                    }
                    Ok(buf) => drop(buf),
                    Err(_) if !open => break,
                    Err(_) => {}
                }
            }
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

fn hand_cudarc(
    ctx: &Arc<CudaContext>,
    size: usize,
    window: &Window<'_>,
    phases: Option<&Mutex<Phases>>,
) -> u64 {
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
    window.begin();
    let mut timer = Timer::new(&HAND_CUDARC_PHASES, phases);
    while window.running() {
        let buf = &bufs[(ops % 2) as usize];
        buf.event.synchronize().unwrap();
        timer.lap(0);
        // SAFETY: the buffer's last copy has completed (its event above).
        unsafe { std::ptr::write_bytes(buf.ptr, 1, 64) };
        timer.lap(1);
        lane.stream.memcpy_htod(buf, &mut lane.dst).unwrap();
        timer.lap(2);
        ops += 1;
    }
    lane.stream.synchronize().unwrap();
    window.end();
    timer.finish();
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
    let reps = (env_f64("PINPOOL_BENCH_REPS", 3.0) as usize).max(1);
    let phases = std::env::var("PINPOOL_BENCH_PHASES").is_ok_and(|v| v == "1");
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
        "staging: {}, median of {reps} runs of {secs} s; M ops/s over all threads{}",
        ctx.name().unwrap_or_default(),
        if pinned() {
            "; loop thread t bound to the t-th CPU"
        } else {
            ""
        }
    );
    let sizes = std::env::var("PINPOOL_BENCH_SIZES").unwrap_or_default();
    let picked: Vec<&str> = sizes
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    for name in &picked {
        assert!(
            SIZES
                .iter()
                .any(|(_, label)| label.eq_ignore_ascii_case(name)),
            "staging: PINPOOL_BENCH_SIZES names {name:?}; the sizes are {:?}",
            SIZES.map(|(_, label)| label)
        );
    }
    for (size, label) in SIZES {
        if !picked.is_empty() && !picked.iter().any(|s| s.eq_ignore_ascii_case(label)) {
            continue;
        }
        println!("\n{label}: threads | pinpool-cudarc | pinpool-raw | hand-written | hand-cudarc | cross-thread | cudarc/hand | raw/hand | cudarc/hand-cudarc");
        let mut tight = Vec::new();
        for threads in THREADS {
            let measure = |f: &dyn Fn() -> f64| median((0..reps).map(|_| f()).collect()) / 1e6;
            // A fresh pool per thread count for the tight loops, so that its
            // drop-to-ready figures are theirs alone.
            let pool = new_pool(size);
            let warm = pool.stats();
            let all = [
                Mutex::new(Phases::new(&CUDARC_PHASES)),
                Mutex::new(Phases::new(&RAW_PHASES)),
                Mutex::new(Phases::new(&HAND_PHASES)),
                Mutex::new(Phases::new(&HAND_CUDARC_PHASES)),
            ];
            let kept = |loop_: usize| phases.then_some(&all[loop_]);
            // Each run of the four loops back to back, each run starting
            // from the next loop: a loop and its baseline run seconds
            // apart, and none always runs first.
            let mut runs = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
            for rep in 0..reps {
                for k in 0..4 {
                    let loop_ = (rep + k) % 4;
                    let ops = match loop_ {
                        0 => run(threads, secs, |_, window| {
                            pinpool_cudarc(&pool, &ctx, size, window, kept(0))
                        }),
                        1 => run(threads, secs, |_, window| {
                            pinpool_raw(&pool, &ctx, size, window, kept(1))
                        }),
                        2 => run(threads, secs, |_, window| {
                            hand_written(&ctx, size, window, kept(2))
                        }),
                        _ => run(threads, secs, |_, window| {
                            hand_cudarc(&ctx, size, window, kept(3))
                        }),
                    };
                    runs[loop_].push(ops / 1e6);
                }
            }
            pool.flush();
            tight.push((threads, warm, pool.stats()));
            // Each round's ratio (a loop against its baseline run seconds
            // apart), and their median.
            let per_run = |a: usize, b: usize| {
                let ratios: Vec<f64> = runs[a].iter().zip(&runs[b]).map(|(x, y)| x / y).collect();
                let each = ratios
                    .iter()
                    .map(|r| format!("{r:.3}"))
                    .collect::<Vec<_>>()
                    .join(" ");
                format!("{each} (median {:.3})", median(ratios))
            };
            let (raw_runs, cudarc_runs) = (per_run(1, 2), per_run(0, 3));
            let [cudarc_path, raw, hand, hand_cu] = runs.map(median);
            let cross = measure(&|| cross_thread(&pool, &ctx, size, threads, secs));
            println!(
                "{label}: {threads:>7} | {cudarc_path:>14.4} | {raw:>11.4} | {hand:>12.4} | {hand_cu:>11.4} | {cross:>12.4} | {:>11.3} | {:>8.3} | {:>18.3}",
                cudarc_path / hand,
                raw / hand,
                cudarc_path / hand_cu
            );
            println!("{label}: {threads:>7} | each run: raw/hand {raw_runs}; cudarc/hand-cudarc {cudarc_runs}");
            if phases {
                let [cudarc_phases, raw_phases, hand_phases, hand_cu_phases] = all;
                raw_phases.into_inner().unwrap().report("raw   ");
                hand_phases.into_inner().unwrap().report("hand  ");
                cudarc_phases.into_inner().unwrap().report("cudarc");
                hand_cu_phases.into_inner().unwrap().report("hand-cu");
            }
            pool.shutdown();
        }
        for (threads, warm, s) in tight {
            let registrations = s.registrations - warm.registrations;
            let registering = s.registration_time - warm.registration_time;
            println!(
                "{label}: {threads:>2} threads, tight loops: hit rate {:.5} ({} misses), drop-to-ready p50 {:?} p99 {:?}, {} re-zeroed by their owners, {} by the cleaner, {} registrations in the loops taking {:?} on average, {} takes waited for their own copies ({:?} in all)",
                s.hit_rate(),
                s.misses,
                s.drop_to_ready_p50,
                s.drop_to_ready_p99,
                s.cleaned_by_takers,
                s.recycled - s.cleaned_by_takers,
                registrations,
                registering / (registrations.max(1) as u32),
                s.own_waits - warm.own_waits,
                s.own_wait_time - warm.own_wait_time
            );
        }
    }
}
