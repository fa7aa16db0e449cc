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
//! - The shared part holds two [remote lists](crate::remote): buffers the
//!   cleaner made ready for this owner, and buffers other threads dropped;
//!   the owner collects each with one swap on its next take.
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
//! `clear`, the cleaner's sweep of idle caches, and closing the pool. Such
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

use std::ptr::NonNull;

use crossbeam_utils::CachePadded;

use crate::alloc::{Block, Meta};
use crate::flush::{Counts, Flush, OwnerCounts, SharedCounts};
use crate::remote::RemoteList;
use crate::size_class::{Classes, SizeClass};
use crate::slots::Slots;
use crate::stats::Counters;
use crate::sync::per_thread::{self, PerThread};
use crate::sync::{
    barrier, fence, spin, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Mutex, MutexGuard,
    Ordering, UnsafeCell,
};
use crate::tune::{Tune, Tuning};

/// Request bit: a thief holds the cache's lock and works on its lists.
const THIEF: u32 = 1;
/// Request bit: the pool is closed; drops go to the reaper.
const CLOSED: u32 = 2;

/// Where drops that a cache does not keep go (implemented by the pool).
pub(crate) trait Sink: Sync {
    /// A dropped buffer, counted in `home`'s flush counters, that needs the
    /// cleaner. Called inside the dropping thread's active window.
    fn route(&self, home: &ThreadCache, block: Block);
    /// A buffer dropped after the pool closed.
    fn late(&self, block: Block);
}

/// What an owner's take found in its own cache.
#[derive(Debug)]
pub(crate) enum Found {
    /// A ready buffer (it was pooled: tally its footprint).
    Ready(Block),
    /// A buffer the owner dropped earlier: reusable once its fences are
    /// done and its dirty prefix re-zeroed; with the number of other
    /// buffers of its slot still deferred (in flight behind it).
    Deferred(Block, usize),
}

/// Ready and deferred buffers of one slot.
#[derive(Debug, Default)]
struct Slot {
    ready: Vec<Block>,
    deferred: Deferred,
}

/// A slot's deferred buffers, oldest first: a FIFO linked through the
/// blocks' metadata (`Meta::next`, which only the remote lists use
/// otherwise, and a block in a cache's lists is on none), so that deferring
/// and reusing a buffer write nothing but the slot and the block's own
/// metadata.
#[derive(Debug)]
struct Deferred {
    head: *mut Meta,
    tail: *mut Meta,
    len: usize,
}

impl Default for Deferred {
    fn default() -> Self {
        Self {
            head: std::ptr::null_mut(),
            tail: std::ptr::null_mut(),
            len: 0,
        }
    }
}

impl Deferred {
    #[inline]
    fn len(&self) -> usize {
        self.len
    }

    /// Adds `block` as the newest.
    #[inline]
    fn push_back(&mut self, block: Block) {
        let node = block.into_raw();
        // SAFETY: `node` came from `into_raw`: a live metadata box that this
        // list now owns, linked nowhere else.
        unsafe { (*node).next = std::ptr::null_mut() };
        if self.tail.is_null() {
            self.head = node;
        } else {
            // SAFETY: a non-null `tail` is a live node this list owns.
            unsafe { (*self.tail).next = node };
        }
        self.tail = node;
        self.len += 1;
    }

    /// Adds `block` as the oldest.
    fn push_front(&mut self, block: Block) {
        let node = block.into_raw();
        // SAFETY: as in `push_back`.
        unsafe { (*node).next = self.head };
        if self.tail.is_null() {
            self.tail = node;
        }
        self.head = node;
        self.len += 1;
    }

    /// Takes the oldest.
    #[inline]
    fn pop_front(&mut self) -> Option<Block> {
        let node = self.head;
        if node.is_null() {
            return None;
        }
        // SAFETY: a non-null `head` is a live node this list owns.
        self.head = unsafe { (*node).next };
        if self.head.is_null() {
            self.tail = std::ptr::null_mut();
        }
        self.len -= 1;
        // SAFETY: `node` came from `into_raw` and is unlinked now: the block
        // returned is its only owner.
        Some(unsafe { Block::from_raw(node) })
    }

    /// Takes every block, oldest first.
    fn drain(&mut self) -> impl Iterator<Item = Block> + '_ {
        std::iter::from_fn(move || self.pop_front())
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        // Lists are drained before a pool goes away; dropping a block here
        // unmaps it (or leaks it if still pinned), as a `Vec` of them would.
        for block in self.drain() {
            drop(block);
        }
    }
}

