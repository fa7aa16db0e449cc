//! The pool: what its handles share ([`Shared`]), the handle ([`Pool`])
//! and its builder glue. The rest of the pool's work lives in the children:
//!
//! - `take.rs`: the take path. A take looks in the calling thread's cache
//!   ([`thread_cache`]), then its device's [shard](crate::shard), then
//!   borrows a ready buffer of a larger class within the borrow slack,
//!   then steals from other threads' caches, then carves from the regions,
//!   then waits for its own buffers of the class if two or more are in
//!   flight, and on a miss maps a fresh pageable buffer.
//! - `life.rs`: the life cycle: `reserve`, `flush`, `clear`, `shutdown`,
//!   and the close when the last handle goes (with what the reaper does
//!   for a closed pool's late buffers).
//! - `snapshot.rs`: the statistics snapshot.
//!
//! A drop goes down the other way: the buffer, its thread cache, and the
//! cleaner's [intake](crate::cleaner::intake); the cleaner hands ready
//! buffers to [admission](crate::admission). The [design
//! account](crate::implementation) tells the whole journey.
//!
//! [`thread_cache`]: crate::thread_cache

mod life;
mod snapshot;
mod take;

use crate::admission::{Admission, Places};
use crate::backend::{self, Backend, BackendKind};
use crate::buffer::PinnedBuffer;
use crate::cleaner::intake::Intake;
use crate::cleaner::{Cleaner, Env};
use crate::config::{Config, PoolBuilder};
use crate::error::Error;
use crate::numa::{self, Placement, Topology};
use crate::provision::Provisioner;
use crate::shard::Shard;
use crate::size_class::Classes;
use crate::stats::{Counters, Stats};
use crate::sync::{barrier, Arc, AtomicBool, Ordering};
use crate::thread_cache::Caches;
use crate::trace::writer::Tracer;
use std::ptr::NonNull;
use std::time::Instant;

use crossbeam_utils::CachePadded;

/// Everything a pool shares between its handles, its threads and its
/// cleaner workers.
pub(crate) struct Shared {
    /// The settings built with; the cap in them is the one at build time
    /// (the live one is `caches.cap()`).
    config: Config,
    pub(crate) caches: Box<Caches>,
    pub(crate) shards: Box<[Shard]>,
    pub(crate) admission: Admission,
    pub(crate) cleaner: Cleaner,
    pub(crate) provisioner: Provisioner,
    /// Set once the last handle is gone: no worker starts again.
    closed: AtomicBool,
    /// Whether the pinned budget was given (else it is the default share
    /// of memory).
    pub(crate) budget_given: AtomicBool,
    /// Whether every thread's current device is 0 (no CUDA contexts).
    device_zero: bool,
    /// When the pool was built (the steal rate limit's clock).
    epoch: Instant,
    /// See [`Config::borrow_slack`].
    borrow_slack: u32,
    /// Each device's host NUMA node, and the node cleaner workers run on.
    placement: Placement,
    /// Declared last, so dropped last: the caches point to it (for the
    /// CUDA contexts of raw-stream fences), and only the backend's drop puts back
    /// the thread's current context that releasing the last reference to a
    /// context changes (see [`CudaBackend`](crate::backend::cuda::CudaBackend)).
    pub(crate) backend: Box<dyn Backend>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("backend", &self.backend)
            .field("cleaner", &self.cleaner)
            .finish_non_exhaustive()
    }
}

// === impl Shared ===

