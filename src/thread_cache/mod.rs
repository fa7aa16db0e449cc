//! The per-thread caches in front of the shards.
//!
//! Each thread that takes buffers has one [`ThreadCache`] per pool, split as
//! sharded-slab splits a shard: an *owner part* that only its thread writes
//! on the fast path, and a *shared part* that other threads write, each on
//! its own cache line.
//!
//! - The owner part holds, per slot (device and size class), a LIFO of
//!   *ready* buffers and a FIFO of *deferred* ones: buffers the owner
//!   dropped whose dirty prefix is small, left for the owner to re-zero on
//!   its next take of that class once their fences have completed. A tight
//!   take / write / drop loop therefore never leaves its own cache. The
//!   owner's counters (hits, misses, flush counts) are written with a load
//!   and a store, no read-modify-write.
//! - The shared part holds a [remote list](crate::remote) of buffers the
//!   cleaner made ready for this owner, which the owner collects with one
//!   swap on its next take, and the [`Returns`](crate::remote::Returns) of
//!   buffers other threads dropped, in batches: the owner collects the full
//!   batches on its next take, and the batch still filling when the slot it
//!   takes from has nothing it can hand out now (a steal, a sweep, a flush
//!   or closing take every batch).
//!
//! A take or a drop by the owner takes no lock, writes no cache line another
//! thread writes, reads no clock and touches no reference count: it marks
//! itself *active*, runs the light half of an [asymmetric
//! barrier](crate::sync::barrier), checks that no other thread has asked
//! for the lists, works on them, and marks itself inactive (two stores and a
//! load around plain list operations).
//!
//! Other threads need the lists only on slow paths: a miss stealing from an
//! idle or exited thread, `flush` moving deferred buffers along, eviction,
//! `clear`, the cleaner's sweep of idle caches, its pull of a draining
//! region's deferred buffers (busy caches too, at most four times a
//! drain), and closing the pool. Such
//! a *thief* takes the cache's lock, sets the request word, runs the heavy
//! half of the barrier and waits until the owner is not active; from then
//! on an owner that starts an operation sees the request and waits for the
//! lock instead. The barrier makes the handshake Dekker's: either the thief
//! sees the owner active, or the owner sees the request. Closing the pool
//! sets a bit in the same word, so a drop after the pool is gone never
//! touches a list.
//!
//! Caches outlive their threads (see [`PerThread`]), so buffers cached by an
//! exited thread stay reachable. A thread being torn down gets no cache:
//! its takes go through the *orphan* cache, which no thread owns.

mod cache;
mod counts;
mod lists;

use std::ptr::NonNull;

use crossbeam_utils::CachePadded;

use crate::backend::Backend;
use crate::cleaner::intake::Intake;
use crate::fence::EventPool;
use crate::flush::{Counts, Flush};
use crate::size_class::Classes;
use crate::stats::Counters;
use crate::sync::per_thread::PerThread;
use crate::sync::{barrier, spin, Arc, AtomicBool, AtomicUsize, Mutex, MutexGuard, Ordering};
use crate::trace::writer::Tracer;

pub(crate) use cache::{Found, Own, ThreadCache};
pub(crate) use lists::Lists;

/// Request bit: a thief holds the cache's lock and works on its lists.
pub(super) const THIEF: u32 = 1;
/// Request bit: the pool is closed; drops go to the reaper.
pub(super) const CLOSED: u32 = 2;

// === impl Caches ===

/// Every cache of a pool, the flush barrier over them, and where drops go.
pub(crate) struct Caches {
    map: PerThread<ThreadCache>,
    /// The cache of takes made during thread teardown: no owner.
    orphan: ThreadCache,
    pub(crate) flush: Flush,
    pub(crate) classes: Classes,
    /// The pool's statistics counters (written off the fast path, by the
    /// cleaner among others: on lines of their own, away from the fields
    /// every take reads).
    pub(crate) counters: CachePadded<Counters>,
    /// The pool's backend, whose box outlives the caches (the pool's state
    /// declares it last).
    backend: BackendRef,
    devices: usize,
    /// Devices times classes.
    slots: usize,
    limit: usize,
    /// The pool's cap on pooled bytes, as last set: the only copy of it
    /// (admission, the settings and the statistics read it here). A buffer
    /// above it is never kept back in its owner's cache (deferred), since
    /// it could not be pooled either.
    cap: AtomicUsize,
    /// Whether a region of any device drains (see
    /// `Regions::drain_excess`), as of the cleaner's last provisioning
    /// tick: a take that would reuse a deferred buffer asks its region only
    /// then (see [`draining`](Self::draining)).
    draining: AtomicBool,
    pins: bool,
    /// The pool's spare CUDA events (a copy through cudarc records events
    /// whatever the backend), dropped with the caches: before the backend,
    /// so before the contexts they retain are released.
    pub(crate) events: EventPool,
    /// Where the drops the caches do not keep go: the cleaner's intake.
    pub(crate) intake: Arc<Intake>,
    /// Held while pooled buffers move between caches and shards out of
    /// any take (a sweep moving idle threads' ready buffers to the shards,
    /// a trim gathering every pooled buffer and putting back those it
    /// keeps, an eviction putting back the inbox buffers it keeps), and by
    /// a statistics snapshot while it counts the pooled buffers, so that
    /// the snapshot counts each buffer once (not in the cache it read
    /// first and again in the shard it read after, nor in neither). Taken
    /// after the admission lock and before any cache's lock.
    moving: Mutex<()>,
    /// The pool's trace, if it writes one: each cache gets a ring of it.
    pub(crate) trace: Option<std::sync::Arc<Tracer>>,
}

