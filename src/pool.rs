//! The pool: per-device shards, per-thread caches, the cap, and the
//! [`Pool`] handle users hold.

use crate::alloc::Block;
use crate::backend::{self, Backend, BackendKind};
use crate::buffer::PinnedBuffer;
use crate::cleaner::{Inbox, Returned};
use crate::config::{Config, PoolBuilder};
use crate::error::Error;
use crate::shard::Shard;
use crate::size_class::{self, CLASSES, MAX_SHIFT};
use crate::stats::{ClassStats, Counters, DeviceStats, Stats};
use crate::sync::{Arc, AtomicUsize, JoinHandle, Mutex, Ordering, PerThread};
use crate::thread_cache::{Dirty, Found, ThreadCache};
use crossbeam_utils::CachePadded;

/// Everything a pool shares between its handles, its threads and its
/// cleaner workers.
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) shards: Box<[Shard]>,
    pub(crate) caches: PerThread<Arc<ThreadCache>>,
    pub(crate) inbox: Arc<Inbox>,
    /// An upper bound on the pooled footprint bytes: admission adds to it
    /// before a buffer becomes visible, eviction and `clear` subtract after
    /// removing one, and takes are subtracted late, in bulk, when the slow
    /// path folds in every cache's `untallied` count. It never under-counts,
    /// so admitting while it stays under the cap keeps the cap.
    estimate: CachePadded<AtomicUsize>,
    /// Serialises the slow path of admission (folding, eviction) and cap
    /// changes. Takers never take it.
    admission: Mutex<()>,
    max_pooled: AtomicUsize,
    pub(crate) workers: Mutex<Vec<JoinHandle<()>>>,
    pub(crate) flush_lock: Mutex<()>,
    /// Per device, when the last successful synchronize started.
    pub(crate) device_syncs: Box<[Mutex<Option<std::time::Instant>>]>,
    /// Buffers whose copies were still running when a worker got them.
    pub(crate) parked: Mutex<Vec<Returned>>,
    pub(crate) parked_len: AtomicUsize,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("config", &self.config)
            .field("inbox", &self.inbox)
            .finish_non_exhaustive()
    }
}

// === impl Shared ===

impl Shared {
    fn backend(&self) -> &dyn Backend {
        &**self.inbox.backend
    }

    /// The calling thread's cache.
    #[inline]
    pub(crate) fn cache(&self) -> &Arc<ThreadCache> {
        self.caches.get_or(|| {
            Arc::new(ThreadCache::new(
                Arc::clone(&self.inbox),
                self.shards.len(),
                self.config.thread_cache_bytes,
            ))
        })
    }

    /// Takes a ready buffer from any other thread's cache (idle or exited
    /// threads keep theirs until someone needs them).
    #[cold]
    fn steal(&self, device: usize, shift: u32, own: &Arc<ThreadCache>) -> Option<Block> {
        self.caches
            .iter()
            .filter(|c| !Arc::ptr_eq(c, own))
            .find_map(|c| c.steal(device, shift, own))
    }

    /// Pops a ready buffer from `device`'s shard, tallying it to `cache`.
    #[inline]
    fn pop_shard(&self, device: usize, shift: u32, cache: &ThreadCache) -> Option<Block> {
        let block = self.shards[device].pop(shift)?;
        cache.untally(block.footprint());
        Some(block)
    }

    /// Cleans a dirty buffer on the taker's thread (see `thread_cache`).
    #[cold]
    fn help(&self, dirty: Dirty, cache: &ThreadCache) -> Block {
        let mut block = dirty.block;
        let len = dirty.dirty.min(block.len());
        block.as_mut_slice()[..len].fill(0);
        cache.count_help(len);
        drop(dirty.fences);
        self.inbox.complete(cache, dirty.epoch);
        block
    }

    /// Pooled footprint bytes, thread caches included (exact once quiet).
    pub(crate) fn pooled_bytes(&self) -> usize {
        let untallied: usize = self.caches.iter().map(|c| c.untallied()).sum();
        self.estimate
            .load(Ordering::Relaxed)
            .saturating_sub(untallied)
    }

