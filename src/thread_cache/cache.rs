//! One thread's cache: the owner part, the shared part and the flush
//! books, the owner's take and drop, and the thieves' side (see the parent
//! module for the handshake).

use std::ptr::NonNull;

use crossbeam_utils::CachePadded;

use crate::alloc::Block;
use crate::cleaner::intake::Origin;
use crate::counter::Counter;
use crate::flush::{Books, Counts, Flush, Ticket};
use crate::remote::{Inbox, Returns};
use crate::size_class::{Classes, SizeClass};
use crate::slots::Slots;
use crate::sync::per_thread::{self};
use crate::sync::{
    barrier, fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Mutex, Ordering, UnsafeCell,
};
use crate::trace::ring::{compact_drop, compact_take, Ring};
use crate::trace::{trace_head, Source, DROP, DROP_COPY, DROP_PINNED, DROP_REMOTE, TAKE};
use crate::tune::{Tune, Tuning};

use super::counts::SlotCounts;
use super::lists::Lists;
use super::{Caches, CLOSED};

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

/// What [`ThreadCache::take_done`] found.
#[derive(Debug)]
pub(crate) enum Own {
    /// A ready buffer (it was pooled: tally its footprint).
    Ready(Block),
    /// A deferred buffer whose copies have ended (or whose fences failed).
    Done(Block),
    /// This many deferred buffers, the first ones' copies still running.
    Running(usize),
    /// Nothing of the slot.
    None,
}

/// State written by the owner (and by a thief that has locked it out).
#[derive(Debug)]
pub(super) struct OwnerPart {
    /// Inside an operation on the lists.
    pub(super) active: AtomicBool,
    /// The owning thread's token ([`per_thread::current_token`]), set by
    /// the owner when it looks its cache up without its memo (see
    /// [`PerThread::get_or`](crate::sync::per_thread::PerThread::get_or)).
    /// On a line of its own: every drop reads it (is the dropper the
    /// owner?), and a thread dropping another's buffers would otherwise
    /// pull the line the owner writes at every take (`active`) to its core
    /// and back, once a drop.
    pub(super) token: CachePadded<AtomicU64>,
    pub(super) lists: UnsafeCell<Lists>,
    /// Per slot.
    slots: Slots<SlotCounts>,
    /// Footprint bytes this cache took out of the pool, for the cap's
    /// estimate (see `admission`).
    taken_bytes: Counter,
    /// Buffers in the deferred lists.
    deferred: AtomicUsize,
    /// When this owner last locked other owners out to steal (microseconds
    /// since the pool was built): steals that interrupt every thread are
    /// rate-limited.
    last_steal: AtomicU64,
    /// Whether the owner is inside a take, waiting for the copies of one
    /// of its own dropped buffers to end (see [`ThreadCache::waiting`]).
    waiting: AtomicBool,
    /// Until when (microseconds since the pool was built) the owner's
    /// takes do not wait for their own copies (see
    /// [`ThreadCache::may_wait`]).
    no_waits_until: AtomicU64,
    /// Deferred buffers this cache's owner re-zeroed itself.
    cleaned: Counter,
    /// Takes served by a buffer of a larger class.
    borrowed: Counter,
    /// Takes served by carving from a region.
    carved: Counter,
    /// Takes that waited for the copies of the owner's own dropped
    /// buffers (see `Shared::wait_for_own` and `Shared::reuse_own`).
    own_waits: Counter,
    /// Nanoseconds those takes waited.
    own_wait_nanos: Counter,
    /// Whether the owner's take under way has been counted in `own_waits`
    /// already (its wait on its oldest buffer ended without one it could
    /// reuse, and the take goes on): a second wait of the same take adds
    /// its time only. Owner-only.
    take_counted: AtomicBool,
}

/// An owner waiting for its own copies (see [`ThreadCache::waiting`]).
#[derive(Debug)]
pub(crate) struct Waiting<'a>(&'a ThreadCache);

impl Waiting<'_> {
    /// Leaves the owner marked waiting for the rest of the take under way,
    /// which goes on past this wait and takes the mark over (see
    /// [`ThreadCache::still_waiting`]).
    pub(crate) fn go_on(self) {
        std::mem::forget(self);
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        // Relaxed: see `ThreadCache::is_waiting`.
        self.0.owner.waiting.store(false, Ordering::Relaxed);
    }
}