impl Shared {
    pub(crate) fn places(&self) -> Places<'_> {
        Places {
            shards: &self.shards,
            caches: &self.caches,
        }
    }

    pub(crate) fn env(&self) -> Env<'_> {
        Env {
            backend: &*self.backend,
            admission: &self.admission,
            places: self.places(),
            provisioner: &self.provisioner,
        }
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.caches.counters
    }

    /// What releasing one of the pool's buffers needs.
    pub(crate) fn releaser(&self) -> crate::cleaner::Releaser<'_> {
        crate::cleaner::Releaser {
            backend: &*self.backend,
            counters: &self.caches.counters,
            events: &self.caches.events,
            trace: self.caches.trace.as_deref(),
        }
    }

    pub(crate) fn classes(&self) -> &Classes {
        &self.caches.classes
    }

    /// Starts the cleaner's workers unless they run or the pool is closed.
    pub(super) fn start_cleaner(this: &Arc<Self>) {
        // Relaxed: `closed` is set before the last handle's close stops the
        // workers; a start that misses it is stopped by that close.
        if this.cleaner.is_running() || this.closed.load(Ordering::Relaxed) {
            return;
        }
        this.cleaner.start(|index| {
            let shared = Arc::clone(this);
            this.backend.spawn(
                format!("pinpool-cleaner-{index}"),
                Box::new(move || {
                    // With every placed device on one node, pre-faulting
                    // and zeroing from that node's CPUs keeps the traffic
                    // local. Work is not routed by node, so with devices on
                    // several nodes workers stay unpinned; the pages land
                    // on each device's node through the blocks' memory
                    // policy either way.
                    if let Some(node) = shared.placement.worker_node() {
                        if let Err(error) = numa::pin_current_thread(&node.cpus) {
                            tracing::debug!(worker = index, node = node.id, %error,
                                "pinpool: cleaner worker not pinned to its NUMA node");
                        }
                    }
                    shared.cleaner.work(shared.env(), index)
                }),
            )
        });
    }
}

/// Owns the pool on behalf of the user's handles; dropping the last one
/// closes the pool.
///
/// The handles share it through an `Arc` of a cache-padded value, so that
/// cloning or dropping a handle (the `Arc`'s counts) does not write the line
/// that every take reads.
#[derive(Debug)]
struct Handle {
    shared: Arc<Shared>,
    /// `shared.caches`, and `shared.device_zero`, beside the `Arc`: a take
    /// reads them without first loading the shared state's address.
    caches: NonNull<Caches>,
    device_zero: bool,
}

// SAFETY: `caches` points into the boxed caches of `shared`, which the
// handle keeps alive and which are `Sync`; the rest is `Send + Sync`.
unsafe impl Send for Handle {}
// SAFETY: as above.
unsafe impl Sync for Handle {}

impl Handle {
    #[inline]
    fn caches(&self) -> &Caches {
        // SAFETY: see the `Send` impl: the box lives as long as `shared`.
        unsafe { self.caches.as_ref() }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        Shared::close(&self.shared);
    }
}

/// A pool of page-locked host buffers: a cheap, cloneable handle.
///
/// Dropping the last handle closes the pool; buffers still out are freed
/// (by a background thread) when they are dropped.
///
/// # Examples
///
/// ```
/// use pinpool::{BackendKind, Pool};
///
/// let pool = Pool::builder().backend(BackendKind::Host).build()?;
/// let mut buf = pool.take(3);
/// assert_eq!(buf.len(), 4);
/// buf.copy_from_slice(&[1, 2, 3, 4]);
/// drop(buf); // back to the cleaner: re-zeroed, then ready again
/// pool.flush();
/// let buf = pool.take(4);
/// assert_eq!(&buf[..], &[0, 0, 0, 0]);
/// # Ok::<(), pinpool::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Pool {
    handle: Arc<CachePadded<Handle>>,
}

// === impl Pool ===