/// Room reserved in a slot's ready list on first use: 16 entries (128
/// bytes), of which a tight loop uses the first few, so the entries the
/// owner writes never share a cache line with another thread's allocation.
const SLOT_ROOM: usize = 16;

impl Slot {
    #[inline]
    fn push_ready(&mut self, block: Block) {
        if self.ready.capacity() == 0 {
            self.ready.reserve(SLOT_ROOM);
        }
        self.ready.push(block);
    }

    #[inline]
    fn defer(&mut self, block: Block) {
        self.deferred.push_back(block);
    }
}

/// A cache's lists: only its owner inside an operation, or a thief that has
/// locked the owner out, touches them.
#[derive(Debug, Default)]
pub(crate) struct Lists {
    /// Per slot (device and class); allocated for all devices on first use.
    slots: Vec<Slot>,
    deferred: usize,
}

impl Lists {
    #[inline]
    fn slot(&mut self, slots: usize, slot: usize) -> &mut Slot {
        if self.slots.is_empty() {
            self.allocate(slots);
        }
        &mut self.slots[slot]
    }

    #[cold]
    fn allocate(&mut self, slots: usize) {
        self.slots = (0..slots).map(|_| Slot::default()).collect();
    }

    /// Every slot, with its index.
    fn slots(&mut self) -> impl Iterator<Item = (usize, &mut Slot)> {
        self.slots.iter_mut().enumerate()
    }
}

/// A slot's counters written by the owner (the orphan cache adds with
/// `fetch_add`), read by statistics and hints: one take or drop touches one
/// of these, and two share a cache line.
#[derive(Debug, Default)]
#[repr(align(32))]
struct SlotCounts {
    /// Takes served from the pool.
    hits: AtomicU64,
    /// Takes that allocated.
    misses: AtomicU64,
    /// Drops by the owner of buffers taken through this cache (drops by
    /// other threads are `SharedPart::drops`), for the buffers in use per
    /// class (takes minus drops).
    drops: AtomicU64,
    /// Ready buffers in the lists (owner-written; hints for thieves,
    /// stats).
    ready: AtomicU32,
}

/// State written by the owner (and by a thief that has locked it out).
#[derive(Debug)]
struct OwnerPart {
    /// Inside an operation on the lists.
    active: AtomicBool,
    /// Whether this is the orphan cache (no owner: its counters are updated
    /// with read-modify-writes).
    orphan: bool,
    /// The owning thread's token ([`per_thread::current_token`]), set by
    /// the owner when it looks its cache up without its memo (see
    /// [`PerThread::get_or`]).
    token: AtomicU64,
    lists: UnsafeCell<Lists>,
    counts: OwnerCounts,
    /// Per slot.
    slots: Slots<SlotCounts>,
    /// Footprint bytes this cache took out of the pool, for the cap's
    /// estimate (see `admission`).
    taken_bytes: AtomicU64,
    /// Buffers in the deferred lists.
    deferred: AtomicUsize,
    /// Footprint bytes in the ready lists.
    ready_bytes: AtomicUsize,
    /// When this owner last locked other owners out to steal (microseconds
    /// since the pool was built): steals that interrupt every thread are
    /// rate-limited.
    last_steal: AtomicU64,
    /// Deferred buffers this cache's owner re-zeroed itself.
    cleaned: AtomicU64,
    /// Takes served by a buffer of a larger class.
    borrowed: AtomicU64,
    caches: NonNull<Caches>,
}

/// State other threads write.
#[derive(Debug)]
struct SharedPart {
    request: AtomicU32,
    lock: Mutex<()>,
    /// Ready buffers the cleaner returned to this owner.
    remote: RemoteList,
    /// Buffers other threads dropped (not yet cleaned).
    returns: RemoteList,
    /// Pinned buffers dropped through this cache while the cleaner's
    /// recycling backlog was full, for the cleaner to release in bulk.
    released: RemoteList,
    counts: SharedCounts,
    /// Drops by other threads in progress (closing waits for them).
    busy: AtomicUsize,
    /// Footprint bytes taken through the orphan cache (no owner).
    taken_bytes: AtomicU64,
    /// Buffers counted as dropped through this cache without a take: those
    /// pinned ahead of demand (`count_returned`), so that closing counts
    /// the buffers still out as takes plus these minus drops.
    injected: AtomicU64,
    /// Drops per slot by threads other than the owner of buffers taken
    /// through this cache (`fetch_add`; see `SlotCounts::drops`).
    drops: Slots<AtomicU64>,
}