/// State other threads write.
#[derive(Debug)]
pub(super) struct SharedPart {
    pub(super) request: AtomicU32,
    pub(super) lock: Mutex<()>,
    /// What the cleaner hands this cache: ready buffers for the owner,
    /// and pinned buffers to release in bulk.
    inbox: Inbox,
    /// Buffers other threads dropped (not yet cleaned), with their flush
    /// tickets, in batches. With `busy`, on lines of their own: a thread
    /// dropping another's buffers writes them at every drop, and the owner
    /// reads `request` and the inbox at every take.
    pub(super) returns: Returns<RemoteDrop>,
    /// Drops by other threads in progress (closing waits for them).
    pub(super) busy: CachePadded<AtomicUsize>,
    /// Footprint bytes taken through the orphan cache (no owner).
    taken_bytes: Counter,
    /// Buffers counted as dropped through this cache without a take: those
    /// pinned ahead of demand (`open_ahead`), so that closing counts
    /// the buffers still out as takes plus these minus drops.
    ahead: Counter,
    /// Drops per slot by threads other than the owner of buffers taken
    /// through this cache (`fetch_add`; see `SlotCounts::drops`).
    drops: Slots<Counter>,
}

/// A buffer another thread dropped, waiting in its cache's returns with
/// its drop's flush ticket beside it (so that the dropping thread writes
/// nothing in the metadata lines the owner writes on every trip).
#[derive(Debug)]
pub(super) struct RemoteDrop {
    block: Block,
    ticket: Ticket,
}

impl RemoteDrop {
    /// The block, with its ticket in its metadata.
    fn into_block(self) -> Block {
        let Self { mut block, ticket } = self;
        block.set_ticket(ticket);
        block
    }
}

/// State set when the cache is made and only read after: on lines of its
/// own, which every thread that drops a buffer taken through the cache
/// reads, and nobody writes.
#[derive(Debug)]
pub(super) struct FixedPart {
    pub(super) caches: NonNull<Caches>,
    /// Whether this is the orphan cache (no owner: its counters are updated
    /// with read-modify-writes).
    orphan: bool,
    /// Where this cache's owner writes its trace records, if the pool
    /// traces (the orphan cache's is shared, and locked).
    ring: Option<std::sync::Arc<Ring>>,
}

/// One thread's cache; see the module docs.
#[derive(Debug)]
pub(crate) struct ThreadCache {
    pub(super) fixed: CachePadded<FixedPart>,
    pub(super) owner: CachePadded<OwnerPart>,
    pub(super) shared: CachePadded<SharedPart>,
    /// The flush counters of the drops through this cache.
    pub(super) books: CachePadded<Books>,
}

// SAFETY: the lists in the `UnsafeCell` are touched only under the owner /
// thief handshake (see the module docs); everything else is atomics, a
// mutex, and a pointer to the `Caches` that own this cache.
unsafe impl Send for ThreadCache {}
// SAFETY: as above.
unsafe impl Sync for ThreadCache {}

// === impl ThreadCache ===

impl ThreadCache {
    pub(super) fn new(
        classes: &Classes,
        devices: usize,
        limit: usize,
        caches: NonNull<Caches>,
        flush: NonNull<Flush>,
        orphan: bool,
        ring: Option<std::sync::Arc<Ring>>,
    ) -> Self {
        let slots = classes.count() * devices;
        Self {
            fixed: CachePadded::new(FixedPart {
                caches,
                orphan,
                ring,
            }),
            owner: CachePadded::new(OwnerPart {
                active: AtomicBool::new(false),
                token: CachePadded::new(AtomicU64::new(per_thread::NOBODY)),
                lists: UnsafeCell::new(Lists::default()),
                slots: Slots::new(slots),
                taken_bytes: Counter::default(),
                deferred: AtomicUsize::new(0),
                last_steal: AtomicU64::new(0),
                waiting: AtomicBool::new(false),
                no_waits_until: AtomicU64::new(0),
                cleaned: Counter::default(),
                borrowed: Counter::default(),
                carved: Counter::default(),
                own_waits: Counter::default(),
                own_wait_nanos: Counter::default(),
                take_counted: AtomicBool::new(false),
            }),
            shared: CachePadded::new(SharedPart {
                request: AtomicU32::new(0),
                lock: Mutex::new(()),
                inbox: Inbox::new(slots, limit),
                returns: Returns::new(|returned| returned.block.prefetch()),
                busy: CachePadded::new(AtomicUsize::new(0)),
                taken_bytes: Counter::default(),
                ahead: Counter::default(),
                drops: Slots::new(slots),
            }),
            books: CachePadded::new(Books::new(flush)),
        }
    }

