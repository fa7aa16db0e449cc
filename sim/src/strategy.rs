//! The staging strategies compared side by side.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;
use pinpool::{BackendKind, PinnedBuffer, Pool, PoolBuilder, SizeClasses};

use crate::demand::Demand;
use crate::gpu::{HostAlloc, Sink};
use crate::ideal::{IdealBuffer, IdealPool};
use crate::limit::LimitPool;
use crate::seed::{SeedBuffer, SeedPool};

/// pinpool's settings for a run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Cleaner workers.
    pub cleaner_threads: usize,
    /// Cap on pooled bytes; `None`: pinpool's default (a cap that follows
    /// the working set).
    pub max_pooled_bytes: Option<usize>,
    /// How requested sizes round up to buffer lengths.
    pub size_classes: SizeClasses,
    /// More settings for pinpool, `PINPOOL_CONF` pairs (checked already).
    pub conf: String,
    /// Where pinpool writes a trace of the run, if anywhere.
    pub trace: Option<std::path::PathBuf>,
    /// Without a GPU, pinpool runs on a backend that pins in name only
    /// (see [`pinpool::testing::Faults`]), so that its pinned bytes,
    /// registrations and regions show on a machine without one.
    pub emulate_pinning: bool,
}

/// A pinpool pool for `demand` with `settings`, on the CUDA backend when
/// `gpu` is given, else on the host backend.
pub fn pinpool(
    demand: &dyn Demand,
    settings: &Settings,
    gpu: Option<&[Arc<CudaContext>]>,
) -> Result<Pool, pinpool::Error> {
    pinpool_builder(demand, settings, gpu)?.build()
}

/// The builder of [`pinpool()`]'s pool, for a caller to add settings to.
pub fn pinpool_builder(
    demand: &dyn Demand,
    settings: &Settings,
    gpu: Option<&[Arc<CudaContext>]>,
) -> Result<PoolBuilder, pinpool::Error> {
    let builder = Pool::builder()
        .backend(if gpu.is_some() {
            BackendKind::Cuda
        } else {
            BackendKind::Host
        })
        .devices(demand.devices())
        .cleaner_threads(settings.cleaner_threads)
        .size_classes(settings.size_classes);
    let builder = match settings.max_pooled_bytes {
        Some(cap) => builder.max_pooled_bytes(cap),
        None => builder,
    }
    .try_conf(&settings.conf)?;
    let builder = if settings.emulate_pinning && gpu.is_none() {
        builder.faults(Arc::new(pinpool::testing::Faults::default()))
    } else {
        builder
    };
    match &settings.trace {
        Some(path) => Ok(builder.trace(path)),
        None => Ok(builder),
    }
}

/// Which strategy a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// This crate.
    Pinpool,
    /// The upper bound: every buffer prepared (pinned on a GPU) and zeroed
    /// before the run.
    Ideal,
    /// The workload's speed limit, wrong on purpose: the ideal strategy's
    /// buffers handed out again without re-zeroing them and without
    /// waiting for their copies.
    Limit,
    /// The design pinpool replaces (openvm cuda-common 2.0.1: global mutex,
    /// one cleaner with a 100 ms batching window).
    Seed,
    /// A fresh pageable Vec per take.
    Pageable,
    /// `cuMemHostAlloc` per take, freed after its copy (GPU only).
    HostAlloc,
}