/// One thread's cache; see the module docs.
#[derive(Debug)]
pub(crate) struct ThreadCache {
    owner: CachePadded<OwnerPart>,
    shared: CachePadded<SharedPart>,
}

// SAFETY: the lists in the `UnsafeCell` are touched only under the owner /
// thief handshake (see the module docs); everything else is atomics, a
// mutex, and a pointer to the `Caches` that own this cache.
unsafe impl Send for ThreadCache {}
// SAFETY: as above.
unsafe impl Sync for ThreadCache {}

/// Adds one to a counter written by one thread at a time.
#[inline]
fn bump(counter: &AtomicU64, by: u64) {
    // Relaxed: a statistic; the caller is its only writer.
    counter.store(counter.load(Ordering::Relaxed) + by, Ordering::Relaxed);
}

// === impl ThreadCache ===

impl ThreadCache {
    fn new(classes: &Classes, devices: usize, caches: NonNull<Caches>, orphan: bool) -> Self {
        let slots = classes.count() * devices;
        Self {
            owner: CachePadded::new(OwnerPart {
                active: AtomicBool::new(false),
                orphan,
                token: AtomicU64::new(per_thread::NOBODY),
                lists: UnsafeCell::new(Lists::default()),
                counts: OwnerCounts::default(),
                slots: Slots::new(slots),
                taken_bytes: AtomicU64::new(0),
                deferred: AtomicUsize::new(0),
                ready_bytes: AtomicUsize::new(0),
                last_steal: AtomicU64::new(0),
                cleaned: AtomicU64::new(0),
                borrowed: AtomicU64::new(0),
                caches,
            }),
            shared: CachePadded::new(SharedPart {
                request: AtomicU32::new(0),
                lock: Mutex::new(()),
                remote: RemoteList::new(slots),
                returns: RemoteList::new(slots),
                released: RemoteList::new(slots),
                counts: SharedCounts::default(),
                busy: AtomicUsize::new(0),
                taken_bytes: AtomicU64::new(0),
                injected: AtomicU64::new(0),
                drops: Slots::new(slots),
            }),
        }
    }

    #[inline]
    pub(crate) fn caches(&self) -> &Caches {
        // SAFETY: a cache lives inside its `Caches` and never outlives it.
        unsafe { self.owner.caches.as_ref() }
    }

    /// Runs `f` on the lists as their owner: the fast path when no thief is
    /// at work, else after the thief's lock. `None` once the pool is closed.
    #[inline]
    fn as_owner<R>(&self, f: impl FnOnce(&mut Lists) -> R) -> Option<R> {
        let owner = &self.owner;
        // Relaxed: ordered before the request load by the barrier below.
        owner.active.store(true, Ordering::Relaxed);
        barrier::light();
        // Acquire pairs with a thief's Release when it clears its request,
        // so what it did to the lists is visible here.
        if self.shared.request.load(Ordering::Acquire) == 0 {
            // SAFETY: this thread owns the cache, it is marked active, and no
            // thief had asked when it looked: by the barrier, any thief that
            // asks from now on sees `active` and waits until the store below.
            let out = owner.lists.with_mut(|lists| f(unsafe { &mut *lists }));
            // Release publishes the list changes to a thief whose Acquire
            // load of `active` reads this store.
            owner.active.store(false, Ordering::Release);
            return Some(out);
        }
        owner.active.store(false, Ordering::Release);
        self.as_owner_locked(f)
    }

    #[cold]
    fn as_owner_locked<R>(&self, f: impl FnOnce(&mut Lists) -> R) -> Option<R> {
        let _lock = self.shared.lock.lock();
        // Relaxed: the lock orders this after the last thief's writes.
        if self.shared.request.load(Ordering::Relaxed) & CLOSED != 0 {
            return None;
        }
        // SAFETY: thieves touch the lists only while holding the lock, which
        // this thread holds; the owner is this thread.
        Some(self.owner.lists.with_mut(|lists| f(unsafe { &mut *lists })))
    }

    /// The owner's take: a ready buffer of (`device`, `class`), else one of
    /// its own deferred buffers, collecting the remote list first if the
    /// slot is empty.
    #[inline]
    pub(crate) fn take(&self, device: usize, class: SizeClass) -> Option<Found> {
        let caches = self.caches();
        let slot = caches.classes.slot(device, class);
        self.as_owner(|lists| {
            if !self.shared.remote.is_empty() || !self.shared.returns.is_empty() {
                self.collect(lists);
            }
            let found = lists.slot(caches.slots, slot);
            if let Some(block) = found.ready.pop() {
                self.unready(slot, &block);
                return Some(Found::Ready(block));
            }
            let block = found.deferred.pop_front()?;
            let behind = found.deferred.len();
            lists.deferred -= 1;
            self.owner.deferred.store(lists.deferred, Ordering::Relaxed);
            Some(Found::Deferred(block, behind))
        })
        .flatten()
    }