    #[inline]
    pub(crate) fn caches(&self) -> &Caches {
        // SAFETY: a cache lives inside its `Caches` and never outlives it.
        unsafe { self.fixed.caches.as_ref() }
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

    /// The owner's take: a ready buffer of (`device`, `class`), else its
    /// oldest deferred one, after collecting the buffers the cleaner made
    /// ready for it and the full batches of its returns, if there are any.
    #[inline]
    pub(crate) fn take(&self, device: usize, class: SizeClass) -> Option<Found> {
        let caches = self.caches();
        let slot = caches.classes.slot(device, class);
        self.as_owner(|lists| {
            if !self.shared.inbox.ready.is_empty() || self.shared.returns.has_full() {
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

    /// The owner's take from the batch other threads' drops still fill,
    /// when its lists have no buffer of the class it can hand out now (not
    /// at every take: the batch would hold one buffer): moves the batch
    /// into the lists and hands out its newest buffer of
    /// (`device`, `class`) whose copies are done, if one of the first two
    /// of the class it polls is (a deferred buffer: the caller re-zeroes
    /// it).
    #[cold]
    pub(crate) fn take_returned(&self, device: usize, class: SizeClass) -> Option<Block> {
        if !self.shared.returns.has_open() {
            return None;
        }
        let caches = self.caches();
        let slot = caches.classes.slot(device, class);
        self.as_owner(|lists| {
            let mut found = None;
            // Polls run inside the owner's operation, where thieves wait for
            // it: a few at most (a poll may be a driver call).
            let mut polls = 2;
            let returns = self.shared.returns.take_open().filter_map(|mut returned| {
                if found.is_none() && polls > 0 && returned.block.slot() == slot {
                    polls -= 1;
                    if matches!(returned.block.fences_mut().poll(), Ok(true)) {
                        found = Some(returned.into_block());
                        return None;
                    }
                }
                Some(returned)
            });
            self.defer_returns(lists, returns);
            found
        })
        .flatten()
    }

    /// The owner's take while it waits for its own copies (see
    /// `Shared::wait_for_own`): a ready buffer of (`device`, `class`), else
    /// the oldest of its first `polls` deferred ones whose copies have
    /// ended (or whose fences failed: the caller's reuse deals with those),
    /// the others staying in their order; [`Own::Running`] (with the
    /// slot's deferred buffers) if none has, [`Own::None`] if the slot
    /// holds nothing. Buffers other threads dropped into this cache, the
    /// batch still filling included, join the lists first.
    #[cold]
    pub(crate) fn take_done(&self, device: usize, class: SizeClass, polls: usize) -> Own {
        let caches = self.caches();
        let slot = caches.classes.slot(device, class);
        self.as_owner(|lists| {
            if !self.shared.inbox.ready.is_empty() || self.shared.returns.has_full() {
                self.collect(lists);
            }
            if self.shared.returns.has_open() {
                self.defer_returns(lists, self.shared.returns.take_open());
            }
            let found = lists.slot(caches.slots, slot);
            if let Some(block) = found.ready.pop() {
                self.unready(slot, &block);
                return Own::Ready(block);
            }
            // Polls run inside the owner's operation, where thieves wait
            // for it: a few at most (a poll may be a driver call).
            let mut running = Vec::new();
            let mut done = None;
            while running.len() < polls {
                let Some(mut block) = found.deferred.pop_front() else {
                    break;
                };
                if matches!(block.fences_mut().poll(), Ok(false)) {
                    running.push(block);
                } else {
                    done = Some(block);
                    break;
                }
            }
            let none = running.is_empty() && done.is_none();
            for block in running.into_iter().rev() {
                found.deferred.push_front(block);
            }
            let deferred = found.deferred.len();
            match done {
                Some(block) => {
                    lists.deferred -= 1;
                    self.owner.deferred.store(lists.deferred, Ordering::Relaxed);
                    Own::Done(block)
                }
                None if none => Own::None,
                None => Own::Running(deferred),
            }
        })
        .unwrap_or(Own::None)
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
                .slot(caches.slots, block.slot())
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
        self.adopt(lists, self.shared.inbox.ready.take_all());
        self.defer_returns(lists, self.shared.returns.take_full());
    }

    /// Adds buffers other threads dropped to the deferred lists, each
    /// carrying its drop's flush ticket again.
    fn defer_returns(&self, lists: &mut Lists, returns: impl Iterator<Item = RemoteDrop>) {
        for returned in returns {
            let block = returned.into_block();
            lists.slot(self.caches().slots, block.slot()).defer(block);
            lists.deferred += 1;
        }
        self.owner.deferred.store(lists.deferred, Ordering::Relaxed);
    }

    /// Adds ready buffers to the lists.
    fn adopt(&self, lists: &mut Lists, blocks: impl Iterator<Item = Block>) {
        for block in blocks {
            let slot = block.slot();
            self.enready(slot, &block);
            lists.slot(self.caches().slots, slot).push_ready(block);
        }
    }

    /// The owner's steal from other caches' remote lists (of ready
    /// buffers): it adopts each list that holds a buffer of (`device`,
    /// `class`) whole, inside its own operation, so the buffers are never
    /// out of every thief's sight, then takes one of them. A list with
    /// none of the class stays with its owner, for whom the cleaner made
    /// its buffers ready: adopted, they would wait in this cache's lists,
    /// where its owner's takes do not look, until a sweep found this
    /// thread idle.
    pub(crate) fn adopt_remote_lists(&self, device: usize, class: SizeClass) -> Option<Block> {
        let caches = self.caches();
        let slot = caches.classes.slot(device, class);
        self.as_owner(|lists| {
            for other in caches.iter().filter(|c| !std::ptr::eq(*c, self)) {
                // The count is a Relaxed hint: a stale 0 leaves a buffer
                // pushed a moment ago to its owner (this take goes on as if
                // it had come a moment later); a stale count above 0 adopts
                // a list as before.
                if other.shared.inbox.ready.count_in(slot) > 0 {
                    self.adopt(lists, other.shared.inbox.ready.take_all());
                }
            }
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
        self.shared.inbox.relist(block.footprint(), true);
    }

    /// Accounts for `block` leaving the ready list of `slot`.
    fn unready(&self, slot: usize, block: &Block) {
        let n = &self.owner.slots[slot].ready;
        // Relaxed: as in `enready`.
        n.store(n.load(Ordering::Relaxed) - 1, Ordering::Relaxed);
        self.shared.inbox.relist(block.footprint(), false);
    }

    /// Gives a dropped buffer back: to the owner's deferred list, this
    /// cache's returns (a drop by another thread), or the cleaner. Never
    /// blocks, never calls the backend. `small_dirty`: its dirty prefix is
    /// at most
    /// [`SELF_CLEAN_BYTES`](crate::tune::Tuning::SELF_CLEAN_BYTES) (the
    /// guard knows without reading the metadata).
    #[inline]
    pub(crate) fn give_back(&self, mut block: Block, small_dirty: bool) {
        let caches = self.caches();
        let keep = self.deferrable(&mut block, small_dirty);
        let owned = self.is_owned_here();
        if let Some(ring) = self.ring() {
            if !(owned && self.trace_own_drop(ring, &mut block)) {
                self.trace_drop(&mut block, owned);
            }
        }
        if !owned {
            return self.give_back_remote(block, keep);
        }
        let mut held = Some(block);
        let counted = self.as_owner(|lists| {
            let mut block = held.take().expect("taken once");
            block.set_ticket(self.books.open(true));
            let slot = block.slot();
            self.owner.slots[slot].drops.bump(1);
            if keep && lists.deferred < Tune::MAX_DEFERRED {
                lists.slot(caches.slots, slot).defer(block);
                lists.deferred += 1;
                self.owner.deferred.store(lists.deferred, Ordering::Relaxed);
            } else {
                // Inside the active window, so closing cannot miss it.
                caches.intake.submit(self.origin(caches.cap(), true), block);
            }
        });
        if counted.is_none() {
            caches
                .intake
                .late(held.take().expect("the closure did not run"));
        }
    }

    /// Gives the cache a trace ring (before its first take).
    pub(super) fn trace_to(&mut self, ring: std::sync::Arc<Ring>) {
        self.fixed.ring = Some(ring);
    }

    /// The trace's ring of this cache, if the pool traces.
    #[inline]
    pub(crate) fn ring(&self) -> Option<&Ring> {
        self.fixed.ring.as_deref()
    }

    /// Records a take through this cache (`owned`: the caller owns it;
    /// else it is the orphan cache, whose ring is shared), and the taking
    /// thread's name in `block`, for its drop's record. `class`: the index
    /// of the class whose length the take handed out, if it handed out its
    /// class's length (a compact record names it).
    /// Inlined into the take: the compact record's case is written in
    /// line, a full record's out of line ([`ThreadCache::trace_full_take`]).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn trace_take(
        &self,
        ring: &Ring,
        block: &mut Block,
        owned: bool,
        asked: usize,
        len: usize,
        class: Option<usize>,
        source: Source,
    ) {
        let thread = self.thread_name(owned);
        block.meta_mut().taker = thread;
        let (id, device) = (block.as_ptr() as u64, block.device());
        let compact = class.and_then(|c| compact_take(source.code(), device, c, id, asked as u64));
        match compact {
            Some(words) => ring.push_compact(thread, words),
            None => Self::trace_full_take(ring, thread, id, device, asked, len, source),
        }
    }

    /// A take's full record (a value too large for a compact one).
    #[cold]
    #[inline(never)]
    fn trace_full_take(
        ring: &Ring,
        thread: u64,
        id: u64,
        device: usize,
        asked: usize,
        len: usize,
        source: Source,
    ) {
        let head = trace_head(TAKE, source.code(), device as u16);
        ring.push(head, thread, id, asked as u64, len as u64);
    }

    /// The calling thread's name: the owner's token, which is its name,
    /// when it owns this cache (`owned`), else read from its thread-local.
    /// The name, not the token, because a thread's token reads `DEAD` once
    /// its teardown has passed the guard (a buffer a thread-local holds).
    #[inline]
    fn thread_name(&self, owned: bool) -> u64 {
        if owned {
            // Relaxed: `owned` means this thread read its own token here
            // (`is_owned_here`, `Caches::local`), which only it replaces.
            self.owner.token.load(Ordering::Relaxed)
        } else {
            per_thread::current_name()
        }
    }

    /// Records the drop of `block` by the owner of this cache, which took
    /// it, in a compact record, if its values fit; returns whether it did
    /// (else [`ThreadCache::trace_drop`] records it).
    #[inline(always)]
    fn trace_own_drop(&self, ring: &Ring, block: &mut Block) -> bool {
        let thread = self.thread_name(true);
        if block.meta_mut().taker != thread {
            return false;
        }
        let flags = Self::drop_flags(block);
        let (id, device, dirty) = (block.as_ptr() as u64, block.device(), block.dirty() as u64);
        match compact_drop(flags, device, id, dirty) {
            Some(words) => {
                ring.push_compact(thread, words);
                true
            }
            None => false,
        }
    }

    /// A drop record's copy and pinned flags.
    #[inline]
    fn drop_flags(block: &mut Block) -> u8 {
        let flag = |on: bool, bit: u8| if on { bit } else { 0 };
        flag(!block.fences_mut().is_empty(), DROP_COPY) | flag(block.is_pinned(), DROP_PINNED)
    }

    /// Records the drop of `block`, taken through this cache (`owned`:
    /// the dropping thread owns it), in the dropping thread's ring, in a
    /// full record.
    #[cold]
    fn trace_drop(&self, block: &mut Block, owned: bool) {
        let caches = self.caches();
        let (ring_cache, _) = if owned { (self, true) } else { caches.local() };
        let Some(ring) = ring_cache.ring() else {
            return;
        };
        // Named at the take (not this cache's owner now, who may have
        // inherited the cache since).
        let taker = block.meta_mut().taker;
        let thread = self.thread_name(owned);
        let flags = Self::drop_flags(block) | if taker != thread { DROP_REMOTE } else { 0 };
        ring.push(
            trace_head(DROP, flags, block.device() as u16),
            thread,
            block.as_ptr() as u64,
            block.dirty() as u64,
            taker,
        );
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
            caches.intake.late(block);
            return;
        }
        let ticket = self.books.open(false);
        self.shared.drops[block.slot()].add(1);
        if keep {
            // The ticket waits beside the buffer, not in its metadata: this
            // thread only reads the metadata's second pair of lines, which
            // nothing writes on a trip without copies, and leaves the first
            // where the owner last wrote it.
            shared.returns.push(RemoteDrop { block, ticket });
        } else {
            block.set_ticket(ticket);
            caches
                .intake
                .submit(self.origin(caches.cap(), false), block);
        }
        // Release: the close's Acquire read of `busy` sees the push.
        shared.busy.fetch_sub(1, Ordering::Release);
    }

    /// Opens the flush ticket of a buffer pinned ahead of demand (by
    /// `reserve` or provisioning), which enters the cleaner as if dropped
    /// through this cache (the orphan cache) by a thread that does not own
    /// it, so that `flush` waits for it; counted in `ahead`.
    pub(crate) fn open_ahead(&self, block: &mut Block) {
        // Read when the pool closes, after the handle's release (reserve)
        // or the workers' join (provisioning), as the drop counts.
        self.shared.ahead.add(1);
        block.set_ticket(self.books.open(false));
    }

    /// The orphan cache (no owner), home of buffers pinned ahead of demand.
    pub(crate) fn orphan(&self) -> &ThreadCache {
        &self.caches().orphan
    }

    /// Whether a dropped buffer may wait for the next taker instead of the
    /// cleaner: little to re-zero (`small_dirty`), within the cap, needing
    /// no registration and no device synchronize. Reads only the
    /// metadata's second pair of lines.
    #[inline]
    fn deferrable(&self, block: &mut Block, small_dirty: bool) -> bool {
        let needs_registration = self.caches().pins && !block.is_pinned();
        let needs_device_sync = block.is_pinned() && block.fences_mut().is_empty();
        // Relaxed: a setting. Racing a change of the cap, a drop may keep
        // one buffer above the new cap (the owner reuses it, or a flush
        // sends it through the cleaner, which applies the cap) or send one
        // below it to the cleaner; neither loses it.
        let fits = block.footprint() <= self.caches().cap();
        small_dirty && fits && !needs_registration && !needs_device_sync
    }

    /// Counts a take served by a buffer of a larger class.
    #[inline]
    pub(crate) fn count_borrowed(&self) {
        self.owner.borrowed.count(1, !self.is_orphan());
    }

    /// Takes served by a buffer of a larger class.
    pub(crate) fn borrowed(&self) -> u64 {
        self.owner.borrowed.get()
    }

    /// Counts a deferred buffer that the taker re-zeroed itself.
    #[inline]
    pub(crate) fn count_cleaned(&self) {
        self.owner.cleaned.count(1, !self.is_orphan());
    }

    /// Deferred buffers the takers re-zeroed themselves.
    pub(crate) fn cleaned(&self) -> u64 {
        self.owner.cleaned.get()
    }

    /// Counts a wait of `waited` for the copies of the owner's own dropped
    /// buffers: a take that waited, unless `again` (a second wait of a take
    /// already counted), and the time in any case.
    pub(crate) fn count_own_wait(&self, waited: std::time::Duration, again: bool) {
        let single = !self.is_orphan();
        if !again {
            self.owner.own_waits.count(1, single);
        }
        let nanos = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.owner.own_wait_nanos.count(nanos, single);
    }

    /// Notes that the owner's take under way was counted in `own_waits`
    /// and goes on (see [`take_counted`](Self::take_counted)). Owner-only.
    pub(crate) fn note_take_counted(&self) {
        // Relaxed: owner-only state.
        self.owner.take_counted.store(true, Ordering::Relaxed);
    }

    /// Whether the owner's take under way was counted in `own_waits`
    /// already, clearing the note (every take that notes it goes on to
    /// the slow path, which reads it at once). Owner-only: a load, and a
    /// store only when set (no read-modify-write on a slow take).
    pub(crate) fn take_counted(&self) -> bool {
        // Relaxed: owner-only state, written by this thread alone.
        let counted = self.owner.take_counted.load(Ordering::Relaxed);
        if counted {
            // Relaxed: as above.
            self.owner.take_counted.store(false, Ordering::Relaxed);
        }
        counted
    }

    /// Takes that waited for their owner's own copies, and the nanoseconds
    /// they waited.
    pub(crate) fn own_waits(&self) -> (u64, u64) {
        (self.owner.own_waits.get(), self.owner.own_wait_nanos.get())
    }

    /// Counts a take that hit, of `bytes` pooled footprint bytes (0 for a
    /// buffer the taker re-zeroed itself).
    #[inline]
    pub(crate) fn count_hit(&self, slot: usize, pooled_bytes: usize) {
        self.owner.slots[slot].hits.count(1, !self.is_orphan());
        if pooled_bytes > 0 {
            self.count_taken_bytes(pooled_bytes);
        }
    }

    /// Counts a take served by carving from a region.
    #[inline]
    pub(crate) fn count_carved(&self) {
        self.owner.carved.count(1, !self.is_orphan());
    }

    /// Takes served by carving from a region.
    pub(crate) fn carved(&self) -> u64 {
        self.owner.carved.get()
    }

    /// Counts a take that allocated.
    #[inline]
    pub(crate) fn count_miss(&self, slot: usize) {
        self.owner.slots[slot].misses.count(1, !self.is_orphan());
    }

    /// Tallies pooled bytes taken through this cache (a steal or a shard
    /// pop included).
    #[inline]
    fn count_taken_bytes(&self, bytes: usize) {
        if self.is_orphan() {
            self.shared.taken_bytes.add(bytes as u64);
        } else {
            self.owner.taken_bytes.bump(bytes as u64);
        }
    }

    /// Marks the owner as waiting, inside a take, for the copies of one of
    /// its own dropped buffers to end, until the guard returned is
    /// dropped: its cache is busy, though its owner drops nothing
    /// meanwhile, and a sweep leaves its lists alone (moving them to the
    /// cleaner would leave the owner's next takes nothing of its own, and
    /// make them miss while its copies, queued behind other streams', end).
    pub(crate) fn waiting(&self) -> Waiting<'_> {
        // Relaxed: a hint for sweeps (see `is_waiting`).
        self.owner.waiting.store(true, Ordering::Relaxed);
        Waiting(self)
    }

    /// The guard of a mark that a wait earlier in the same take left set
    /// ([`Waiting::go_on`]): the owner stays marked waiting until it is
    /// dropped. Between two waits of one take (its first on its oldest
    /// buffer, then the one for as long as the pool's copies end) the
    /// owner drops nothing, and a sweep that found it unmarked there took
    /// it for an idle owner and moved its buffers in flight along, leaving
    /// the second wait nothing to wait for.
    pub(crate) fn still_waiting(&self) -> Waiting<'_> {
        Waiting(self)
    }

    /// Whether the owner is waiting for its own copies, or going on with a
    /// take that waited for them (see [`waiting`](Self::waiting) and
    /// [`still_waiting`](Self::still_waiting)). Relaxed: a hint; a sweep
    /// that reads it stale moves a waiting owner's buffers along (as
    /// before the flag), or leaves an owner that just went idle for its
    /// next round.
    pub(crate) fn is_waiting(&self) -> bool {
        self.owner.waiting.load(Ordering::Relaxed)
    }

    /// Whether the owner's takes may wait for their own copies at `now_us`
    /// (microseconds since the pool was built): not within the time set by
    /// [`no_waits_for`](Self::no_waits_for). Owner-only.
    pub(crate) fn may_wait(&self, now_us: u64) -> bool {
        // Relaxed: owner-only state.
        now_us >= self.owner.no_waits_until.load(Ordering::Relaxed)
    }

    /// The owner's takes do not wait for their own copies until `until_us`
    /// (a wait that ended without one: its copies wait on something else,
    /// and the takes right after it would wait for the same ones in
    /// vain). Owner-only.
    pub(crate) fn no_waits_for(&self, until_us: u64) {
        // Relaxed: owner-only state.
        self.owner.no_waits_until.store(until_us, Ordering::Relaxed);
    }

    /// Gives a deferred buffer that a thief took out of this cache's lists
    /// (see `Shared::steal`), its copies still running, back to the owner,
    /// as if another thread had dropped it (its drop's flush ticket rides
    /// beside it again); the owner's next take that looks finds it among
    /// its deferred buffers. With the pool closed, to the cleaner's late
    /// path, as any drop then.
    pub(crate) fn hand_back(&self, mut block: Block) {
        let shared = &self.shared;
        // Dekker against `Caches::close`, as in `give_back_remote`.
        shared.busy.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if shared.request.load(Ordering::Relaxed) & CLOSED != 0 {
            shared.busy.fetch_sub(1, Ordering::Release);
            self.caches().intake.late(block);
            return;
        }
        let ticket = block.take_ticket().expect("a deferred block was dropped");
        shared.returns.push(RemoteDrop { block, ticket });
        // Release: the close's Acquire read of `busy` sees the push.
        shared.busy.fetch_sub(1, Ordering::Release);
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
        self.fixed.orphan
    }

    /// Buffers of `slot` taken through this cache and not yet dropped (a
    /// racing read may be off by the takes and drops under way).
    pub(crate) fn in_use(&self, slot: usize) -> u64 {
        let counts = &self.owner.slots[slot];
        (counts.hits.get() + counts.misses.get())
            .saturating_sub(counts.drops.get() + self.shared.drops[slot].get())
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
    /// [`open_ahead`](Self::open_ahead)); exact when the pool
    /// closes, as [`takes`](Self::takes).
    pub(crate) fn ahead(&self) -> u64 {
        // See `open_ahead` for why this is exact then.
        self.shared.ahead.get()
    }

    /// Hits and misses of `slot` (statistics).
    pub(crate) fn hits_misses(&self, slot: usize) -> (u64, u64) {
        let counts = &self.owner.slots[slot];
        (counts.hits.get(), counts.misses.get())
    }

    /// Ready buffers of `slot` in this cache's lists and remote list (an
    /// estimate while the cache is in use).
    pub(crate) fn ready_in(&self, slot: usize) -> u32 {
        // Relaxed: a statistic or a hint.
        self.owner.slots[slot].ready.load(Ordering::Relaxed)
            + self.shared.inbox.ready.count_in(slot)
    }

    /// Footprint bytes taken out of the pool through this cache, ever.
    pub(crate) fn taken_bytes(&self) -> u64 {
        // Folded into the cap's estimate under its lock; a stale value
        // leaves the estimate high, which is the safe direction.
        self.owner.taken_bytes.get() + self.shared.taken_bytes.get()
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
        self.shared.inbox.listed() > 0
    }

    /// A figure that changes whenever the owner drops, reuses a deferred
    /// buffer, or takes or gains a ready one (sweeps leave active caches to
    /// their owners; a drain's pull does not): drops, the owner's
    /// completions, and the ready bytes.
    /// A ready take and a refill of the same size between two sweeps cancel
    /// out; the sweep then moves a busy cache's ready buffers to the shards,
    /// where its owner's next take finds them.
    pub(crate) fn activity(&self) -> u64 {
        // Relaxed: a heuristic.
        crate::flush::drops(std::iter::once(self.counts()))
            + self.counts().0.completions()
            + self.shared.inbox.listed() as u64
    }

    /// The cache's flush counters.
    pub(crate) fn counts(&self) -> Counts<'_> {
        self.books.counts()
    }

    /// This cache as the origin of a buffer handed to the cleaner now,
    /// under `cap`, by its owner or not.
    pub(crate) fn origin(&self, cap: usize, by_owner: bool) -> Origin<'_> {
        Origin {
            home: &self.shared.inbox,
            counters: &self.caches().counters,
            cap,
            by_owner,
        }
    }

    /// What the cleaner hands this cache (its ready list is taken for
    /// eviction and `clear` under the admission lock).
    pub(crate) fn inbox(&self) -> &Inbox {
        &self.shared.inbox
    }

    /// Takes every buffer other threads dropped into this cache (for
    /// flushes, sweeps and closing), each carrying its flush ticket.
    pub(crate) fn take_returns(&self) -> impl Iterator<Item = Block> + '_ {
        self.shared.returns.take_all().map(RemoteDrop::into_block)
    }
}

// === thief side ===

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