    /// Puts a ready `block` back, in its owner's cache if there is room,
    /// else in its device's shard, keeping the pooled bytes under the cap
    /// (evicting largest first).
    pub(crate) fn admit(&self, block: Block, home: &ThreadCache) {
        let footprint = block.footprint();
        // Relaxed: the cap is a setting; `set_max_pooled_bytes` re-evicts
        // under the admission lock after changing it.
        let cap = self.max_pooled.load(Ordering::Relaxed);
        // Relaxed: the estimate guards a count, not data; its RMWs are
        // totally ordered among themselves, which is all the cap needs.
        if self.estimate.fetch_add(footprint, Ordering::Relaxed) + footprint <= cap {
            self.place(block, home);
            return;
        }
        self.estimate.fetch_sub(footprint, Ordering::Relaxed);
        let evicted = {
            let _admission = self.admission.lock();
            self.fold();
            if footprint > cap {
                drop(_admission);
                self.inbox.release(block);
                return;
            }
            let evicted = self.evict_to_fit(footprint, cap);
            self.estimate.fetch_add(footprint, Ordering::Relaxed);
            self.place(block, home);
            evicted
        };
        self.release_all(evicted);
    }

    /// Offers `block` to `home`, else pushes it on its shard, else frees it.
    fn place(&self, block: Block, home: &ThreadCache) {
        let Err(block) = home.offer(block) else {
            return;
        };
        let device = block.device();
        if let Err(block) = self.shards[device].push(block) {
            self.estimate
                .fetch_sub(block.footprint(), Ordering::Relaxed);
            self.inbox.release(block);
        }
    }

    /// Subtracts every cache's untallied takes from the estimate, making it
    /// exact but for admissions in progress. Called under the admission lock.
    fn fold(&self) {
        for cache in self.caches.iter() {
            self.estimate
                .fetch_sub(cache.fold_untallied(), Ordering::Relaxed);
        }
    }

    /// Removes pooled buffers, largest class first, until `incoming` more
    /// bytes fit under `cap`. The caller holds the admission lock, has
    /// folded the estimate, and releases the returned buffers.
    fn evict_to_fit(&self, incoming: usize, cap: usize) -> Vec<Block> {
        let mut evicted = Vec::new();
        let mut shift = MAX_SHIFT as i64;
        while self.estimate.load(Ordering::Relaxed) + incoming > cap && shift >= 0 {
            match self.evict_one(shift as u32) {
                Some(block) => {
                    self.estimate
                        .fetch_sub(block.footprint(), Ordering::Relaxed);
                    evicted.push(block);
                }
                None => shift -= 1,
            }
        }
        if !evicted.is_empty() {
            Counters::add(&self.inbox.counters.evictions, evicted.len() as u64);
            tracing::debug!(
                buffers = evicted.len(),
                cap,
                "evicted pooled buffers to respect the cap"
            );
        }
        evicted
    }

    fn evict_one(&self, shift: u32) -> Option<Block> {
        self.shards
            .iter()
            .filter(|s| s.has(shift))
            .find_map(|s| s.pop(shift))
            .or_else(|| self.caches.iter().find_map(|c| c.evict(shift)))
    }

    fn release_all(&self, blocks: Vec<Block>) {
        for block in blocks {
            self.inbox.release(block);
        }
    }

    pub(crate) fn set_max_pooled_bytes(&self, bytes: usize) {
        let evicted = {
            let _admission = self.admission.lock();
            self.max_pooled.store(bytes, Ordering::Relaxed);
            self.fold();
            self.evict_to_fit(0, bytes)
        };
        self.release_all(evicted);
    }

    /// Unregisters and frees every pooled buffer.
    pub(crate) fn clear(&self) {
        let mut blocks = Vec::new();
        for shard in self.shards.iter() {
            blocks.extend(shard.drain());
        }
        for cache in self.caches.iter() {
            blocks.extend(cache.drain());
        }
        let bytes: usize = blocks.iter().map(Block::footprint).sum();
        self.estimate.fetch_sub(bytes, Ordering::Relaxed);
        if !blocks.is_empty() {
            tracing::debug!(buffers = blocks.len(), "clearing the pool");
        }
        self.release_all(blocks);
    }