    /// The owner's borrow: a ready buffer of one of `classes` (larger than
    /// the one asked for) from its own lists.
    pub(crate) fn borrow_ready(
        &self,
        device: usize,
        classes: impl Iterator<Item = SizeClass>,
    ) -> Option<Block> {
        let caches = self.caches();
        self.as_owner(|lists| {
            for class in classes {
                let slot = caches.classes.slot(device, class);
                if let Some(block) = lists.slot(caches.slots, slot).ready.pop() {
                    self.unready(slot, &block);
                    return Some(block);
                }
            }
            None
        })
        .flatten()
    }

    /// Puts back a deferred buffer whose fences are still running.
    pub(crate) fn put_back(&self, block: Block) {
        let caches = self.caches();
        let kept = self.as_owner(|lists| {
            lists
                .slot(
                    caches.slots,
                    caches.classes.slot(block.device(), block.class()),
                )
                .deferred
                .push_front(block);
            lists.deferred += 1;
            self.owner.deferred.store(lists.deferred, Ordering::Relaxed);
        });
        debug_assert!(kept.is_some(), "a take runs only while the pool is open");
    }

    /// Moves both remote lists into the lists (inside an operation, so a
    /// thief that locks the owner out sees the buffers in one place or the
    /// other).
    fn collect(&self, lists: &mut Lists) {
        self.adopt(lists, self.shared.remote.take_all());
        let classes = &self.caches().classes;
        for block in self.shared.returns.take_all() {
            let (device, class) = (block.device(), block.class());
            let slot = classes.slot(device, class);
            lists.slot(self.caches().slots, slot).defer(block);
            lists.deferred += 1;
        }
        self.owner.deferred.store(lists.deferred, Ordering::Relaxed);
    }

    /// Adds ready buffers to the lists.
    fn adopt(&self, lists: &mut Lists, blocks: impl Iterator<Item = Block>) {
        let classes = &self.caches().classes;
        for block in blocks {
            let (device, class) = (block.device(), block.class());
            let slot = classes.slot(device, class);
            self.enready(slot, &block);
            lists.slot(self.caches().slots, slot).push_ready(block);
        }
    }

    /// The owner's steal from other caches' remote lists (of ready
    /// buffers): it adopts each non-empty list whole, inside its own
    /// operation, so the buffers are never out of every thief's sight, then
    /// takes one of (`device`, `class`).
    pub(crate) fn adopt_remote_lists(&self, device: usize, class: SizeClass) -> Option<Block> {
        let caches = self.caches();
        self.as_owner(|lists| {
            for other in caches.iter().filter(|c| !std::ptr::eq(*c, self)) {
                if !other.shared.remote.is_empty() {
                    self.adopt(lists, other.shared.remote.take_all());
                }
            }
            let slot = caches.classes.slot(device, class);
            let block = lists.slot(caches.slots, slot).ready.pop()?;
            self.unready(slot, &block);
            Some(block)
        })
        .flatten()
    }