impl Pool {
    /// A builder with the default settings.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// assert_eq!(pool.backend(), pinpool::BackendKind::Host);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn builder() -> PoolBuilder {
        PoolBuilder::default()
    }

    pub(crate) fn from_config(config: Config, trace_lenient: bool) -> Result<Self, Error> {
        let backend = backend::select(config.backend, config.devices)?;
        Self::with_backend(config, backend, trace_lenient)
    }

    pub(crate) fn with_backend(
        mut config: Config,
        backend: Box<dyn Backend>,
        trace_lenient: bool,
    ) -> Result<Self, Error> {
        barrier::init();
        let devices = backend.device_count();
        if devices > crate::backend::MAX_DEVICES {
            return Err(crate::backend::too_many_devices(devices));
        }
        let classes = Classes::new(config.size_classes, crate::size_class::page_size());
        let trace = match &config.trace {
            None => None,
            Some(path) => {
                let sizes = classes.all().map(|c| classes.size(c) as u64).collect();
                match Tracer::start(path, trace_header(&config, &*backend), sizes, trace_lenient) {
                    Ok((tracer, path)) => {
                        config.trace = Some(path);
                        Some(tracer)
                    }
                    Err(source) if trace_lenient => {
                        tracing::warn!(path = %path.display(), error = %source,
                        "pinpool: cannot write the trace file; running untraced");
                        eprintln!(
                            "pinpool: cannot write the trace file {}: {source}; running untraced",
                            path.display()
                        );
                        config.trace = None;
                        None
                    }
                    Err(source) => {
                        return Err(Error::Trace {
                            path: path.clone(),
                            source,
                        })
                    }
                }
            }
        };
        let count = classes.count();
        let pins = backend.pins();
        // Only pinned memory is worth placing; other backends (the host
        // one, the loom models) skip reading the topology.
        let placement = if pins {
            Placement::choose(config.numa, &Topology::discover(), &backend.numa_hints())
        } else {
            Placement::unplaced(devices)
        };
        let intake = Arc::new(Intake::new(
            config.cleaner_threads,
            devices,
            pins,
            config.regions,
        ));
        // The budget, read from the machine unless given, and the cap: the
        // one given, or the floor of one that follows the working set.
        let budget = config
            .max_pinned_bytes
            .unwrap_or_else(crate::budget::default_budget);
        // The budget bounds only a backend that pins.
        let floor = if pins {
            config.min_pooled_bytes.min(budget)
        } else {
            config.min_pooled_bytes
        };
        let mut caches = Caches::new(
            classes,
            devices,
            config.thread_cache_bytes,
            config.max_pooled_bytes.unwrap_or(floor),
            pins,
            NonNull::from(&*backend),
            Arc::clone(&intake),
        );
        if let Some(tracer) = trace {
            caches.trace_to(tracer);
        }
        let shared = Arc::new(Shared {
            caches,
            shards: (0..devices)
                .map(|device| Shard::new(count, placement.node(device).map(|n| n.id)))
                .collect(),
            admission: Admission::new(
                config
                    .max_pooled_bytes
                    .is_none()
                    .then_some(config.min_pooled_bytes),
                devices * count,
            ),
            budget_given: AtomicBool::new(config.max_pinned_bytes.is_some()),
            cleaner: Cleaner::new(config.cleaner_threads, devices, intake),
            provisioner: Provisioner::new(
                devices * count,
                devices,
                config.provision,
                config.idle_trim,
            ),
            closed: AtomicBool::new(false),
            device_zero: backend.kind() == BackendKind::Host,
            epoch: Instant::now(),
            borrow_slack: config.borrow_slack,
            placement,
            config,
            backend,
        });
        shared.counters().set_max_pinned(budget as u64);
        Shared::start_cleaner(&shared);
        Ok(Self {
            handle: Arc::new(CachePadded::new(Handle {
                caches: NonNull::from(&*shared.caches),
                device_zero: shared.device_zero,
                shared,
            })),
        })
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.handle.shared
    }

    /// How many devices the pool serves.
    #[cfg(feature = "allocator-api2")]
    pub(crate) fn devices(&self) -> usize {
        self.handle.caches().devices()
    }

    /// An all-zero buffer of at least `min_size` bytes, rounded up to its
    /// size class (see [`SizeClasses`](crate::SizeClasses)), from the shard
    /// of the calling thread's *current device*: the device of the CUDA
    /// context current on the calling thread, device 0 if none is (and
    /// always 0 on the host backend).
    ///
    /// Page-locked on a pool hit (a ready buffer, or one carved from a
    /// region's free extents); on a miss a fresh pageable buffer, which the
    /// cleaner frees when it is dropped, growing the regions by what the
    /// takes wanted (or, with [`regions`](crate::PoolBuilder::regions)
    /// off, registers on its own). Pinning never happens on the caller's
    /// path.
    ///
    /// A take may wait for the copies of the calling thread's own earlier
    /// buffers of the class (dropped after [`record_last_use`](crate::PinnedBuffer::record_last_use)
    /// or a copy through cudarc), as a double-buffered loop waits for its
    /// event, rather than queue more copies behind them: up to 20 ms for
    /// the oldest when two more are in flight behind it; and, where the
    /// pool has nothing else to give and two or more are in flight, for as
    /// long as the pool's other copies keep ending, up to 1 s (it misses
    /// once none has ended for 100 ms, and the thread's takes then do not
    /// wait for the next 100 ms; after a whole second's wait that ends in
    /// a miss, for the next second). Such a wait counts as demand, as a
    /// miss does: the pool grows its regions for it.
    /// [`Stats::own_waits`](crate::Stats::own_waits) counts the takes that
    /// wait (once each, whether they wait once or twice), and
    /// [`own_wait_time`](crate::Stats::own_wait_time) how long they wait.
    ///
    /// # Panics
    ///
    /// If `min_size` is above [`MAX_CLASS_SIZE`](crate::MAX_CLASS_SIZE), the
    /// memory cannot be mapped, or the current device is not served; use
    /// [`try_take`](Self::try_take) to get an error instead.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// let buf = pool.take(1000);
    /// assert_eq!(buf.len(), 1024);
    /// assert!(buf.iter().all(|&b| b == 0));
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    #[inline]
    #[track_caller]
    pub fn take(&self, min_size: usize) -> PinnedBuffer {
        match self.try_take(min_size) {
            Ok(buf) => buf,
            Err(e) => panic!("pinpool: take({min_size}) failed: {e}"),
        }
    }

    /// Like [`take`](Self::take), but returns an error instead of panicking.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// assert!(pool.try_take(usize::MAX).is_err());
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    #[inline]
    pub fn try_take(&self, min_size: usize) -> Result<PinnedBuffer, Error> {
        let device = if self.handle.device_zero {
            0
        } else {
            self.shared().backend.current_device()
        };
        self.take_on(device, min_size)
    }

    /// Like [`try_take`](Self::try_take), from the shard of `device`.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder()
    ///     .backend(pinpool::BackendKind::Host)
    ///     .devices(2)
    ///     .build()?;
    /// assert_eq!(pool.take_on(1, 64)?.device(), 1);
    /// assert!(pool.take_on(2, 64).is_err());
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    #[inline]
    pub fn take_on(&self, device: usize, min_size: usize) -> Result<PinnedBuffer, Error> {
        Shared::take(self.shared(), self.handle.caches(), device, min_size)
    }

    /// Pins buffers ahead of demand, off the caller's path: `count` buffers
    /// of each `(size, count)` for `device`, registered (on the CUDA
    /// backend), pre-faulted and pooled by the cleaner; `flush` waits for
    /// them. Reserved buffers count against the cap like any other (and may
    /// be evicted by it), but idle trimming keeps them until the next
    /// [`clear`](Self::clear), which forgets every reservation made before
    /// it (a reserved buffer taken or in the cleaner at the clear is, once
    /// back, an idle buffer like any other). While the cap follows the
    /// working set (no cap given), it rises by the bytes reserved, and
    /// holds every byte reserved since the last `clear` on top of what it
    /// follows.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownDevice`], [`Error::SizeTooLarge`] for a size above
    /// the largest class, [`Error::ReserveExceedsMemory`] if the buffers'
    /// bytes exceed this host's physical memory (checked whatever the cap,
    /// before anything is mapped), [`Error::ReserveTooLarge`] if they
    /// exceed a cap given, [`Error::ReservePastPinnedBudget`] if they exceed
    /// what the pinned budget has left, or [`Error::AllocationFailed`];
    /// nothing is reserved then.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// pool.reserve(0, &[(8 << 20, 2), (64 << 10, 16)])?;
    /// pool.flush();
    /// assert_eq!(pool.stats().pooled_buffers, 18);
    /// assert!(pool.take(8 << 20).was_pooled());
    /// let capped = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).max_pooled_bytes(1 << 30).build()?;
    /// assert!(capped.reserve(0, &[(1 << 30, 2)]).is_err()); // 2 GiB > the 1 GiB cap
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn reserve(&self, device: usize, sizes: &[(usize, usize)]) -> Result<(), Error> {
        Shared::reserve(self.shared(), device, sizes)
    }

    /// Sets the cap on pooled bytes (thread caches included): from now on
    /// it stays at `bytes` and no longer follows the working set (see
    /// [`PoolBuilder::max_pooled_bytes`](crate::PoolBuilder::max_pooled_bytes)).
    /// Lowering it evicts at once, largest buffers first; 0 turns pooling
    /// off.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// drop(pool.take(1 << 20));
    /// pool.flush();
    /// pool.set_max_pooled_bytes(0);
    /// assert_eq!(pool.stats().pooled_bytes, 0);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn set_max_pooled_bytes(&self, bytes: usize) {
        self.shared().set_max_pooled_bytes(bytes);
    }

    /// Sets the pinned budget (see
    /// [`PoolBuilder::max_pinned_bytes`](crate::PoolBuilder::max_pinned_bytes);
    /// `usize::MAX`: no bound). Lowering it below the bytes pinned now
    /// releases idle pooled buffers at once, largest first, until the
    /// pinned bytes fit or no idle buffer is left; buffers in use stay
    /// pinned until they are dropped, and while the pinned bytes are past
    /// the budget a dropped pinned buffer is released instead of pooled
    /// and no buffer is registered. With regions
    /// ([`PoolBuilder::regions`](crate::PoolBuilder::regions)), what is
    /// released at once is the regions wholly free: one registration cannot
    /// be released in part, so the free extents of a region with a buffer
    /// in use stay pinned until its last buffer comes back. A buffer out at
    /// the call that comes back without passing through the cleaner (reused
    /// by its owner's thread and then swept to the pool, for one) is
    /// released at the cleaner's next provisioning tick (every few
    /// milliseconds while it works, at most 100 ms apart while the pool is
    /// quiet), with the regions it leaves wholly free, until the pinned
    /// bytes fit.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// pool.set_max_pinned_bytes(1 << 30);
    /// assert_eq!(pool.stats().max_pinned_bytes, 1 << 30);
    /// assert_eq!(pool.config().max_pinned_bytes, Some(1 << 30));
    /// assert_eq!(pool.stats().max_pinned_bytes_from, pinpool::LimitSource::Given);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn set_max_pinned_bytes(&self, bytes: usize) {
        self.shared().set_max_pinned_bytes(bytes);
    }

    /// Blocks until every buffer dropped before the call (on any thread)
    /// has been recycled (and is ready to take) or released, and, with
    /// [`regions`](crate::PoolBuilder::regions), every growth of the
    /// regions under way at the call has ended (it may be meeting the
    /// demand of misses dropped before the call), however long its
    /// registration takes.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// drop(pool.take(4096));
    /// pool.flush();
    /// assert_eq!(pool.stats().in_cleaner, 0);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn flush(&self) {
        Shared::flush(self.shared());
    }

    /// Unregisters and frees every pooled buffer, thread caches included.
    /// Buffers still in the cleaner are not touched; `shutdown` drains them
    /// first. Reservations made before the call are forgotten (see
    /// [`reserve`](Self::reserve)); one that another thread makes while
    /// the call runs is forgotten whole or kept whole, its buffers left
    /// pooled.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// drop(pool.take(4096));
    /// pool.flush();
    /// pool.clear();
    /// assert_eq!(pool.stats().pooled_bytes, 0);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn clear(&self) {
        self.shared().clear();
    }

    /// Drains the cleaner (as [`flush`](Self::flush)), stops and joins its
    /// workers, then unregisters and frees every pooled buffer. The pool
    /// keeps working afterwards: the next take that misses its thread's
    /// cache, or the next `flush`, starts the cleaner again.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// drop(pool.take(4096));
    /// pool.shutdown();
    /// assert_eq!(pool.stats().pooled_buffers, 0);
    /// drop(pool.take(4096)); // still works
    /// pool.flush();
    /// assert_eq!(pool.stats().pooled_buffers, 1);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn shutdown(&self) {
        Shared::shutdown(self.shared());
    }

    /// A snapshot of the pool's counters.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// drop(pool.take(4096));
    /// pool.flush();
    /// println!("{}", pool.stats());
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn stats(&self) -> Stats {
        self.shared().stats()
    }

    /// Gives idle pooled buffers back to the OS now, largest first, keeping
    /// those [`reserve`](Self::reserve) pinned and, with provisioning on,
    /// those that recent demand needs (the buffers in use at the recent
    /// peak of each class). The cleaner does the same on its own for
    /// buffers idle longer than [`Config::idle_trim`].
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).provision(false).build()?;
    /// drop(pool.take(1 << 20));
    /// pool.flush();
    /// pool.trim();
    /// let stats = pool.stats();
    /// assert_eq!(stats.pooled_buffers, 0);
    /// assert_eq!(stats.trimmed_bytes, 1 << 20);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn trim(&self) {
        let shared = self.shared();
        shared.cleaner.provision(shared.env(), true);
    }

    /// Restarts the peaks of [`Stats`] (`peak_pooled_bytes`,
    /// `peak_pinned_bytes`, `peak_in_use_bytes`) from the levels now, and its drop-to-ready
    /// quantiles from no buffers (so that a warm-up's first registrations,
    /// say, do not count in the figures of the work after it).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// drop(pool.take(1 << 20));
    /// pool.flush();
    /// pool.clear();
    /// pool.reset_peaks();
    /// let stats = pool.stats();
    /// assert_eq!(stats.peak_pooled_bytes, 0);
    /// assert_eq!(stats.drop_to_ready_p99, None);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn reset_peaks(&self) {
        let shared = self.shared();
        shared.admission.reset_peak(shared.places());
        shared.counters().reset_peak_pinned();
        shared.counters().reset_peak_in_use(shared.in_use_bytes());
        shared.counters().reset_ready_latency();
    }

    /// The settings the pool runs with: the cap as last set (`None` while
    /// it follows the working set), the budget as last set (`None` while it
    /// is the default; [`stats`](Self::stats) says what both are now).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).cleaner_threads(3).build()?;
    /// assert_eq!(pool.config().cleaner_threads, 3);
    /// pool.set_max_pooled_bytes(1 << 20);
    /// assert_eq!(pool.config().max_pooled_bytes, Some(1 << 20));
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn config(&self) -> Config {
        let shared = self.shared();
        // Relaxed: a setting, as the budget it goes with.
        let budget_given = shared.budget_given.load(Ordering::Relaxed);
        Config {
            max_pooled_bytes: match shared.admission.cap_and_follows(shared.places()) {
                (_, true) => None,
                (cap, false) => Some(cap),
            },
            max_pinned_bytes: budget_given
                .then(|| usize::try_from(shared.counters().max_pinned()).unwrap_or(usize::MAX)),
            ..shared.config.clone()
        }
    }

    /// The backend in use (never [`BackendKind::Auto`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().build()?; // Auto
    /// assert_ne!(pool.backend(), pinpool::BackendKind::Auto);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn backend(&self) -> BackendKind {
        self.shared().backend.kind()
    }

    /// Page-locks `[ptr, ptr + len)` for all contexts with this pool's
    /// backend; returns whether it worked (always `false` on the host
    /// backend).
    ///
    /// # Safety
    /// The range is a live allocation that stays mapped until it is
    /// unregistered with [`unregister_region`](Self::unregister_region).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// let mut region = vec![0u8; 4096];
    /// // SAFETY: `region` is live; nothing was registered (host backend).
    /// assert!(!unsafe { pool.register_region(region.as_mut_ptr(), region.len()) });
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub unsafe fn register_region(&self, ptr: *mut u8, len: usize) -> bool {
        let backend = &self.shared().backend;
        if !backend.pins() {
            return false;
        }
        // SAFETY: forwarded from the caller.
        match unsafe { backend.register(region_device(&**backend), ptr, len) } {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = %e, "pinpool: register_region failed; the region stays pageable");
                false
            }
        }
    }

    /// Reverses a successful [`register_region`](Self::register_region). If
    /// the driver refuses, the region stays registered (and must not be
    /// freed yet): the failure is counted in
    /// [`Stats::unregister_failures`] and logged at warning level.
    ///
    /// # Safety
    /// `ptr` was registered by `register_region`, and no copy from it is in
    /// flight.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// let mut region = vec![0u8; 4096];
    /// // SAFETY: `region` outlives its registration, and nothing copies from it.
    /// unsafe {
    ///     if pool.register_region(region.as_mut_ptr(), region.len()) {
    ///         pool.unregister_region(region.as_mut_ptr());
    ///     }
    /// }
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub unsafe fn unregister_region(&self, ptr: *mut u8) {
        let backend = &self.shared().backend;
        if !backend.pins() {
            return;
        }
        // SAFETY: forwarded from the caller.
        if let Err(e) = unsafe { backend.unregister(region_device(&**backend), ptr) } {
            Counters::add(&self.shared().counters().unregister_failures, 1);
            tracing::warn!(error = %e, "pinpool: unregister_region failed; the region stays registered");
        }
    }
}