    /// Takes every ready buffer of a locked-out cache.
    pub(crate) fn take_ready(&mut self, cache: &ThreadCache) -> Vec<Block> {
        self.take_ready_picked(cache, |_| true)
    }

    /// Takes the ready buffers of a locked-out cache that `pick` picks,
    /// leaving the rest where they are: `pick` sees each buffer before it
    /// leaves (before its slot's ready count drops).
    pub(crate) fn take_ready_picked(
        &mut self,
        cache: &ThreadCache,
        mut pick: impl FnMut(&Block) -> bool,
    ) -> Vec<Block> {
        let mut out = Vec::new();
        for (_, slot) in self.slots() {
            for block in slot.ready.extract_if(.., |block| pick(block)) {
                cache.unready(block.slot(), &block);
                out.push(block);
            }
        }
        out
    }

    /// Puts a ready buffer back into a locked-out cache's lists.
    pub(crate) fn put_ready(&mut self, cache: &ThreadCache, block: Block) {
        let slot = block.slot();
        cache.enready(slot, &block);
        self.slot(cache.caches().slots, slot).push_ready(block);
    }

    /// Moves every buffer other threads dropped into a locked-out cache to
    /// its deferred lists (as its owner's collection would), so that a
    /// thief can reach them there.
    pub(crate) fn collect_returns(&mut self, cache: &ThreadCache) {
        cache.defer_returns(self, cache.shared.returns.take_all());
    }