    pub(crate) fn shutdown(this: &Arc<Self>) {
        Self::flush(this);
        this.stop_cleaner();
        this.inbox.release_queued();
        this.release_parked();
        this.clear();
    }

    /// Shuts down for good: called when the last `Pool` handle drops.
    fn close(this: &Arc<Self>) {
        {
            // Under the workers lock, so no `start_cleaner` runs meanwhile;
            // from here on no worker starts, and the running ones are
            // stopped by the shutdown below.
            let _workers = this.workers.lock();
            this.inbox.closed.store(true, Ordering::Relaxed);
        }
        Self::shutdown(this);
        *this.inbox.pool.lock() = None;
        // A drop that raced the shutdown found no worker and no way to start
        // one; what it queued is released here. Later drops release their
        // own buffers (see `Inbox::wake`).
        this.sweep();
        this.inbox.release_queued();
        this.release_parked();
        this.clear();
    }

    fn stats(&self) -> Stats {
        let devices = self.shards.len();
        let mut stats = Stats::empty(self.backend().kind(), devices);
        // Pooled buffers and misses by device and class.
        let mut pooled = vec![0usize; devices * CLASSES];
        let mut misses = vec![0u64; CLASSES];
        let mut helped = (0, 0);
        for cache in self.caches.iter() {
            stats.hits += cache.hits();
            for (shift, n) in cache.misses().enumerate() {
                misses[shift] += n;
            }
            for (slot, n) in cache.buffers().into_iter().enumerate() {
                pooled[slot] += n;
            }
            let (buffers, bytes) = cache.helped();
            helped = (helped.0 + buffers, helped.1 + bytes);
        }
        for (device, shard) in self.shards.iter().enumerate() {
            for (shift, n) in shard.buffers().enumerate() {
                pooled[device * CLASSES + shift] += n;
            }
        }
        stats.misses = misses.iter().sum();
        stats.pooled_buffers = pooled.iter().sum();
        stats.per_device = (0..devices)
            .map(|device| {
                let counts = &pooled[device * CLASSES..(device + 1) * CLASSES];
                DeviceStats {
                    device,
                    pooled_buffers: counts.iter().sum(),
                    pooled_bytes: counts
                        .iter()
                        .enumerate()
                        .map(|(s, n)| n * size_class::footprint(s as u32))
                        .sum(),
                }
            })
            .collect();
        stats.per_class = (0..CLASSES)
            .map(|shift| ClassStats {
                size: size_class::size(shift as u32),
                pooled_buffers: (0..devices).map(|d| pooled[d * CLASSES + shift]).sum(),
                misses: misses[shift],
            })
            .filter(|c| c.pooled_buffers > 0 || c.misses > 0)
            .collect();
        stats.pooled_bytes = self.pooled_bytes();
        stats.max_pooled_bytes = self.max_pooled.load(Ordering::Relaxed);
        stats.in_cleaner = self.in_cleaner();
        stats.fill_from(&self.inbox.counters);
        stats.recycled += helped.0;
        stats.bytes_zeroed += helped.1;
        stats.cleaned_by_takers = helped.0;
        stats
    }
}

/// Owns the pool on behalf of the user's handles; dropping the last one
/// shuts the pool down.
#[derive(Debug)]
struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        Shared::close(&self.shared);
    }
}