/// A trace's header: the crate, the machine, the backend and the settings.
fn trace_header(config: &Config, backend: &dyn Backend) -> crate::trace::Header {
    let one_line = |v: String| v.replace(['\n', '\r'], " ");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    // The processor's name as the system gives it (x86 and most others).
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        });
    let mut entries = vec![
        ("pinpool".to_string(), env!("CARGO_PKG_VERSION").to_string()),
        ("host".to_string(), one_line(host)),
        ("os".to_string(), std::env::consts::OS.to_string()),
        ("arch".to_string(), std::env::consts::ARCH.to_string()),
        ("cores".to_string(), cores.to_string()),
    ];
    if let Some(cpu) = cpu {
        entries.push(("cpu".to_string(), one_line(cpu)));
    }
    if let Some(bytes) = crate::budget::host_memory_bytes() {
        entries.push(("memory_bytes".to_string(), bytes.to_string()));
    }
    entries.extend([
        ("started_unix_ms".to_string(), started.to_string()),
        ("backend".to_string(), backend.kind().to_string()),
        ("devices".to_string(), backend.device_count().to_string()),
    ]);
    // Each GPU's name, on the CUDA backend.
    for device in 0..backend.device_count() {
        if let Some(name) = backend.context(device).and_then(|c| c.name().ok()) {
            entries.push((format!("gpu.{device}"), one_line(name)));
        }
    }
    entries.extend(
        config
            .conf_pairs()
            .into_iter()
            .map(|(k, v)| (format!("setting.{k}"), one_line(v))),
    );
    crate::trace::Header { entries }
}