    /// Accounts for `block` joining the ready list of `slot`. Written by the
    /// owner or a thief that has locked it out.
    fn enready(&self, slot: usize, block: &Block) {
        let n = &self.owner.slots[slot].ready;
        // Relaxed: statistics and hints, with one writer at a time.
        n.store(n.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        let bytes = &self.owner.ready_bytes;
        bytes.store(
            bytes.load(Ordering::Relaxed) + block.footprint(),
            Ordering::Relaxed,
        );
    }

    /// Accounts for `block` leaving the ready list of `slot`.
    fn unready(&self, slot: usize, block: &Block) {
        let n = &self.owner.slots[slot].ready;
        // Relaxed: as in `enready`.
        n.store(n.load(Ordering::Relaxed) - 1, Ordering::Relaxed);
        let bytes = &self.owner.ready_bytes;
        bytes.store(
            bytes.load(Ordering::Relaxed) - block.footprint(),
            Ordering::Relaxed,
        );
    }

    /// Gives a dropped buffer back: to the owner's deferred list, this
    /// cache's remote list, or the cleaner. Never blocks, never calls the
    /// backend.
    #[inline]
    pub(crate) fn give_back(&self, mut block: Block) {
        let caches = self.caches();
        let keep = self.deferrable(&mut block);
        if !self.is_owned_here() {
            return self.give_back_remote(block, keep);
        }
        let mut held = Some(block);
        let counted = self.as_owner(|lists| {
            let mut block = held.take().expect("taken once");
            let parity = caches.flush.parity();
            let meta = block.meta_mut();
            meta.parity = parity as u8;
            meta.returned = true;
            self.owner.counts.dropped(parity);
            let slot = block.slot();
            bump(&self.owner.slots[slot].drops, 1);
            if keep && lists.deferred < Tune::MAX_DEFERRED {
                lists.slot(caches.slots, slot).defer(block);
                lists.deferred += 1;
                self.owner.deferred.store(lists.deferred, Ordering::Relaxed);
            } else {
                // Inside the active window, so closing cannot miss it.
                caches.sink().route(self, block);
            }
        });
        if counted.is_none() {
            caches
                .sink()
                .late(held.take().expect("the closure did not run"));
        }
    }

    fn give_back_remote(&self, mut block: Block, keep: bool) {
        let caches = self.caches();
        let shared = &self.shared;
        // Dekker against `Caches::close`, which sets CLOSED, fences (its
        // heavy barrier) and then reads `busy`: with the SeqCst fences
        // between each side's write and read, either this load sees CLOSED
        // or the close sees this drop under way and waits for it.
        shared.busy.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if shared.request.load(Ordering::Relaxed) & CLOSED != 0 {
            shared.busy.fetch_sub(1, Ordering::Release);
            caches.sink().late(block);
            return;
        }
        let parity = caches.flush.parity();
        let meta = block.meta_mut();
        meta.parity = parity as u8;
        meta.returned = true;
        shared.counts.dropped(parity);
        // Relaxed: a statistic.
        self.shared.drops[block.slot()].fetch_add(1, Ordering::Relaxed);
        if keep {
            shared.returns.push(block);
        } else {
            caches.sink().route(self, block);
        }
        // Release: the close's Acquire read of `busy` sees the push.
        shared.busy.fetch_sub(1, Ordering::Release);
    }

    /// Counts `block` as dropped through this cache by a thread that does
    /// not own it (a buffer pinned ahead of demand enters the cleaner this
    /// way, through the orphan cache), so that `flush` waits for it.
    pub(crate) fn count_returned(&self, block: &mut Block) {
        let parity = self.caches().flush.parity();
        let meta = block.meta_mut();
        meta.parity = parity as u8;
        meta.returned = true;
        // Relaxed: read when the pool closes, after the handle's release
        // (reserve) or the workers' join (provisioning), as the drop counts.
        self.shared.injected.fetch_add(1, Ordering::Relaxed);
        self.shared.counts.dropped(parity);
    }

    /// The orphan cache (no owner), home of buffers pinned ahead of demand.
    pub(crate) fn orphan(&self) -> &ThreadCache {
        &self.caches().orphan
    }

    /// Whether a dropped buffer may wait for the next taker instead of the
    /// cleaner: small, needing no registration and no device synchronize.
    #[inline]
    fn deferrable(&self, block: &mut Block) -> bool {
        let needs_registration = self.caches().pins && !block.is_pinned();
        let needs_device_sync = block.is_pinned() && block.fences_mut().is_empty();
        // Relaxed: a setting. Racing a change of the cap, a drop may keep
        // one buffer above the new cap (the owner reuses it, or a flush
        // sends it through the cleaner, which applies the cap) or send one
        // below it to the cleaner; neither loses it.
        let fits = block.footprint() <= self.caches().cap();
        block.dirty() <= Tune::SELF_CLEAN_BYTES && fits && !needs_registration && !needs_device_sync
    }

    /// Counts the completion (ready again, or released) of a buffer whose
    /// drop was counted here in `parity`. The owner counts without a shared
    /// write; others notify waiting flushes.
    #[inline]
    pub(crate) fn complete(&self, parity: usize, by_owner: bool) {
        if by_owner {
            self.owner.counts.done(parity);
        } else {
            self.shared.counts.done(parity);
            self.caches().flush.notify();
        }
    }

    /// As [`complete`](Self::complete) by a thread other than the owner,
    /// without waking flushes: the caller completes a batch and then
    /// notifies once (`Flush::notify`), so that a flush waiting on a large
    /// batch is not woken by every buffer of it.
    pub(crate) fn complete_quietly(&self, parity: usize) {
        self.shared.counts.done(parity);
    }

    /// Counts a take served by a buffer of a larger class.
    #[inline]
    pub(crate) fn count_borrowed(&self) {
        if self.is_orphan() {
            // Relaxed: a statistic.
            self.owner.borrowed.fetch_add(1, Ordering::Relaxed);
        } else {
            bump(&self.owner.borrowed, 1);
        }
    }

    /// Takes served by a buffer of a larger class.
    pub(crate) fn borrowed(&self) -> u64 {
        // Relaxed: a statistic.
        self.owner.borrowed.load(Ordering::Relaxed)
    }

    /// Counts a deferred buffer that the taker re-zeroed itself.
    #[inline]
    pub(crate) fn count_cleaned(&self) {
        if self.is_orphan() {
            // Relaxed: a statistic.
            self.owner.cleaned.fetch_add(1, Ordering::Relaxed);
        } else {
            bump(&self.owner.cleaned, 1);
        }
    }

    /// Deferred buffers the takers re-zeroed themselves.
    pub(crate) fn cleaned(&self) -> u64 {
        // Relaxed: a statistic.
        self.owner.cleaned.load(Ordering::Relaxed)
    }

    /// Hands a ready buffer to the owner through the remote list (the
    /// cleaner's return path). The caller has checked [`has_room`].
    ///
    /// [`has_room`]: Self::has_room
    pub(crate) fn push_ready(&self, block: Block) {
        self.shared.remote.push(block);
    }

    /// Whether the cache can take `bytes` more ready bytes (a racing read
    /// may over- or under-state the room by one buffer; the cap is kept by
    /// the pool's estimate, not by this).
    pub(crate) fn has_room(&self, bytes: usize) -> bool {
        // Relaxed: a soft limit.
        let held =
            self.owner.ready_bytes.load(Ordering::Relaxed) + self.shared.remote.ready_bytes();
        held + bytes <= self.caches().limit
    }

    /// Counts a take that hit, of `bytes` pooled footprint bytes (0 for a
    /// buffer the taker re-zeroed itself).
    #[inline]
    pub(crate) fn count_hit(&self, slot: usize, pooled_bytes: usize) {
        self.count(&self.owner.slots[slot].hits);
        if pooled_bytes > 0 {
            self.count_taken_bytes(pooled_bytes);
        }
    }

    /// Counts a take that allocated.
    #[inline]
    pub(crate) fn count_miss(&self, slot: usize) {
        self.count(&self.owner.slots[slot].misses);
    }

    /// Tallies pooled bytes taken through this cache (a steal or a shard
    /// pop included).
    #[inline]
    fn count_taken_bytes(&self, bytes: usize) {
        if self.is_orphan() {
            self.shared
                .taken_bytes
                .fetch_add(bytes as u64, Ordering::Relaxed);
        } else {
            bump(&self.owner.taken_bytes, bytes as u64);
        }
    }

    #[inline]
    fn count(&self, counter: &AtomicU64) {
        if self.is_orphan() {
            // Relaxed: a statistic.
            counter.fetch_add(1, Ordering::Relaxed);
        } else {
            bump(counter, 1);
        }
    }

    /// Whether this owner may lock others out to steal now (at `now_us`):
    /// at most once per `every_us`. Owner-only, so a load and a store.
    pub(crate) fn may_steal(&self, now_us: u64, every_us: u64) -> bool {
        let last = &self.owner.last_steal;
        // Relaxed: owner-only state.
        if now_us.saturating_sub(last.load(Ordering::Relaxed)) < every_us {
            return false;
        }
        last.store(now_us, Ordering::Relaxed);
        true
    }

    /// Whether the calling thread owns this cache.
    #[inline]
    pub(crate) fn is_owned_here(&self) -> bool {
        // Relaxed: see `Caches::local`.
        self.owner.token.load(Ordering::Relaxed) == per_thread::current_token()
    }

    #[inline]
    fn is_orphan(&self) -> bool {
        self.owner.orphan
    }

    /// Buffers of `slot` taken through this cache and not yet dropped (a
    /// racing read may be off by the takes and drops under way).
    pub(crate) fn in_use(&self, slot: usize) -> u64 {
        // Relaxed: a statistic and a provisioning hint.
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let counts = &self.owner.slots[slot];
        (load(&counts.hits) + load(&counts.misses))
            .saturating_sub(load(&counts.drops) + load(&self.shared.drops[slot]))
    }

    /// Takes through this cache, ever (hits and misses of every slot; exact
    /// once takes have stopped, as when the pool closes: every take needs a
    /// handle, so it happened before the last handle's drop, whose `Arc`
    /// release orders its counts before the close's Relaxed reads).
    pub(crate) fn takes(&self) -> u64 {
        (0..self.caches().slots)
            .map(|slot| {
                let (hits, misses) = self.hits_misses(slot);
                hits + misses
            })
            .sum()
    }

    /// Buffers counted as dropped through this cache without a take (see
    /// [`count_returned`](Self::count_returned)); exact when the pool
    /// closes, as [`takes`](Self::takes).
    pub(crate) fn injected(&self) -> u64 {
        // Relaxed: see `count_returned`.
        self.shared.injected.load(Ordering::Relaxed)
    }

    /// Hits and misses of `slot` (statistics).
    pub(crate) fn hits_misses(&self, slot: usize) -> (u64, u64) {
        let counts = &self.owner.slots[slot];
        // Relaxed: statistics.
        (
            counts.hits.load(Ordering::Relaxed),
            counts.misses.load(Ordering::Relaxed),
        )
    }

    /// Ready buffers of `slot` in this cache's lists and remote list (an
    /// estimate while the cache is in use).
    pub(crate) fn ready_in(&self, slot: usize) -> u32 {
        // Relaxed: a statistic or a hint.
        self.owner.slots[slot].ready.load(Ordering::Relaxed) + self.shared.remote.ready_in(slot)
    }

    /// Footprint bytes taken out of the pool through this cache, ever.
    pub(crate) fn taken_bytes(&self) -> u64 {
        // Relaxed: folded into the cap's estimate under its lock; a stale
        // value leaves the estimate high, which is the safe direction.
        self.owner.taken_bytes.load(Ordering::Relaxed)
            + self.shared.taken_bytes.load(Ordering::Relaxed)
    }

    /// Whether dropped buffers wait in this cache for their owner (deferred,
    /// or dropped by other threads). Relaxed: a hint for sweeps and
    /// flushes; a stale `false` only delays them to their next round (a
    /// flush loops until its parity balances).
    pub(crate) fn has_waiting(&self) -> bool {
        self.owner.deferred.load(Ordering::Relaxed) > 0 || !self.shared.returns.is_empty()
    }

    /// Whether ready buffers sit in this cache's lists (a hint: Relaxed; a
    /// stale answer moves a sweep to its next round).
    pub(crate) fn has_ready(&self) -> bool {
        self.owner.ready_bytes.load(Ordering::Relaxed) > 0
    }

    /// A figure that changes whenever the owner drops, reuses a deferred
    /// buffer, or takes or gains a ready one (sweeps leave active caches to
    /// their owners): drops, the owner's completions, and the ready bytes.
    /// A ready take and a refill of the same size between two sweeps cancel
    /// out; the sweep then moves a busy cache's ready buffers to the shards,
    /// where its owner's next take finds them.
    pub(crate) fn activity(&self) -> u64 {
        // Relaxed: a heuristic.
        crate::flush::drops(std::iter::once(self.counts()))
            + self.owner.counts.completions()
            + self.owner.ready_bytes.load(Ordering::Relaxed) as u64
    }

    /// The cache's flush counters.
    pub(crate) fn counts(&self) -> Counts<'_> {
        (&self.owner.counts, &self.shared.counts)
    }

