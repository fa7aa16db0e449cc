//! The pool: what its handles share, the take path, and the life cycle
//! (flush, clear, shutdown, close).
//!
//! A take looks in the calling thread's cache ([`thread_cache`]), then its
//! device's [shard](crate::shard), then other threads' caches (a steal),
//! and on a miss maps a fresh pageable buffer. A drop goes back through the
//! buffer's cache to the [cleaner], which hands ready
//! buffers to [admission](crate::admission). IMPLEMENTATION.md tells the
//! whole journey.
//!
//! [`thread_cache`]: crate::thread_cache

use crate::admission::{Admission, Places};
use crate::alloc::Block;
use crate::backend::{self, Backend, BackendKind};
use crate::buffer::PinnedBuffer;
use crate::cleaner::{self, Cleaner, Env, Late, Returned};
use crate::config::{Config, PoolBuilder};
use crate::error::Error;
use crate::numa::{self, Placement, Topology};
use crate::provision::Provisioner;
use crate::reaper::{self, Message, Retire};
use crate::shard::Shard;
use crate::size_class::{Classes, SizeClass};
use crate::stats::{ClassStats, Counters, DeviceStats, Stats};
use crate::sync::{barrier, Arc, AtomicBool, Ordering};
use crate::thread_cache::{Caches, Found, Sink, ThreadCache};
use crate::tune::{Tune, Tuning};
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
    /// Whether every thread's current device is 0 (no CUDA contexts).
    device_zero: bool,
    /// When the pool was built (the steal rate limit's clock).
    epoch: Instant,
    /// See [`Config::borrow_slack`].
    borrow_slack: u32,
    /// Each device's host NUMA node, and the node cleaner workers run on.
    placement: Placement,
    /// Declared last, so dropped last: the caches hold references to the
    /// CUDA backend's contexts too, and only the backend's drop puts back
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

    pub(crate) fn classes(&self) -> &Classes {
        &self.caches.classes
    }

    /// Starts the cleaner's workers unless they run or the pool is closed.
    fn start_cleaner(this: &Arc<Self>) {
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

    /// The take path; see the module docs. `caches` is `this.caches`,
    /// reached from the handle without going through `this` (a take served
    /// by the calling thread's own lists reads nothing else of the pool).
    #[inline]
    fn take(
        this: &Arc<Self>,
        caches: &Caches,
        device: usize,
        min_size: usize,
    ) -> Result<PinnedBuffer, Error> {
        let class = caches.classes.class_for(min_size)?;
        if device >= caches.devices() {
            return Err(Error::UnknownDevice {
                device,
                devices: caches.devices(),
            });
        }
        let (cache, owned) = caches.local();
        let found = if owned {
            cache.take(device, class)
        } else {
            None
        };
        let block = match found {
            Some(Found::Ready(block)) => {
                cache.count_hit(block.slot(), block.footprint());
                Some(block)
            }
            Some(Found::Deferred(block, behind)) => this.reuse_own(cache, block, behind),
            None => None,
        };
        if let Some(block) = block {
            // The cache's own lists hold blocks of their slot's class only.
            let len = block.len();
            return Ok(PinnedBuffer::new(block, cache, true, len));
        }
        let (block, pooled) = Self::take_slow(this, cache, owned, device, class)?;
        // A borrowed block is longer than the class asked for: the buffer
        // shows the class's length.
        let len = this.classes().size(class);
        Ok(PinnedBuffer::new(block, cache, pooled, len))
    }

    /// The owner's reuse of its own oldest deferred buffer: if its copies
    /// are still running and more of the class are in flight behind it,
    /// waits for it a little (see [`SELF_WAIT`]) rather than miss.
    ///
    /// [`SELF_WAIT`]: crate::tune::Tuning::SELF_WAIT
    #[inline]
    fn reuse_own(&self, cache: &ThreadCache, mut block: Block, behind: usize) -> Option<Block> {
        if behind >= Tune::SELF_WAIT_BEHIND && matches!(block.fences_mut().poll(), Ok(false)) {
            Self::wait_briefly(&mut block);
        }
        self.reuse(cache, cache, block)
    }

    /// Polls `block`'s fences with growing pauses (so that many threads do
    /// not hammer the driver), for at most [`SELF_WAIT`].
    ///
    /// [`SELF_WAIT`]: crate::tune::Tuning::SELF_WAIT
    #[cold]
    fn wait_briefly(block: &mut Block) {
        let deadline = Instant::now() + Tune::SELF_WAIT;
        let mut pause = 64u32;
        while Instant::now() < deadline {
            for _ in 0..pause {
                std::hint::spin_loop();
            }
            pause = (pause * 2).min(4096);
            if !matches!(block.fences_mut().poll(), Ok(false)) {
                return;
            }
        }
    }

    /// Re-zeroes a deferred buffer of `home` for `taker` if its fences have
    /// completed; otherwise hands it back (to `home` if the taker owns it,
    /// else to the cleaner).
    #[inline]
    fn reuse(&self, taker: &ThreadCache, home: &ThreadCache, mut block: Block) -> Option<Block> {
        let owner = std::ptr::eq(taker, home);
        match block.fences_mut().poll() {
            Ok(true) => {
                block.zero_dirty();
                let meta = block.meta_mut();
                meta.returned = false;
                let parity = usize::from(meta.parity);
                home.complete(parity, owner);
                taker.count_cleaned();
                taker.count_hit(block.slot(), 0);
                Some(block)
            }
            Ok(false) if owner => {
                home.put_back(block);
                None
            }
            Ok(false) => {
                self.cleaner.submit(home, block, self.caches.cap());
                None
            }
            Err(e) => {
                Returned::new(block, home).fail_now(self.env(), &e);
                None
            }
        }
    }

    /// The take past the calling thread's own lists (`owned`: whether the
    /// thread owns `cache`, as [`Caches::local`] found).
    #[cold]
    fn take_slow(
        this: &Arc<Self>,
        cache: &ThreadCache,
        owned: bool,
        device: usize,
        class: SizeClass,
    ) -> Result<(Block, bool), Error> {
        Self::start_cleaner(this);
        if let Some(block) = this.shards[device].pop(class) {
            cache.count_hit(block.slot(), block.footprint());
            return Ok((block, true));
        }
        if let Some(block) = this.borrow(cache, owned, device, class) {
            // Counted in the class served, so taken bytes stay exact.
            cache.count_hit(block.slot(), block.footprint());
            cache.count_borrowed();
            return Ok((block, true));
        }
        if let Some(block) = this.steal(cache, owned, device, class) {
            return Ok((block, true));
        }
        let block = Block::allocate(this.classes(), class, device, this.shards[device].node())?;
        cache.count_miss(block.slot());
        tracing::trace!(
            bytes = block.len(),
            device,
            "pinpool: pool miss, allocated a pageable buffer"
        );
        Ok((block, false))
    }

    /// An idle ready buffer of a larger class within the borrowing slack:
    /// from the taker's own lists, then the shard. It keeps its class, and
    /// goes back to it when dropped.
    fn borrow(
        &self,
        taker: &ThreadCache,
        owned: bool,
        device: usize,
        class: SizeClass,
    ) -> Option<Block> {
        let slack = self.borrow_slack;
        if slack == 0 {
            return None;
        }
        let classes = self.classes();
        if owned {
            if let Some(block) = taker.borrow_ready(device, classes.borrowable(class, slack)) {
                return Some(block);
            }
        }
        classes
            .borrowable(class, slack)
            .find_map(|larger| self.shards[device].pop(larger))
    }

    /// Takes a buffer of (`device`, `class`) from another thread's cache:
    /// its remote list, then (locking its owner out) its ready and deferred
    /// lists.
    #[cold]
    fn steal(
        &self,
        taker: &ThreadCache,
        owned: bool,
        device: usize,
        class: SizeClass,
    ) -> Option<Block> {
        let classes = self.classes();
        let slot = classes.slot(device, class);
        let others = || self.caches.iter().filter(move |c| !std::ptr::eq(*c, taker));
        if owned {
            if let Some(block) = taker.adopt_remote_lists(device, class) {
                taker.count_hit(block.slot(), block.footprint());
                return Some(block);
            }
        }
        // Locking owners out interrupts every running thread: at most once
        // per `STEAL_EVERY` per thread. Idle caches are swept to the shards
        // by the cleaner meanwhile.
        let now = self.epoch.elapsed().as_micros() as u64;
        if !taker.may_steal(now, Tune::STEAL_EVERY.as_micros() as u64) {
            return None;
        }
        let candidates = others().filter(|c| c.ready_in(slot) > 0 || c.has_waiting());
        let mut locked = self.caches.lock_out(candidates);
        let mut ready = None;
        let mut deferred = None;
        locked.each(|cache, lists| {
            if ready.is_none() {
                ready = lists.steal_ready(cache, device, class);
            }
            if ready.is_none() && deferred.is_none() {
                deferred = lists
                    .steal_deferred(cache, device, class)
                    .map(|b| (b, std::ptr::from_ref(cache)));
            }
        });
        drop(locked);
        if let Some(block) = ready {
            taker.count_hit(block.slot(), block.footprint());
            if let Some((block, home)) = deferred {
                // SAFETY: caches live as long as the pool.
                self.cleaner
                    .submit(unsafe { &*home }, block, self.caches.cap());
            }
            return Some(block);
        }
        let (block, home) = deferred?;
        // SAFETY: caches live as long as the pool.
        self.reuse(taker, unsafe { &*home }, block)
    }

    /// Pins buffers ahead of demand; see [`Pool::reserve`].
    fn reserve(this: &Arc<Self>, device: usize, wanted: &[(usize, usize)]) -> Result<(), Error> {
        if device >= this.shards.len() {
            return Err(Error::UnknownDevice {
                device,
                devices: this.shards.len(),
            });
        }
        let classes = this.classes();
        let mut plan = Vec::with_capacity(wanted.len());
        // In u128, so that no count overflows it (a footprint is at most
        // 2^40 bytes, a count below 2^64), and a cap of `usize::MAX` (no
        // cap) still bounds the reservation by the host's memory.
        let mut bytes = 0u128;
        for &(size, count) in wanted {
            let class = classes.class_for(size)?;
            bytes = bytes.saturating_add(classes.footprint(class) as u128 * count as u128);
            plan.push((class, count));
        }
        let memory = crate::alloc::host_memory();
        if bytes > u128::from(memory) {
            return Err(Error::ReserveExceedsMemory { bytes, memory });
        }
        // At most the host's memory: fits a usize.
        let bytes = bytes as usize;
        let cap = this.caches.cap();
        if bytes > cap {
            return Err(Error::ReserveTooLarge { bytes, cap });
        }
        let mut blocks = Vec::new();
        for (class, mut count) in plan {
            let node = this.shards[device].node();
            // A sub-page class's block is the head of a slab that its
            // registration carves into up to `per_slab` buffers.
            let per_slab = classes.per_slab(class);
            while count > 0 {
                let buffers = count.min(per_slab);
                let mut block = Block::allocate_for(classes, class, device, node, buffers)?;
                let meta = block.meta_mut();
                meta.dirty = 0;
                meta.reserved = true;
                blocks.push(block);
                count -= buffers;
            }
        }
        Self::start_cleaner(this);
        let orphan = this.caches.local().0.orphan();
        for mut block in blocks {
            orphan.count_returned(&mut block);
            this.cleaner.submit_reserved(orphan, block, cap);
        }
        Ok(())
    }

    /// Blocks until every buffer dropped before the call is ready again or
    /// released.
    pub(crate) fn flush(this: &Arc<Self>) {
        Self::start_cleaner(this);
        this.caches.flush.wait(
            || this.caches.counts(),
            || {
                this.cleaner
                    .move_waiting(this.places(), this.caches.cap(), false);
                if !this.cleaner.is_running() {
                    Self::start_cleaner(this);
                }
                if !this.cleaner.is_running() {
                    // No worker could start (or one is being stopped by a
                    // shutdown): do the work here.
                    this.cleaner.drain_inline(this.env());
                }
            },
        );
    }

    /// Unregisters and frees every pooled buffer.
    pub(crate) fn clear(&self) {
        let blocks = self.admission.clear(self.places());
        if !blocks.is_empty() {
            tracing::debug!(buffers = blocks.len(), "pinpool: clearing the pool");
        }
        cleaner::release_all(self.env(), blocks);
    }

    pub(crate) fn set_max_pooled_bytes(&self, bytes: usize) {
        let evicted = self.admission.set_cap(self.places(), bytes);
        cleaner::release_all(self.env(), evicted);
    }

    pub(crate) fn shutdown(this: &Arc<Self>) {
        Self::flush(this);
        this.cleaner.stop();
        this.cleaner.drain_inline(this.env());
        this.clear();
    }

    /// Shuts down for good (the last handle is gone).
    fn close(this: &Arc<Self>) {
        this.closed.store(true, Ordering::Relaxed);
        // From here on every drop goes to the reaper (whose channel keeps
        // what is sent before its thread starts, below).
        this.caches.close();
        this.cleaner.stop();
        this.cleaner.drain_inline(this.env());
        let mut returned: Vec<Block> = this
            .cleaner
            .take_parked()
            .into_iter()
            .map(Returned::into_block)
            .collect();
        for cache in this.caches.iter() {
            returned.extend(cache.returns().take_all());
            // Emptied by the drain above; a buffer still there waits with
            // the reaper like any other.
            returned.extend(cache.released().take_all());
        }
        let mut locked = this.caches.lock_out(this.caches.iter());
        locked.each(|cache, lists| returned.extend(lists.take_deferred(cache)));
        drop(locked);
        this.clear();
        // Buffers pinned ahead of demand were counted as drops without a
        // take: they count as taken too.
        let taken: u64 = this.caches.iter().map(|c| c.takes() + c.injected()).sum();
        let dropped = crate::flush::drops(this.caches.counts());
        let outstanding = taken.saturating_sub(dropped);
        // Every close tries to start the reaper, so that one that could not
        // start earlier takes over what earlier closes left it.
        let reaping = reaper::start(&*this.backend);
        if outstanding > 0 || !returned.is_empty() {
            if !reaping {
                tracing::error!(
                    outstanding,
                    returned = returned.len(),
                    "pinpool: a pool closed with buffers out, but could not start the reaper \
                     thread: the pool's state and those buffers are kept (leaked) until a \
                     later close starts it"
                );
            }
            reaper::send(Message::Closed {
                key: Arc::as_ptr(this) as usize,
                pool: Box::new(Arc::clone(this)),
                outstanding,
                returned,
            });
        }
    }

    fn stats(&self) -> Stats {
        let classes = self.classes();
        let devices = self.shards.len();
        let count = classes.count();
        let mut stats = Stats {
            backend: self.backend.kind(),
            devices,
            ..Stats::default()
        };
        let mut pooled = vec![0usize; devices * count];
        let mut hits = vec![0u64; devices * count];
        let mut misses = vec![0u64; devices * count];
        for cache in self.caches.iter() {
            for (slot, n) in pooled.iter_mut().enumerate() {
                *n += cache.ready_in(slot) as usize;
                let (h, m) = cache.hits_misses(slot);
                hits[slot] += h;
                misses[slot] += m;
            }
            stats.cleaned_by_takers += cache.cleaned();
            stats.borrowed += cache.borrowed();
        }
        for (device, shard) in self.shards.iter().enumerate() {
            for class in classes.all() {
                pooled[classes.slot(device, class)] += shard.len(class);
            }
        }
        stats.hits = hits.iter().sum();
        stats.misses = misses.iter().sum();
        stats.taken_bytes = (0..devices * count)
            .map(|slot| {
                (hits[slot] + misses[slot]) * classes.size(SizeClass::at(slot % count)) as u64
            })
            .sum();
        let by_device = |v: &[u64], d: usize| v[d * count..(d + 1) * count].iter().sum::<u64>();
        let by_class =
            |v: &[u64], c: SizeClass| (0..devices).map(|d| v[classes.slot(d, c)]).sum::<u64>();
        stats.pooled_buffers = pooled.iter().sum();
        stats.per_device = (0..devices)
            .map(|device| {
                let slots = &pooled[device * count..(device + 1) * count];
                DeviceStats {
                    device,
                    pooled_buffers: slots.iter().sum(),
                    pooled_bytes: classes
                        .all()
                        .map(|c| slots[c.index()] * classes.footprint(c))
                        .sum(),
                    hits: by_device(&hits, device),
                    misses: by_device(&misses, device),
                }
            })
            .collect();
        stats.per_class = classes
            .all()
            .map(|class| ClassStats {
                size: classes.size(class),
                pooled_buffers: (0..devices).map(|d| pooled[classes.slot(d, class)]).sum(),
                hits: by_class(&hits, class),
                misses: by_class(&misses, class),
            })
            .filter(|c| c.pooled_buffers > 0 || c.hits > 0 || c.misses > 0)
            .collect();
        let places = self.places();
        stats.pooled_bytes = self.admission.pooled_bytes(places);
        stats.peak_pooled_bytes = self.admission.peak(places);
        stats.max_pooled_bytes = self.caches.cap();
        stats.in_cleaner = crate::flush::in_flight(self.caches.counts()) as usize;
        stats.evictions = self.admission.evictions() as u64;
        stats.recycled = stats.cleaned_by_takers;
        stats.fill_from(self.counters());
        stats
    }
}

