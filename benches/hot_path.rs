//! Take + drop of a ready buffer (a thread-cache hit) at 1-16 threads:
//! pinpool against the seed design, a fresh allocation per take and the
//! floor (`thread_local`: each thread's own list of buffers), with
//! take and drop latency on one thread, and buffers taken on one thread
//! and dropped on another.
//!
//! Each thread loops take / write 64 bytes / drop. Threads live for the
//! whole benchmark (see `Crew`), as a prover's threads do. Throughput is
//! reported as operations per second over all threads.
//!
//! The loop records no events, so on the CUDA backend every recycled
//! buffer waits for a device synchronize (the documented fallback) and the
//! loop measures synchronizes, not the pool. It therefore runs on the host
//! backend unless `PINPOOL_BENCH_BACKEND=cuda` is set (the seed design then
//! registers its buffers too).

use std::cell::RefCell;
use std::hint::black_box;
use std::sync::{Arc, Barrier};
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

/// Threads that live for a whole benchmark, as provers' threads do (a
/// thread's first takes, which set up its cache, are not what is measured).
/// Each run makes every thread do `iters` operations from a common start;
/// it returns the slowest thread's time. Dropped, a crew of several
/// threads prints each thread's own time per operation over all its runs
/// (fastest, median, slowest): where threads run at different speeds (the
/// CPUs of one H100 host ran the same loop up to twice as fast as one
/// another), the slowest sets the figure.
struct Crew {
    name: String,
    commands: Vec<std::sync::mpsc::Sender<u64>>,
    done: std::sync::mpsc::Receiver<(usize, Duration)>,
    handles: Vec<std::thread::JoinHandle<()>>,
    /// Each thread's time and operations over all runs.
    totals: Vec<(Duration, u64)>,
}

impl Crew {
    fn new(name: String, threads: usize, op: Arc<dyn Fn() + Send + Sync>) -> Self {
        let start = Arc::new(Barrier::new(threads));
        let (done_tx, done) = std::sync::mpsc::channel();
        let mut commands = Vec::new();
        let handles = (0..threads)
            .map(|t| {
                let (tx, rx) = std::sync::mpsc::channel::<u64>();
                commands.push(tx);
                let (op, start, done) = (op.clone(), start.clone(), done_tx.clone());
                std::thread::spawn(move || {
                    while let Ok(iters) = rx.recv() {
                        start.wait();
                        let t0 = Instant::now();
                        for _ in 0..iters {
                            op();
                        }
                        let _ = done.send((t, t0.elapsed()));
                    }
                })
            })
            .collect();
        Self {
            name,
            commands,
            done,
            handles,
            totals: vec![(Duration::ZERO, 0); threads],
        }
    }

    fn run(&mut self, iters: u64) -> Duration {
        for tx in &self.commands {
            tx.send(iters).unwrap();
        }
        let mut slowest = Duration::ZERO;
        for _ in 0..self.commands.len() {
            let (t, took) = self.done.recv().unwrap();
            self.totals[t].0 += took;
            self.totals[t].1 += iters;
            slowest = slowest.max(took);
        }
        slowest
    }
}

impl Drop for Crew {
    fn drop(&mut self) {
        let mut each: Vec<f64> = self
            .totals
            .iter()
            .filter(|(_, ops)| *ops > 0)
            .map(|(took, ops)| took.as_nanos() as f64 / *ops as f64)
            .collect();
        if each.len() > 1 {
            each.sort_by(f64::total_cmp);
            let n = each.len();
            let median = (each[(n - 1) / 2] + each[n / 2]) / 2.0;
            eprintln!(
                "{}: each thread's ns per op: fastest {:.2}, median {median:.2}, slowest {:.2}",
                self.name,
                each[0],
                each[n - 1]
            );
        }
        self.commands.clear();
        for handle in self.handles.drain(..) {
            let _ = handle.join();
        }
    }
}