impl Kind {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Pinpool => "pinpool",
            Kind::Ideal => "ideal",
            Kind::Limit => "limit",
            Kind::Seed => "seed",
            Kind::Pageable => "pageable",
            Kind::HostAlloc => "host-alloc",
        }
    }

    /// What the strategy is, in one line.
    pub fn legend(self) -> &'static str {
        match self {
            Kind::Pinpool => "this crate, with the settings above",
            Kind::Ideal => {
                "the upper bound: every buffer each prover needs (in pinpool's fine size \
                 classes), pre-faulted (pinned with cuMemHostAlloc on a GPU) and zeroed before \
                 the run (untimed); takes pop, give-backs re-zero on the prover's thread"
            }
            Kind::Limit => {
                "WRONG ON PURPOSE, never a real strategy: the workload's speed limit, ideal's \
                 buffers (pinned up front on a GPU) handed out again without re-zeroing them and \
                 without waiting for their copies, so only the workload's own work is left"
            }
            Kind::Seed => {
                "a faithful re-implementation of openvm cuda-common 2.0.1's pinned.rs (global \
                 mutex, one cleaner thread with a 100 ms batching window), for comparison"
            }
            Kind::Pageable => "a fresh pageable Vec per take",
            Kind::HostAlloc => "cuMemHostAlloc per take, freed after its copy (GPU only)",
        }
    }

    /// What the table says next to the strategy's name, if anything: the
    /// limit strategy is wrong on purpose.
    pub fn warning(self) -> Option<&'static str> {
        (self == Kind::Limit).then_some("wrong on purpose")
    }

    /// Whether the strategy prepares every buffer of the run before it
    /// (and needs the memory for them: [`IdealPool::bytes_needed`]).
    pub fn prepares_everything(self) -> bool {
        matches!(self, Kind::Ideal | Kind::Limit)
    }

    /// Whether the strategy can only run on a GPU.
    pub fn needs_gpu(self) -> bool {
        self == Kind::HostAlloc
    }
}

/// A strategy ready to serve takes.
pub enum Strategy {
    /// This crate.
    Pinpool(Pool),
    /// Every buffer prepared up front.
    Ideal(IdealPool),
    /// Every buffer prepared up front, reused dirty and while copied.
    Limit(LimitPool),
    /// The seed design.
    Seed(SeedPool),
    /// A fresh `Vec` per take.
    Pageable,
    /// `cuMemHostAlloc` per take.
    HostAlloc(HostAllocs),
}

/// The host-alloc strategy: the devices' contexts and what it page-locked.
#[derive(Debug)]
pub struct HostAllocs {
    contexts: Vec<Arc<CudaContext>>,
    /// `cuMemHostAlloc` calls made.
    allocations: AtomicU64,
    /// Bytes allocated and not yet freed.
    pinned: AtomicU64,
    /// The most of `pinned` at once.
    peak_pinned: AtomicU64,
}