impl Sink for Shared {
    fn route(&self, home: &ThreadCache, block: Block) {
        self.cleaner.submit(home, block, self.caches.cap());
    }

    fn late(&self, mut block: Block) {
        self.cleaner.note_drop(&mut block);
        reaper::send(Message::Late {
            pool: self as *const Self as *const () as usize,
            block,
        });
    }
}

impl Retire for Arc<Shared> {
    fn settled(&self, block: &mut Block) -> Result<bool, Error> {
        match self.cleaner.settle_late(block)? {
            Late::Settled => Ok(true),
            Late::Waiting => Ok(false),
            Late::NeedsSync(device, note) => {
                // Off the reaper's thread, so that one device's slow
                // synchronize holds up no other late buffer. Loom models run
                // the reaper inline and the synchronize with it.
                #[cfg(not(pinpool_loom))]
                {
                    let shared = Arc::clone(self);
                    let spawned = self.backend.spawn(
                        "pinpool-late-sync".into(),
                        Box::new(move || shared.cleaner.run_late_sync(shared.env(), device, note)),
                    );
                    if spawned.is_ok() {
                        return Ok(false);
                    }
                }
                self.cleaner.run_late_sync(self.env(), device, note);
                Ok(false)
            }
        }
    }

    fn retire(&self, mut block: Block) {
        block.meta_mut().returned = false;
        cleaner::release(&*self.backend, self.counters(), block);
    }