    /// Takes every deferred buffer of a locked-out cache.
    pub(crate) fn take_deferred(&mut self, cache: &ThreadCache) -> Vec<Block> {
        self.take_deferred_picked(cache, |_| true)
    }

    /// Takes from a locked-out cache the deferred buffers that `pick`
    /// picks; the rest keep their order.
    pub(crate) fn take_deferred_picked(
        &mut self,
        cache: &ThreadCache,
        mut pick: impl FnMut(&Block) -> bool,
    ) -> Vec<Block> {
        let mut taken = Vec::with_capacity(self.deferred);
        for (_, slot) in self.slots() {
            for _ in 0..slot.deferred.len() {
                let block = slot.deferred.pop_front().expect("counted in its length");
                if pick(&block) {
                    taken.push(block);
                } else {
                    slot.deferred.push_back(block);
                }
            }
        }
        self.deferred -= taken.len();
        cache.owner.deferred.store(self.deferred, Ordering::Relaxed);
        taken
    }

    /// Takes the oldest deferred buffer of (`device`, `class`). (Its fences
    /// are polled by the thief once the owner is let go: a poll may be a
    /// driver call, which must not hold the owner's drops up.)
    pub(crate) fn steal_deferred(
        &mut self,
        cache: &ThreadCache,
        device: usize,
        class: SizeClass,
    ) -> Option<Block> {
        let list = &mut self
            .slot(
                cache.caches().slots,
                cache.caches().classes.slot(device, class),
            )
            .deferred;
        let block = list.pop_front()?;
        self.deferred -= 1;
        cache.owner.deferred.store(self.deferred, Ordering::Relaxed);
        Some(block)
    }
}
