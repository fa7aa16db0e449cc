//! The staging strategies compared side by side.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{result, CudaContext};
use pinpool::{BackendKind, PinnedBuffer, Pool};

use crate::gpu::Sink;
use crate::run::Settings;
use crate::seed::{SeedBuffer, SeedPool};

/// Which strategy a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// This crate.
    Pinpool,
    /// The design pinpool replaces (global mutex, one batching cleaner).
    Seed,
    /// A fresh pageable allocation per take.
    Pageable,
    /// `cuMemHostAlloc` per take, freed after its copy (GPU only).
    HostAlloc,
}

impl Kind {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Pinpool => "pinpool",
            Kind::Seed => "seed",
            Kind::Pageable => "pageable",
            Kind::HostAlloc => "host-alloc",
        }
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
    /// The seed design.
    Seed(SeedPool),
    /// A fresh `Vec` per take.
    Pageable,
    /// `cuMemHostAlloc` per take.
    HostAlloc,
}

/// A buffer taken from a strategy.
pub enum Staged {
    /// From pinpool.
    Pinpool(PinnedBuffer),
    /// From the seed design.
    Seed(SeedBuffer),
    /// A fresh allocation.
    Pageable(Vec<u8>),
    /// `cuMemHostAlloc` memory: pointer and length.
    HostAlloc(*mut u8, usize),
}

// SAFETY: the `HostAlloc` pointer is owned exclusively by its `Staged`,
// like a `Box<[u8]>`; the other variants are `Send`.
unsafe impl Send for Staged {}

impl Strategy {
    /// A strategy of `kind` for `devices` devices with pinpool's
    /// `settings`, on the GPU when `gpu` is given.
    pub fn new(
        kind: Kind,
        devices: usize,
        settings: &Settings,
        gpu: Option<&[Arc<CudaContext>]>,
    ) -> Self {
        match kind {
            Kind::Pinpool => Strategy::Pinpool(
                Pool::builder()
                    .backend(if gpu.is_some() {
                        BackendKind::Cuda
                    } else {
                        BackendKind::Host
                    })
                    .devices(devices)
                    .cleaner_threads(settings.cleaner_threads)
                    .max_pooled_bytes(settings.max_pooled_bytes)
                    .size_classes(settings.size_classes)
                    .build()
                    .expect("build the pool"),
            ),
            Kind::Seed => Strategy::Seed(SeedPool::new(gpu.map(|g| g.to_vec()))),
            Kind::Pageable => Strategy::Pageable,
            Kind::HostAlloc => Strategy::HostAlloc,
        }
    }

    /// Takes a zeroed buffer of at least `size` bytes for `device`.
    pub fn take(&self, device: usize, size: usize) -> Staged {
        match self {
            Strategy::Pinpool(pool) => Staged::Pinpool(pool.take_on(device, size).expect("take")),
            Strategy::Seed(pool) => Staged::Seed(pool.take(device, size)),
            Strategy::Pageable => Staged::Pageable(vec![0u8; size]),
            Strategy::HostAlloc => {
                // SAFETY: the prover thread has its device's context bound;
                // the result is checked and freed in `stage`.
                let ptr =
                    unsafe { result::malloc_host(size, 0) }.expect("cuMemHostAlloc") as *mut u8;
                Staged::HostAlloc(ptr, size)
            }
        }
    }

    /// Waits until every buffer given back has been recycled.
    pub fn flush(&self) {
        match self {
            Strategy::Pinpool(pool) => pool.flush(),
            Strategy::Seed(pool) => pool.flush(),
            Strategy::Pageable | Strategy::HostAlloc => {}
        }
    }

    /// Bytes page-locked now.
    pub fn pinned_bytes(&self) -> u64 {
        match self {
            Strategy::Pinpool(pool) => pool.stats().pinned_bytes,
            Strategy::Seed(pool) => pool.stats().pinned_bytes,
            Strategy::Pageable | Strategy::HostAlloc => 0,
        }
    }

    /// Releases everything held.
    pub fn shutdown(&self) {
        match self {
            Strategy::Pinpool(pool) => pool.shutdown(),
            Strategy::Seed(pool) => pool.shutdown(),
            Strategy::Pageable | Strategy::HostAlloc => {}
        }
    }
}

impl Staged {
    /// The buffer's bytes.
    pub fn bytes(&mut self) -> &mut [u8] {
        match self {
            Staged::Pinpool(buf) => buf,
            Staged::Seed(buf) => buf.bytes(),
            Staged::Pageable(buf) => buf,
            // SAFETY: `ptr` holds `len` bytes owned by this value.
            Staged::HostAlloc(ptr, len) => unsafe { std::slice::from_raw_parts_mut(*ptr, *len) },
        }
    }

    /// Whether the take was served from a pool.
    pub fn hit(&self) -> bool {
        match self {
            Staged::Pinpool(buf) => buf.was_pooled(),
            Staged::Seed(buf) => buf.hit(),
            Staged::Pageable(_) | Staged::HostAlloc(..) => false,
        }
    }

    /// Copies the first `written` bytes through `sink` and gives the buffer
    /// back as the real client does (drop right after enqueueing); returns
    /// how long the give-back took.
    pub fn stage(mut self, written: usize, sink: &mut Sink) -> Duration {
        sink.copy(&self.bytes()[..written]);
        match self {
            Staged::Pinpool(mut buf) => {
                buf.set_dirty_len(written);
                if let Some(stream) = sink.stream() {
                    buf.record_last_use(stream).expect("record last use");
                }
                let started = Instant::now();
                drop(buf);
                started.elapsed()
            }
            Staged::Seed(mut buf) => {
                buf.set_dirty_len(written);
                if let Some(stream) = sink.stream() {
                    buf.record_last_use(stream);
                }
                let started = Instant::now();
                drop(buf);
                started.elapsed()
            }
            Staged::Pageable(buf) => {
                let started = Instant::now();
                drop(buf);
                started.elapsed()
            }
            Staged::HostAlloc(ptr, _) => {
                let started = Instant::now();
                sink.synchronize();
                // SAFETY: allocated by `malloc_host` in `take`; its copy has
                // finished (the stream was synchronized).
                unsafe { result::free_host(ptr.cast()) }.expect("cuMemFreeHost");
                started.elapsed()
            }
        }
    }
}