    /// The remote list of ready buffers, for eviction and `clear` (under
    /// the admission lock).
    pub(crate) fn remote(&self) -> &RemoteList {
        &self.shared.remote
    }

    /// The remote list of buffers dropped by other threads, for flushes,
    /// sweeps and closing: a swap takes it whole.
    pub(crate) fn returns(&self) -> &RemoteList {
        &self.shared.returns
    }

    /// The list of pinned buffers dropped through this cache that the
    /// cleaner is to release in bulk (see `Cleaner::shed`).
    pub(crate) fn released(&self) -> &RemoteList {
        &self.shared.released
    }
}

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
    /// The devices' primary contexts (CUDA backend), for raw-stream fences.
    pub(crate) contexts: Vec<std::sync::Arc<cudarc::driver::CudaContext>>,
    devices: usize,
    /// Devices times classes.
    slots: usize,
    limit: usize,
    /// The pool's cap on pooled bytes, as last set: the only copy of it
    /// (admission, the settings and the statistics read it here). A buffer
    /// above it is never kept back in its owner's cache (deferred), since
    /// it could not be pooled either.
    cap: AtomicUsize,
    pins: bool,
    sink: crate::sync::OnceLock<SinkRef>,
}

/// A pointer to the pool that owns the caches.
struct SinkRef(NonNull<dyn Sink>);