fn take_drop(c: &mut Criterion) {
    take_drop_sized(c, SIZE, "4KiB", &THREADS);
    take_drop_sized(c, 1 << 20, "1MiB", &[16]);
}

/// The take / write 64 bytes / drop loop on `size`-byte buffers.
fn take_drop_sized(c: &mut Criterion, size: usize, label: &str, thread_counts: &[usize]) {
    let pinpool = pool();
    let seed = Arc::new(SeedPool::new(if cuda() {
        pinpool_sim::gpu::detect()
    } else {
        None
    }));
    let mut group = c.benchmark_group(format!("hot_path/take_drop_{label}"));
    for &threads in thread_counts {
        group.throughput(Throughput::Elements(threads as u64));
        let pool = pinpool.clone();
        let mut crew = Crew::new(
            format!("{label}/pinpool/{threads}"),
            threads,
            Arc::new(move || {
                let mut buf = pool.take(size);
                buf[..64].fill(1);
                buf.set_dirty_len(64);
                drop(black_box(buf));
            }),
        );
        group.bench_with_input(BenchmarkId::new("pinpool", threads), &threads, |b, _| {
            b.iter_custom(|iters| crew.run(iters))
        });
        drop(crew);
        let seed_pool = seed.clone();
        let mut crew = Crew::new(
            format!("{label}/seed/{threads}"),
            threads,
            Arc::new(move || {
                let mut buf = seed_pool.take(0, size);
                buf.bytes()[..64].fill(1);
                buf.set_dirty_len(64);
                drop(black_box(buf));
            }),
        );
        group.bench_with_input(BenchmarkId::new("seed", threads), &threads, |b, _| {
            b.iter_custom(|iters| crew.run(iters))
        });
        drop(crew);
        let mut crew = Crew::new(
            format!("{label}/fresh_alloc/{threads}"),
            threads,
            Arc::new(move || {
                let mut buf = vec![0u8; size];
                buf[..64].fill(1);
                drop(black_box(buf));
            }),
        );
        group.bench_with_input(
            BenchmarkId::new("fresh_alloc", threads),
            &threads,
            |b, _| b.iter_custom(|iters| crew.run(iters)),
        );
        drop(crew);
        // The floor: each thread's own list of buffers, no pool (what the
        // host's CPUs give a loop that shares nothing).
        let mut crew = Crew::new(
            format!("{label}/thread_local/{threads}"),
            threads,
            Arc::new(move || {
                thread_local! {
                    static OWN: RefCell<Vec<Box<[u8]>>> = const { RefCell::new(Vec::new()) };
                }
                OWN.with(|own| {
                    let mut own = own.borrow_mut();
                    let mut buf = own
                        .pop()
                        .unwrap_or_else(|| vec![0u8; size].into_boxed_slice());
                    buf[..64].fill(1);
                    black_box(&mut buf);
                    buf[..64].fill(0);
                    own.push(buf);
                })
            }),
        );
        group.bench_with_input(
            BenchmarkId::new("thread_local", threads),
            &threads,
            |b, _| b.iter_custom(|iters| crew.run(iters)),
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

/// Buffers per batch in the cross-thread pipeline.
const BATCH: usize = 64;

/// Sends `iters` buffers (rounded up to whole batches of `BATCH`) from
/// this thread, which makes each with `take`, to another, which hands
/// each batch to `drop_batch`, through a channel of four batches; the time
/// per buffer, counted over `iters`. Both threads spin while the channel is
/// full or empty instead of sleeping: with sleeps, a run's figure depended
/// on whether the two threads fell into step (a few thousand context
/// switches in a run) or woke each other for every batch (some 90,000 on
/// the 2-core box, three to four times the time per buffer), not on what
/// the buffers cost.
fn pipeline<T: Send + 'static>(
    iters: u64,
    mut take: impl FnMut() -> T,
    mut drop_batch: impl FnMut(Vec<T>) + Send + 'static,
) -> Duration {
    let batches = iters.div_ceil(BATCH as u64);
    let (tx, rx) = crossbeam_channel::bounded::<Vec<T>>(4);
    let dropper = std::thread::spawn(move || loop {
        match rx.try_recv() {
            Ok(batch) => drop_batch(batch),
            Err(crossbeam_channel::TryRecvError::Empty) => std::hint::spin_loop(),
            Err(crossbeam_channel::TryRecvError::Disconnected) => break,
        }
    });
    let start = Instant::now();
    for _ in 0..batches {
        let mut batch: Vec<T> = (0..BATCH).map(|_| take()).collect();
        loop {
            match tx.try_send(batch) {
                Ok(()) => break,
                Err(crossbeam_channel::TrySendError::Full(back)) => {
                    batch = back;
                    std::hint::spin_loop();
                }
                Err(crossbeam_channel::TrySendError::Disconnected(_)) => {
                    unreachable!("the dropper runs until the channel closes")
                }
            }
        }
    }
    drop(tx);
    dropper.join().unwrap();
    start
        .elapsed()
        .mul_f64(iters as f64 / (batches * BATCH as u64) as f64)
}

/// Buffers taken on one thread and dropped on another, in batches of 64
/// (so that the channel between them costs little per buffer): one pair of
/// threads, per buffer amortised. The drops go to the taker's returns list;
/// its takes collect them back. `channel_floor` runs the same pipeline
/// with boxed buffers sent back to the taker, no pool.
fn cross_thread(c: &mut Criterion) {
    let pool = pool();
    let mut group = c.benchmark_group("hot_path/cross_thread_4KiB");
    group.throughput(Throughput::Elements(1));
    group.bench_function("pinpool", |b| {
        b.iter_custom(|iters| {
            pipeline(
                iters,
                || {
                    let mut buf = pool.take(SIZE);
                    buf[..64].fill(1);
                    buf.set_dirty_len(64);
                    buf
                },
                |batch| drop(black_box(batch)),
            )
        })
    });
    // The same pipeline without a pool: the taker recycles boxed buffers
    // the dropper sends back in their batches, re-zeroing what it wrote:
    // what the channels, the threads and the buffers' lines moving between
    // cores cost, the floor under the pool's figure.
    group.bench_function("channel_floor", |b| {
        b.iter_custom(|iters| {
            let (back_tx, back_rx) = crossbeam_channel::unbounded::<Vec<Box<[u8]>>>();
            let mut free: Vec<Box<[u8]>> = (0..BATCH * 6)
                .map(|_| vec![0u8; SIZE].into_boxed_slice())
                .collect();
            pipeline(
                iters,
                move || {
                    while free.is_empty() {
                        free.extend(back_rx.recv().unwrap().into_iter().map(|mut buf| {
                            buf[..64].fill(0);
                            buf
                        }));
                    }
                    let mut buf = free.pop().expect("refilled");
                    buf[..64].fill(1);
                    buf
                },
                move |batch| {
                    let _ = back_tx.send(black_box(batch));
                },
            )
        })
    });
    group.finish();
    let s = pool.stats();
    eprintln!(
        "cross-thread: hit rate {:.4} over {} takes, {} misses, {} of {} recycled by takers",
        s.hit_rate(),
        s.hits + s.misses,
        s.misses,
        s.cleaned_by_takers,
        s.recycled
    );
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

/// What writing a trace adds to the single-thread loop: an untraced pool
/// against one tracing to `/dev/null`, on the same backend, side by side.
/// The loop runs in bursts of 2,048 take + drop pairs (4,096 records, a
/// quarter of a thread's trace buffer) with an untimed 8 ms pause after
/// each, in which the trace's background thread empties the buffer: so
/// every record is written, and the figure is the cost of writing them (a
/// loop faster than the background thread drains would mostly count
/// records as lost, which costs less). `added` runs an untraced burst and
/// a traced one in turn (which goes first alternates) and counts the
/// traced one's time less the other's: what tracing adds, measured on
/// bursts milliseconds apart, so
/// that a host whose speed drifts between the two functions' measurements
/// (some virtual machines' does, by up to 2x) moves both alike.
fn trace_cost(c: &mut Criterion) {
    const BURST: u64 = 2048;
    let untraced = pool();
    let traced = Pool::builder()
        .backend(untraced.config().backend)
        .trace("/dev/null")
        .build()
        .expect("build the traced pool");
    let burst = |pool: &Pool, n: u64| {
        let t0 = Instant::now();
        for _ in 0..n {
            let mut buf = pool.take(SIZE);
            buf[..64].fill(1);
            buf.set_dirty_len(64);
            drop(black_box(buf));
        }
        let took = t0.elapsed();
        std::thread::sleep(Duration::from_millis(8));
        took
    };
    let mut group = c.benchmark_group("hot_path/trace_4KiB");
    for (name, pool) in [("untraced", &untraced), ("traced", &traced)] {
        drop(pool.take(SIZE));
        pool.flush();
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let n = left.min(BURST);
                    total += burst(pool, n);
                    left -= n;
                }
                total
            })
        });
    }
    // Each sample runs at least four pairs of whole bursts, whatever
    // criterion asks for, and counts its iterations at the mean difference
    // per take + drop over them (a short burst's difference is noise). The
    // two bursts of a pair run in either order, in turn.
    group.sample_size(30);
    let samples = std::cell::RefCell::new(Vec::new());
    group.bench_function("added", |b| {
        b.iter_custom(|iters| {
            let pairs = iters.div_ceil(BURST).max(4);
            let mut added = 0i128;
            for pair in 0..pairs {
                let (plain, with) = if pair % 2 == 0 {
                    let plain = burst(&untraced, BURST);
                    (plain, burst(&traced, BURST))
                } else {
                    let with = burst(&traced, BURST);
                    (burst(&untraced, BURST), with)
                };
                added += with.as_nanos() as i128 - plain.as_nanos() as i128;
            }
            let per_op = added as f64 / (pairs * BURST) as f64;
            samples.borrow_mut().push(per_op);
            // Criterion takes no negative times, nor zero: a sample in which
            // tracing looked free counts as a nanosecond in all, which reads
            // high where the cost is within the noise (a few ns); the line
            // printed below is not clamped.
            Duration::from_nanos(((per_op * iters as f64) as u64).max(1))
        })
    });
    group.finish();
    // The same samples, negative ones as they came (warm-up included).
    let samples = samples.into_inner();
    if !samples.is_empty() {
        let n = samples.len() as f64;
        let mean = samples.iter().sum::<f64>() / n;
        let var = samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        eprintln!(
            "hot_path/trace_4KiB/added unclamped: mean {mean:.2} ns +- {:.2} (standard error), \
             median {:.2} ns, over {} samples, {} below zero",
            (var / n).sqrt(),
            sorted[sorted.len() / 2],
            samples.len(),
            samples.iter().filter(|&&x| x < 0.0).count()
        );
    }
}

/// What a trace's clock costs per read: the time-stamp counter (the
/// trace's clock where it is invariant), `Instant::now` (the monotonic
/// clock through the vDSO) and the coarse monotonic clock (the kernel's
/// tick, a few milliseconds).
fn clocks(c: &mut Criterion) {
    let mut group = c.benchmark_group("hot_path/clock");
    #[cfg(target_arch = "x86_64")]
    group.bench_function("tsc", |b| {
        b.iter(|| {
            // SAFETY: `rdtsc` exists on every x86-64 CPU and has no
            // preconditions.
            unsafe { core::arch::x86_64::_rdtsc() }
        })
    });
    group.bench_function("instant", |b| b.iter(Instant::now));
    group.bench_function("coarse", |b| {
        b.iter(|| {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: `ts` is a valid timespec to write.
            unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
            black_box(ts.tv_nsec)
        })
    });
    group.finish();
}

criterion_group!(
    benches,
    take_drop,
    latency,
    cross_thread,
    tracing_cost,
    trace_cost,
    clocks
);
criterion_main!(benches);