/// A pool of page-locked host buffers: a cheap, cloneable handle.
///
/// Dropping the last handle shuts the pool down; buffers still out are
/// freed when they are dropped.
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
    handle: Arc<Handle>,
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
        let devices = backend.device_count();
        let inbox = Arc::new(Inbox::new(
            Arc::new(backend),
            64 + 16 * config.cleaner_threads,
        ));
        let shared = Arc::new(Shared {
            shards: (0..devices).map(|_| Shard::new()).collect(),
            device_syncs: (0..devices).map(|_| Mutex::new(None)).collect(),
            caches: PerThread::new(),
            inbox: Arc::clone(&inbox),
            estimate: CachePadded::new(AtomicUsize::new(0)),
            admission: Mutex::new(()),
            max_pooled: AtomicUsize::new(config.max_pooled_bytes),
            workers: Mutex::new(Vec::new()),
            flush_lock: Mutex::new(()),
            parked: Mutex::new(Vec::new()),
            parked_len: AtomicUsize::new(0),
            config,
        });
        *inbox.pool.lock() = Some(Arc::clone(&shared));
        Shared::start_cleaner(&shared);
        Ok(Self {
            handle: Arc::new(Handle { shared }),
        })
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.handle.shared
    }

    /// An all-zero buffer of at least `min_size` bytes, rounded up to a
    /// power of two, from the shard of the calling thread's current device.
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
        let device = self.shared().backend().current_device();
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
        let shift = size_class::shift_for(min_size)?;
        let shared = self.shared();
        if device >= shared.shards.len() {
            return Err(Error::UnknownDevice {
                device,
                devices: shared.shards.len(),
            });
        }
        let cache = shared.cache();
        cache.claim();
        // Relaxed: a setting. Reusing a dirty buffer is pooling too, so a
        // class larger than the cap (0: pooling off) is never helped.
        let help = size_class::footprint(shift) <= shared.max_pooled.load(Ordering::Relaxed);
        let found = match cache.take(device, shift, help) {
            Some(Found::Ready(block)) => Some(block),
            Some(Found::Dirty(dirty)) => Some(shared.help(dirty, cache)),
            None => shared
                .pop_shard(device, shift, cache)
                .or_else(|| shared.steal(device, shift, cache)),
        };
        let pooled = found.is_some();
        let block = match found {
            Some(block) => {
                cache.count_hit();
                block
            }
            None => {
                let block = Block::allocate(shift, device)?;
                cache.count_miss(shift);
                tracing::trace!(
                    bytes = block.len(),
                    device,
                    "pool miss: allocated a pageable buffer"
                );
                block
            }
        };
        Ok(PinnedBuffer::new(block, Arc::clone(cache), pooled))
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

    /// Blocks until every buffer dropped before the call has been recycled
    /// (and is ready to take) or released.
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

    /// Drains the cleaner, joins its workers, then unregisters and frees
    /// every pooled buffer. The pool keeps working afterwards: the next
    /// drop (or `flush`) starts the cleaner again.
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

    /// The settings the pool runs with.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).cleaner_threads(3).build()?;
    /// assert_eq!(pool.config().cleaner_threads, 3);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn config(&self) -> &Config {
        &self.shared().config
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
        self.shared().backend().kind()
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
        let backend = self.shared().backend();
        if !backend.pins() {
            return false;
        }
        // SAFETY: forwarded from the caller.
        match unsafe { backend.register(backend.current_device(), ptr, len) } {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = %e, "register_region failed; the region stays pageable");
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
    /// let pool = pinpool::Pool::global();
    /// let mut region = vec![0u8; 4096];
    /// // SAFETY: `region` outlives its registration, and nothing copies from it.
    /// unsafe {
    ///     if pool.register_region(region.as_mut_ptr(), region.len()) {
    ///         pool.unregister_region(region.as_mut_ptr());
    ///     }
    /// }
    /// ```
    pub unsafe fn unregister_region(&self, ptr: *mut u8) {
        let backend = self.shared().backend();
        // SAFETY: forwarded from the caller.
        if let Err(e) = unsafe { backend.unregister(backend.current_device(), ptr) } {
            tracing::debug!(error = %e, "unregister_region failed");
        }
    }
}

#[cfg(not(all(loom, feature = "loom")))]
impl Pool {
    /// The process-wide pool behind the free functions, built on first use
    /// with the default settings ([`BackendKind::Auto`]) and those of the
    /// `PINPOOL_CONF` environment variable (see [`PoolBuilder::conf`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::global();
    /// let buf = pool.take(4096);
    /// assert_eq!(buf.len(), 4096);
    /// ```
    pub fn global() -> &'static Pool {
        static GLOBAL: std::sync::OnceLock<Pool> = std::sync::OnceLock::new();
        GLOBAL.get_or_init(|| {
            Pool::builder().from_env().build().unwrap_or_else(|e| {
                tracing::warn!(error = %e, "pinpool: PINPOOL_CONF rejected; using the defaults");
                Pool::builder()
                    .build()
                    .unwrap_or_else(|e| panic!("pinpool: building the global pool failed: {e}"))
            })
        })
    }
}