// SAFETY: the sink is the pool, `Sync`, and outlives its caches.
unsafe impl Send for SinkRef {}
// SAFETY: as above.
unsafe impl Sync for SinkRef {}

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
    /// `limit` ready bytes each, under the pool's `cap`, on a backend that
    /// `pins` or not.
    pub(crate) fn new(
        classes: Classes,
        devices: usize,
        limit: usize,
        cap: usize,
        pins: bool,
        contexts: Vec<std::sync::Arc<cudarc::driver::CudaContext>>,
    ) -> Box<Self> {
        let orphan = ThreadCache::new(&classes, devices, NonNull::dangling(), true);
        let slots = devices * classes.count();
        let mut caches = Box::new(Self {
            map: PerThread::new(),
            orphan,
            flush: Flush::new(),
            classes,
            counters: CachePadded::new(Counters::default()),
            contexts,
            slots,
            devices,
            limit,
            cap: AtomicUsize::new(cap),
            pins,
            sink: crate::sync::OnceLock::new(),
        });
        // The box gave `Caches` its address: point the orphan at it.
        caches.orphan.owner.caches = NonNull::from(&*caches);
        caches
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

    /// Sets where drops go; once, before any cache is used.
    ///
    /// # Safety
    /// `sink` outlives these caches.
    pub(crate) unsafe fn set_sink(&self, sink: &(dyn Sink + 'static)) {
        let _ = self.sink.set(SinkRef(NonNull::from(sink)));
    }

    fn sink(&self) -> &dyn Sink {
        let sink = self.sink.get().expect("the pool sets its sink when built");
        // SAFETY: the sink outlives the caches (see `set_sink`).
        unsafe { sink.0.as_ref() }
    }

    /// The calling thread's cache and whether the thread owns it: its own,
    /// or the orphan cache (not owned) while the thread is being torn down.
    #[inline]
    pub(crate) fn local(&self) -> (&ThreadCache, bool) {
        let cache = self.map.get_or(
            || ThreadCache::new(&self.classes, self.devices, NonNull::from(self), false),
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

    /// Closes every cache: from now on drops go to [`Sink::late`]. Returns
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

// === impl Lists (thief side) ===

impl Lists {
    /// Takes a ready buffer of (`device`, `class`) from a locked-out cache.
    pub(crate) fn steal_ready(
        &mut self,
        cache: &ThreadCache,
        device: usize,
        class: SizeClass,
    ) -> Option<Block> {
        let slot = cache.caches().classes.slot(device, class);
        let block = self.slot(cache.caches().slots, slot).ready.pop()?;
        cache.unready(slot, &block);
        Some(block)
    }

    /// Takes every ready buffer of a locked-out cache, or only those of
    /// class index `class`.
    pub(crate) fn take_ready(&mut self, cache: &ThreadCache, class: Option<usize>) -> Vec<Block> {
        let classes = &cache.caches().classes;
        let mut out = Vec::new();
        let count = classes.count();
        for (i, slot) in self.slots() {
            if class.is_some_and(|want| want != i % count) {
                continue;
            }
            for block in slot.ready.drain(..) {
                cache.unready(classes.slot(block.device(), block.class()), &block);
                out.push(block);
            }
        }
        out
    }

    /// Puts a ready buffer back into a locked-out cache's lists.
    pub(crate) fn put_ready(&mut self, cache: &ThreadCache, block: Block) {
        let slot = cache.caches().classes.slot(block.device(), block.class());
        cache.enready(slot, &block);
        self.slot(cache.caches().slots, slot).push_ready(block);
    }

    /// Takes every deferred buffer of a locked-out cache.
    pub(crate) fn take_deferred(&mut self, cache: &ThreadCache) -> Vec<Block> {
        let mut out = Vec::with_capacity(self.deferred);
        for (_, slot) in self.slots() {
            out.extend(slot.deferred.drain());
        }
        self.deferred = 0;
        cache.owner.deferred.store(0, Ordering::Relaxed);
        out
    }

    /// Takes the oldest deferred buffer of (`device`, `class`).
    pub(crate) fn steal_deferred(
        &mut self,
        cache: &ThreadCache,
        device: usize,
        class: SizeClass,
    ) -> Option<Block> {
        let block = self
            .slot(
                cache.caches().slots,
                cache.caches().classes.slot(device, class),
            )
            .deferred
            .pop_front()?;
        self.deferred -= 1;
        cache.owner.deferred.store(self.deferred, Ordering::Relaxed);
        Some(block)
    }
}