    fn abandon(&self, mut block: Block) {
        Counters::add(&self.counters().fence_failures, 1);
        block.fences_mut().abandon();
        let leaked = block.leak();
        Counters::add(&self.counters().leaked_bytes, leaked as u64);
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

    pub(crate) fn from_config(config: Config) -> Result<Self, Error> {
        let backend = backend::select(config.backend, config.devices)?;
        Self::with_backend(config, backend)
    }

    pub(crate) fn with_backend(config: Config, backend: Box<dyn Backend>) -> Result<Self, Error> {
        barrier::init();
        let devices = backend.device_count();
        if devices > crate::backend::MAX_DEVICES {
            return Err(crate::backend::too_many_devices(devices));
        }
        let classes = Classes::new(config.size_classes, crate::size_class::page_size());
        let count = classes.count();
        let pins = backend.pins();
        // Only pinned memory is worth placing; other backends (the host
        // one, the loom models) skip reading the topology.
        let placement = if pins {
            Placement::choose(config.numa, &Topology::discover(), &backend.numa_hints())
        } else {
            Placement::unplaced(devices)
        };
        let shared = Arc::new(Shared {
            caches: Caches::new(
                classes,
                devices,
                config.thread_cache_bytes,
                config.max_pooled_bytes,
                pins,
                backend.contexts(),
            ),
            shards: (0..devices)
                .map(|device| Shard::new(count, placement.node(device).map(|n| n.id)))
                .collect(),
            admission: Admission::new(),
            cleaner: Cleaner::new(config.cleaner_threads, devices, pins),
            provisioner: Provisioner::new(devices * count, config.provision, config.idle_trim),
            closed: AtomicBool::new(false),
            device_zero: backend.kind() == BackendKind::Host,
            epoch: Instant::now(),
            borrow_slack: config.borrow_slack,
            placement,
            config,
            backend,
        });
        // SAFETY: the caches live inside `shared`, so their sink outlives
        // them.
        unsafe { shared.caches.set_sink(&*shared) };
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

    /// An all-zero buffer of at least `min_size` bytes, rounded up to its
    /// size class (see [`SizeClasses`](crate::SizeClasses)), from the shard
    /// of the calling thread's *current device*: the device of the CUDA
    /// context current on the calling thread, device 0 if none is (and
    /// always 0 on the host backend).
    ///
    /// Page-locked on a pool hit; on a miss a fresh pageable buffer, which
    /// the cleaner registers after it is dropped. Pinning never happens on
    /// the caller's path.
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
    /// be evicted by it), but idle trimming keeps them.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownDevice`], [`Error::SizeTooLarge`] for a size above
    /// the largest class, [`Error::ReserveExceedsMemory`] if the buffers'
    /// bytes exceed this host's physical memory (checked whatever the cap,
    /// before anything is mapped), [`Error::ReserveTooLarge`] if they
    /// exceed the cap, or [`Error::AllocationFailed`]; nothing is reserved
    /// then.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// pool.reserve(0, &[(8 << 20, 2), (64 << 10, 16)])?;
    /// pool.flush();
    /// assert_eq!(pool.stats().pooled_buffers, 18);
    /// assert!(pool.take(8 << 20).was_pooled());
    /// assert!(pool.reserve(0, &[(1 << 30, 8)]).is_err()); // 8 GiB > the 4 GiB cap
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn reserve(&self, device: usize, sizes: &[(usize, usize)]) -> Result<(), Error> {
        Shared::reserve(self.shared(), device, sizes)
    }

    /// Sets the cap on pooled bytes (thread caches included). Lowering it
    /// evicts at once, largest buffers first; 0 turns pooling off.
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

    /// Blocks until every buffer dropped before the call (on any thread)
    /// has been recycled (and is ready to take) or released.
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
    /// first.
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
    /// `peak_pinned_bytes`) from the levels now, and its drop-to-ready
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
        shared.counters().reset_ready_latency();
    }

    /// The settings the pool runs with (the cap as last set).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).cleaner_threads(3).build()?;
    /// assert_eq!(pool.config().cleaner_threads, 3);
    /// pool.set_max_pooled_bytes(1 << 20);
    /// assert_eq!(pool.config().max_pooled_bytes, 1 << 20);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn config(&self) -> Config {
        let shared = self.shared();
        Config {
            max_pooled_bytes: shared.caches.cap(),
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

    /// Reverses a successful [`register_region`](Self::register_region).
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
            tracing::debug!(error = %e, "pinpool: unregister_region failed");
        }
    }
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
        if let Some(faults) = self.faults {
            let devices = self.config.devices.unwrap_or(1);
            let backend = Box::new(crate::backend::fault::FaultBackend::new(faults, devices));
            return Pool::with_backend(self.config, backend);
        }
        Pool::from_config(self.config)
    }
}