/// The device whose context a region is registered or unregistered in:
/// the calling thread's current device if the pool serves it, else device
/// 0. Registrations are portable, so any of the pool's contexts will do,
/// and a region may be given back under another current device than it
/// was registered under.
fn region_device(backend: &dyn Backend) -> usize {
    let device = backend.current_device();
    if device < backend.device_count() {
        device
    } else {
        0
    }
}

/// The builder's last step lives here, beside the pool it builds, so that
/// the configuration does not depend on the pool.
impl PoolBuilder {
    /// Builds the pool and starts its cleaner.
    ///
    /// Fails on out-of-range values, or when the CUDA backend is asked for
    /// and cannot be used.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// drop(pool.take(1));
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn build(self) -> Result<Pool, Error> {
        self.config.validate()?;
        #[cfg(feature = "testing")]
        {
            let no_idle_sweeps = self.no_idle_sweeps;
            let pool = if let Some(faults) = self.faults {
                let devices = self.config.devices.unwrap_or(1);
                let backend = Box::new(crate::backend::fault::FaultBackend::new(faults, devices));
                Pool::with_backend(self.config, backend, self.trace_lenient)?
            } else {
                Pool::from_config(self.config, self.trace_lenient)?
            };
            if no_idle_sweeps {
                // Before any take: a sweep before this finds no owner.
                pool.shared().cleaner.stop_idle_sweeps();
            }
            Ok(pool)
        }
        #[cfg(not(feature = "testing"))]
        Pool::from_config(self.config, self.trace_lenient)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Every path a ready buffer takes into or out of a cache's own lists
    /// (collection, steals adopting other inboxes, borrows, sweeps to the
    /// shards, eviction, trimming, clearing) keeps the inbox's count of
    /// listed bytes: once everything is cleared, every cache lists none.
    #[test]
    fn listed_bytes_balance_once_every_ready_list_is_emptied() {
        let pool = Pool::builder()
            .backend(BackendKind::Host)
            .cleaner_threads(2)
            .thread_cache_bytes(1 << 20)
            .build()
            .unwrap();
        let sizes = [64usize, 1000, 4096, 5000, 20_000, 70_000, 300_000];
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..4).map(|_| mpsc::channel::<PinnedBuffer>()).unzip();
        std::thread::scope(|s| {
            for (t, rx) in rxs.into_iter().enumerate() {
                let pool = pool.clone();
                let txs = txs.clone();
                s.spawn(move || {
                    let mut held = Vec::new();
                    for i in 0..3000usize {
                        let size = sizes[(i * 7 + t * 3) % sizes.len()];
                        let mut buf = pool.take(size);
                        buf[0] = 1;
                        buf.set_dirty_len(1);
                        match i % 5 {
                            0 => {
                                let _ = txs[(t + 1) % txs.len()].send(buf);
                            }
                            1 | 2 => held.push(buf),
                            _ => drop(buf),
                        }
                        if held.len() > 8 {
                            held.drain(..4);
                        }
                        while let Ok(buf) = rx.try_recv() {
                            drop(buf);
                        }
                        if i % 500 == 0 {
                            pool.flush();
                        }
                    }
                    drop(held);
                    drop(txs);
                    while let Ok(buf) = rx.recv_timeout(Duration::from_millis(50)) {
                        drop(buf);
                    }
                });
            }
            drop(txs);
            for round in 0..40 {
                std::thread::sleep(Duration::from_millis(5));
                match round % 4 {
                    0 => pool.set_max_pooled_bytes(256 << 10),
                    1 => pool.set_max_pooled_bytes(64 << 20),
                    2 => pool.trim(),
                    _ => pool.clear(),
                }
            }
        });
        pool.flush();
        pool.clear();
        let shared = pool.shared();
        for cache in shared.caches.iter() {
            assert_eq!(cache.inbox().listed(), 0, "listed bytes drifted");
            for slot in 0..shared.caches.slots() {
                assert_eq!(cache.ready_in(slot), 0);
            }
        }
    }
}