/// A buffer taken from a strategy.
pub enum Staged<'a> {
    /// From pinpool.
    Pinpool(PinnedBuffer),
    /// From the ideal strategy's free lists, which it goes back to.
    Ideal(&'a IdealPool, IdealBuffer),
    /// From the limit strategy's free lists, which it goes back to as it
    /// is.
    Limit(&'a LimitPool, IdealBuffer),
    /// From the seed design.
    Seed(SeedBuffer),
    /// A fresh allocation.
    Pageable(Vec<u8>),
    /// Fresh `cuMemHostAlloc` memory, freed after its copy.
    HostAlloc(&'a HostAllocs, HostAlloc),
}

impl Strategy {
    /// A strategy of `kind` for `demand` with pinpool's `settings`, on
    /// the GPU when `gpu` is given. The ideal strategy prepares all its
    /// buffers here.
    pub fn new(
        kind: Kind,
        demand: &dyn Demand,
        settings: &Settings,
        gpu: Option<&[Arc<CudaContext>]>,
    ) -> Self {
        match kind {
            Kind::Pinpool => {
                Strategy::Pinpool(pinpool(demand, settings, gpu).expect("build the pool"))
            }
            Kind::Ideal => Strategy::Ideal(IdealPool::new(demand, gpu)),
            Kind::Limit => Strategy::Limit(LimitPool::new(demand, gpu)),
            Kind::Seed => Strategy::Seed(SeedPool::new(gpu.map(|g| g.to_vec()))),
            Kind::Pageable => Strategy::Pageable,
            Kind::HostAlloc => Strategy::HostAlloc(HostAllocs {
                contexts: gpu.expect("host-alloc runs on a GPU").to_vec(),
                allocations: AtomicU64::new(0),
                pinned: AtomicU64::new(0),
                peak_pinned: AtomicU64::new(0),
            }),
        }
    }

    /// Takes a zeroed buffer of at least `size` bytes for `prover`, which
    /// runs on `device` (and has its context bound, on a GPU).
    pub fn take(&self, prover: usize, device: usize, size: usize) -> Staged<'_> {
        match self {
            Strategy::Pinpool(pool) => Staged::Pinpool(pool.take_on(device, size).expect("take")),
            Strategy::Ideal(pool) => Staged::Ideal(pool, pool.take(prover, size)),
            Strategy::Limit(pool) => Staged::Limit(pool, pool.take(prover, size)),
            Strategy::Seed(pool) => Staged::Seed(pool.take(device, size)),
            Strategy::Pageable => Staged::Pageable(vec![0u8; size]),
            Strategy::HostAlloc(allocs) => {
                allocs.allocations.fetch_add(1, Ordering::Relaxed);
                let buf =
                    HostAlloc::new(&allocs.contexts[device], size, false).expect("cuMemHostAlloc");
                let bytes = size as u64;
                let now = allocs.pinned.fetch_add(bytes, Ordering::Relaxed) + bytes;
                allocs.peak_pinned.fetch_max(now, Ordering::Relaxed);
                Staged::HostAlloc(allocs, buf)
            }
        }
    }

    /// Ends `prover`'s run, after its last copy has finished.
    pub fn finish(&self, prover: usize) {
        if let Strategy::Ideal(pool) = self {
            pool.finish(prover);
        }
    }

    /// Waits until every buffer given back has been recycled.
    pub fn flush(&self) {
        match self {
            Strategy::Pinpool(pool) => pool.flush(),
            Strategy::Seed(pool) => pool.flush(),
            Strategy::Ideal(_)
            | Strategy::Limit(_)
            | Strategy::Pageable
            | Strategy::HostAlloc(_) => {}
        }
    }

    /// Bytes page-locked now.
    pub fn pinned_bytes(&self) -> u64 {
        match self {
            Strategy::Pinpool(pool) => pool.stats().pinned_bytes,
            Strategy::Ideal(pool) => pool.pinned_bytes(),
            Strategy::Limit(pool) => pool.pinned_bytes(),
            Strategy::Seed(pool) => pool.stats().pinned_bytes,
            Strategy::HostAlloc(allocs) => allocs.pinned.load(Ordering::Relaxed),
            Strategy::Pageable => 0,
        }
    }

    /// The most bytes page-locked at once, where the strategy keeps that
    /// count itself (exact, where sampling [`Strategy::pinned_bytes`] may
    /// miss a short peak).
    pub fn peak_pinned_bytes(&self) -> Option<u64> {
        match self {
            Strategy::Pinpool(pool) => Some(pool.stats().peak_pinned_bytes),
            Strategy::Ideal(pool) => Some(pool.pinned_bytes()),
            Strategy::Limit(pool) => Some(pool.pinned_bytes()),
            Strategy::Seed(pool) => Some(pool.stats().peak_pinned_bytes),
            Strategy::HostAlloc(allocs) => Some(allocs.peak_pinned.load(Ordering::Relaxed)),
            Strategy::Pageable => None,
        }
    }

    /// Calls that page-locked memory so far: `cuMemHostRegister` (pinpool,
    /// failed calls included; the seed design), `cuMemHostAlloc` (the
    /// ideal and limit strategies, all before the run; host-alloc, one per
    /// take).
    pub fn registrations(&self) -> u64 {
        match self {
            Strategy::Pinpool(pool) => {
                let s = pool.stats();
                s.registrations + s.registration_failures
            }
            Strategy::Ideal(pool) => pool.registrations(),
            Strategy::Limit(pool) => pool.registrations(),
            Strategy::Seed(pool) => pool.stats().registrations,
            Strategy::Pageable => 0,
            Strategy::HostAlloc(allocs) => allocs.allocations.load(Ordering::Relaxed),
        }
    }

    /// Which strategy this is.
    pub fn kind(&self) -> Kind {
        match self {
            Strategy::Pinpool(_) => Kind::Pinpool,
            Strategy::Ideal(_) => Kind::Ideal,
            Strategy::Limit(_) => Kind::Limit,
            Strategy::Seed(_) => Kind::Seed,
            Strategy::Pageable => Kind::Pageable,
            Strategy::HostAlloc(_) => Kind::HostAlloc,
        }
    }

    /// Releases everything held.
    pub fn shutdown(&self) {
        match self {
            Strategy::Pinpool(pool) => pool.shutdown(),
            Strategy::Seed(pool) => pool.shutdown(),
            Strategy::Ideal(_)
            | Strategy::Limit(_)
            | Strategy::Pageable
            | Strategy::HostAlloc(_) => {}
        }
    }
}

impl Staged<'_> {
    /// The bytes the buffer occupies: its length, or for a pinpool buffer
    /// borrowed from a larger class, that class's length.
    pub fn occupied(&mut self) -> usize {
        match self {
            Staged::Pinpool(buf) => buf.capacity(),
            other => other.bytes().len(),
        }
    }

    /// The buffer's bytes: as many as it was handed out with.
    pub fn bytes(&mut self) -> &mut [u8] {
        match self {
            Staged::Pinpool(buf) => buf,
            Staged::Ideal(_, buf) => buf,
            Staged::Limit(_, buf) => buf,
            Staged::Seed(buf) => buf.bytes(),
            Staged::Pageable(buf) => buf,
            Staged::HostAlloc(_, buf) => buf,
        }
    }

    /// Whether the take was served from a pool.
    pub fn hit(&self) -> bool {
        match self {
            Staged::Pinpool(buf) => buf.was_pooled(),
            Staged::Ideal(..) | Staged::Limit(..) => true,
            Staged::Seed(buf) => buf.hit(),
            Staged::Pageable(_) | Staged::HostAlloc(..) => false,
        }
    }

    /// Copies the first `written` bytes through `sink` and gives the buffer
    /// back to `prover`'s strategy as the real client does (right after
    /// enqueueing the copy); returns how long the give-back took.
    pub fn stage(self, prover: usize, written: usize, sink: &mut Sink) -> Duration {
        self.give_back(prover, written, Some(sink))
    }

    /// Gives the buffer, of which the first `written` bytes were written,
    /// back to the strategy of `prover` (the taker): after copying them
    /// through `sink`, when given, as [`Staged::stage`] does, else with no
    /// copy; returns how long the give-back took.
    pub fn give_back(mut self, prover: usize, written: usize, sink: Option<&mut Sink>) -> Duration {
        let copied = sink.is_some();
        let stream = sink.map(|sink| {
            sink.copy(&self.bytes()[..written]);
            &*sink
        });
        let stream = stream.and_then(Sink::stream);
        let started;
        match self {
            Staged::Pinpool(mut buf) => {
                buf.set_dirty_len(written);
                if let Some(stream) = stream {
                    buf.record_last_use(stream).expect("record last use");
                }
                started = Instant::now();
                drop(buf);
            }
            Staged::Ideal(pool, buf) => {
                started = Instant::now();
                pool.give_back(prover, buf, written, stream);
            }
            Staged::Limit(pool, buf) => {
                started = Instant::now();
                pool.give_back(prover, buf);
            }
            Staged::Seed(mut buf) => {
                buf.set_dirty_len(written);
                if let Some(stream) = stream {
                    buf.record_last_use(stream);
                }
                started = Instant::now();
                drop(buf);
            }
            Staged::Pageable(buf) => {
                started = Instant::now();
                drop(buf);
            }
            Staged::HostAlloc(allocs, buf) => {
                started = Instant::now();
                // Its copy has to finish before the memory is freed.
                if let (true, Some(stream)) = (copied, stream) {
                    stream.synchronize().expect("stream synchronize");
                }
                let bytes = buf.len() as u64;
                drop(buf);
                allocs.pinned.fetch_sub(bytes, Ordering::Relaxed);
            }
        }
        started.elapsed()
    }
}