/// A pointer to the pool's backend.
struct BackendRef(NonNull<dyn Backend>);

// SAFETY: the backend is `Send + Sync` and outlives the caches (see
// `Caches::new`).
unsafe impl Send for BackendRef {}
// SAFETY: as above.
unsafe impl Sync for BackendRef {}

impl std::fmt::Debug for Caches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caches")
            .field("devices", &self.devices)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

/// Thieves at work on some caches, owners locked out; see the module docs.
pub(crate) struct LockedOut<'a> {
    entries: Vec<(&'a ThreadCache, MutexGuard<'a, ()>)>,
}

impl LockedOut<'_> {
    /// Runs `f` on each locked-out cache and its lists.
    pub(crate) fn each(&mut self, mut f: impl FnMut(&ThreadCache, &mut Lists)) {
        for (cache, _) in &self.entries {
            // SAFETY: the owner is locked out (see `Caches::lock_out`), and
            // this thief holds the cache's lock.
            cache
                .owner
                .lists
                .with_mut(|lists| f(cache, unsafe { &mut *lists }));
        }
    }
}

impl Drop for LockedOut<'_> {
    fn drop(&mut self) {
        for (cache, _) in &self.entries {
            // Release publishes the list changes to the owner's next
            // Acquire load of the request word.
            cache.shared.request.fetch_and(!THIEF, Ordering::Release);
        }
    }
}

impl Caches {
    /// Caches for a pool of `devices` devices with `classes`, at most
    /// `limit` ready bytes each, under the pool's `cap`, on `backend` (which
    /// `pins` or not, and must outlive the caches), handing the drops they
    /// do not keep to `intake`.
    pub(crate) fn new(
        classes: Classes,
        devices: usize,
        limit: usize,
        cap: usize,
        pins: bool,
        backend: NonNull<dyn Backend>,
        intake: Arc<Intake>,
    ) -> Box<Self> {
        let orphan = ThreadCache::new(
            &classes,
            devices,
            limit,
            NonNull::dangling(),
            NonNull::dangling(),
            true,
            None,
        );
        let slots = devices * classes.count();
        let mut caches = Box::new(Self {
            map: PerThread::new(),
            orphan,
            flush: Flush::new(),
            classes,
            counters: CachePadded::new(Counters::default()),
            backend: BackendRef(backend),
            slots,
            devices,
            limit,
            cap: AtomicUsize::new(cap),
            draining: AtomicBool::new(false),
            pins,
            events: EventPool::default(),
            intake,
            moving: Mutex::new(()),
            trace: None,
        });
        // The box gave `Caches` its address: point the orphan at it.
        caches.orphan.fixed.caches = NonNull::from(&*caches);
        let flush = NonNull::from(&caches.flush);
        caches.orphan.books.set_flush(flush);
        caches
    }

    /// Makes the caches write their takes and drops to `tracer` (before
    /// any thread has a cache).
    pub(crate) fn trace_to(&mut self, tracer: std::sync::Arc<Tracer>) {
        self.orphan.trace_to(tracer.shared_ring());
        self.trace = Some(tracer);
    }

    /// Keeps sweeps, trims and evictions from moving pooled buffers
    /// between caches and shards while the guard lives (see `moving`).
    pub(crate) fn no_moves(&self) -> MutexGuard<'_, ()> {
        self.moving.lock()
    }

    /// The pool's backend.
    pub(crate) fn backend(&self) -> &dyn Backend {
        // SAFETY: the backend outlives the caches (see `new`).
        unsafe { self.backend.0.as_ref() }
    }

    /// Whether buffers are carved from regions (the backend pins, and the
    /// pool's settings ask for them).
    #[inline]
    pub(crate) fn carves(&self) -> bool {
        self.intake.regions
    }

    /// Whether a region of any device drained at the last provisioning
    /// tick (a hint: see the field).
    #[inline]
    pub(crate) fn draining(&self) -> bool {
        // Relaxed: a stale `false` for up to a tick lets a deferred buffer
        // of a draining region be reused once more (the next reuse after
        // the tick, or the tick's pull, sends it back); a stale `true` asks
        // a region that no longer drains. Neither loses a buffer.
        self.draining.load(Ordering::Relaxed)
    }

    /// Notes whether a region of any device drains (the provisioning
    /// tick, once it has drained and settled).
    pub(crate) fn note_draining(&self, on: bool) {
        // Relaxed: see `draining`.
        self.draining.store(on, Ordering::Relaxed);
    }

    /// The cap on pooled bytes now (see the `cap` field).
    #[inline]
    pub(crate) fn cap(&self) -> usize {
        // Relaxed: a setting. A reader racing a change sees the old or the
        // new cap; admission's fence pair with `Admission::set_cap` (see
        // `admission`) makes one of them enforce the new one.
        self.cap.load(Ordering::Relaxed)
    }

    /// Records a new cap on pooled bytes (see the `cap` field); the caller
    /// then enforces it (`Admission::set_cap`).
    pub(crate) fn set_cap(&self, cap: usize) {
        // Relaxed: a setting; ordered before the setter's eviction by its
        // SeqCst fence (see `admission`).
        self.cap.store(cap, Ordering::Relaxed);
    }

    /// The calling thread's cache and whether the thread owns it: its own,
    /// or the orphan cache (not owned) while the thread is being torn down.
    #[inline]
    pub(crate) fn local(&self) -> (&ThreadCache, bool) {
        let cache = self.map.get_or(
            || {
                ThreadCache::new(
                    &self.classes,
                    self.devices,
                    self.limit,
                    NonNull::from(self),
                    NonNull::from(&self.flush),
                    false,
                    self.trace.as_ref().map(|t| t.ring()),
                )
            },
            |cache, token| {
                // Relaxed: written only by the owner; readers compare it
                // with their own token, and tokens are never reused, so a
                // stale value matches no other thread.
                if cache.owner.token.load(Ordering::Relaxed) != token {
                    cache.owner.token.store(token, Ordering::Relaxed);
                }
            },
        );
        match cache {
            Some(cache) => (cache, true),
            None => (&self.orphan, false),
        }
    }

    /// Every cache, the orphan's included.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &ThreadCache> {
        self.map.iter().chain(std::iter::once(&self.orphan))
    }

    /// The devices served.
    #[inline]
    pub(crate) fn devices(&self) -> usize {
        self.devices
    }

    /// Devices times classes.
    pub(crate) fn slots(&self) -> usize {
        self.slots
    }

    /// Every cache's flush counters.
    pub(crate) fn counts(&self) -> impl Iterator<Item = Counts<'_>> {
        self.iter().map(ThreadCache::counts)
    }

    /// Locks the owners of `caches` out of their lists (see the module
    /// docs). Locks are taken in iteration order, so two thieves never
    /// deadlock; an owner never holds a cache lock while waiting for
    /// another.
    pub(crate) fn lock_out<'a>(
        &'a self,
        caches: impl Iterator<Item = &'a ThreadCache>,
    ) -> LockedOut<'a> {
        let entries: Vec<_> = caches.map(|c| (c, c.shared.lock.lock())).collect();
        for (cache, _) in &entries {
            // Relaxed: ordered before the `active` loads by the barrier.
            cache.shared.request.fetch_or(THIEF, Ordering::Relaxed);
        }
        if !entries.is_empty() {
            barrier::heavy();
        }
        for (cache, _) in &entries {
            let mut round = 0;
            // Acquire pairs with the owner's Release store that ends its
            // operation: its list changes are visible once this reads false.
            while cache.owner.active.load(Ordering::Acquire) {
                spin(round);
                round += 1;
            }
        }
        LockedOut { entries }
    }

    /// Closes every cache: from now on drops go to [`Intake::late`]. Returns
    /// once no drop that missed the close is still under way.
    pub(crate) fn close(&self) {
        for cache in self.iter() {
            // SeqCst: the Dekker pair of `give_back_remote`'s.
            cache.shared.request.fetch_or(CLOSED, Ordering::SeqCst);
        }
        barrier::heavy();
        for cache in self.iter() {
            let mut round = 0;
            // Acquire (both): pairs with the Release stores that end an
            // owner's operation and a remote drop.
            while cache.owner.active.load(Ordering::Acquire)
                || cache.shared.busy.load(Ordering::SeqCst) > 0
            {
                spin(round);
                round += 1;
            }
        }
    }
}
