//! The per-thread cache in front of the shards.
//!
//! Each thread that takes buffers gets one `ThreadCache`. It holds two
//! lists under one mutex that is uncontended on the fast path:
//!
//! - `ready`: buffers ready to take. The cleaner returns a recycled buffer to
//!   the cache of the thread that took it (as mimalloc returns a remote free
//!   to the owning heap), so a thread's take/drop loop keeps drawing from its
//!   own LIFO.
//! - `dirty`: buffers dropped and not yet cleaned: the cleaner's inbox for
//!   this cache. A drop appends here and queues a drain token unless one is
//!   already queued; the worker that takes the token drains the whole list in
//!   one batch (mimalloc batches remote frees per destination the same way).
//!   The cleaner's queue so holds at most one drain token per cache, however
//!   fast threads drop. A small buffer dropped by the cache's own thread is
//!   not worth waking a worker for: it is *deferred* (no token), the owner
//!   will likely clean it itself on its next take, and otherwise a sweep
//!   (at most one queued, run 200 us later) queues the token.
//!
//! On a miss, `take` helps the cleaner: a small dirty buffer of the right
//! class whose copies are known to have finished is re-zeroed on the spot
//! (a few microseconds at most) rather than allocating a new one. Nothing
//! is ever registered on this path.
//!
//! Other threads reach a cache only on slow paths: a miss (stealing from
//! idle or exited threads), cap eviction, `clear` and `shutdown`. Caches are
//! never dropped before the pool (the `thread_local` crate keeps exited
//! threads' entries), so buffers cached by an exited thread stay reachable.

use std::time::Instant;

use crossbeam_utils::CachePadded;

use crate::alloc::Block;
use crate::backend::Fence;
use crate::cleaner::Inbox;
use crate::size_class::CLASSES;
use crate::sync::{thread_key, Arc, AtomicU64, AtomicUsize, Mutex, Ordering};

/// At most this many buffers of one class and device sit ready in one cache.
const PER_CLASS: usize = 64;

/// `take` re-zeroes a dirty buffer itself only up to this many bytes, and
/// only such buffers are deferred.
const HELP_BYTES: usize = 64 << 10;

/// A dropped buffer waiting in its cache's dirty list.
#[derive(Debug)]
pub(crate) struct Dirty {
    pub(crate) block: Block,
    /// The prefix written since the take.
    pub(crate) dirty: usize,
    /// Events after the last copies reading the buffer.
    pub(crate) fences: Vec<Fence>,
    /// The flush-epoch parity the drop was counted in.
    pub(crate) epoch: usize,
    pub(crate) dropped_at: Instant,
}

impl Dirty {
    /// Whether the drop may leave this buffer for its owner or the next
    /// sweep: small, and not needing a device synchronize.
    pub(crate) fn deferrable(&self) -> bool {
        self.dirty <= HELP_BYTES && !(self.block.is_pinned() && self.fences.is_empty())
    }

    /// Whether `take` may clean this buffer itself: small, and known
    /// without blocking to be read by no copy.
    fn helpable(&self, device: usize, shift: u32) -> bool {
        if self.block.device() != device || self.block.shift() != shift || self.dirty > HELP_BYTES {
            return false;
        }
        if self.fences.is_empty() {
            // A pinned buffer without events needs a device synchronize.
            !self.block.is_pinned()
        } else {
            self.fences.iter().all(|f| matches!(f.is_done(), Ok(true)))
        }
    }
}

#[derive(Debug)]
struct State {
    /// Ready buffers, indexed by `device * CLASSES + shift`.
    ready: Vec<Vec<Block>>,
    dirty: Vec<Dirty>,
    /// Whether a drain token for this cache is queued and not yet served.
    token: bool,
}

/// What a drop must do after appending to the dirty list.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Push {
    /// Nothing: a drain token is already queued.
    Queued,
    /// Queue a drain token.
    Token,
    /// Nothing now: the buffer waits for its owner or the next sweep.
    Deferred,
}

/// What a cache lookup found.
#[derive(Debug)]
pub(crate) enum Found {
    /// A ready buffer.
    Ready(Block),
    /// A dirty buffer that the taker may clean itself.
    Dirty(Dirty),
}

/// One thread's cache of ready buffers and inbox of dirty ones.
#[derive(Debug)]
pub(crate) struct ThreadCache {
    state: CachePadded<Mutex<State>>,
    /// Footprint bytes in `ready`; written under the lock, read without it.
    bytes: AtomicUsize,
    /// Footprint bytes this thread has taken out of the pool and not yet
    /// subtracted from the pool's estimate (see `Shared::admit`).
    untallied: AtomicUsize,
    /// Takes served without allocating, counted by the owner alone.
    hits: CachePadded<AtomicU64>,
    /// Takes that had to allocate, by size class, counted by the owner alone.
    misses: Box<[AtomicU64]>,
    /// Dirty buffers the owner cleaned itself, and the bytes it zeroed.
    helped: AtomicU64,
    helped_bytes: AtomicU64,
    /// Buffers taken through this cache that are in the cleaner, split by
    /// flush epoch parity (see `Shared::flush`).
    pub(crate) inflight: CachePadded<[AtomicUsize; 2]>,
    /// Where this cache's buffers go when dropped.
    pub(crate) inbox: Arc<Inbox>,
    limit: usize,
    /// `sync::thread_key` of the thread taking through this cache; a hint
    /// that decides whether a drop may be deferred.
    owner: AtomicUsize,
}

// === impl ThreadCache ===

impl ThreadCache {
    pub(crate) fn new(inbox: Arc<Inbox>, devices: usize, limit: usize) -> Self {
        Self {
            state: CachePadded::new(Mutex::new(State {
                ready: (0..devices * CLASSES).map(|_| Vec::new()).collect(),
                dirty: Vec::new(),
                token: false,
            })),
            bytes: AtomicUsize::new(0),
            untallied: AtomicUsize::new(0),
            hits: CachePadded::new(AtomicU64::new(0)),
            misses: (0..CLASSES).map(|_| AtomicU64::new(0)).collect(),
            helped: AtomicU64::new(0),
            helped_bytes: AtomicU64::new(0),
            inflight: CachePadded::new([AtomicUsize::new(0), AtomicUsize::new(0)]),
            inbox,
            limit,
            owner: AtomicUsize::new(thread_key()),
        }
    }

    /// Notes the calling thread as the owner (a thread may inherit the
    /// cache of an exited thread whose identity it reuses).
    #[inline]
    pub(crate) fn claim(&self) {
        let key = thread_key();
        // Relaxed: a hint; a stale value only changes whether a drop is
        // deferred, and both choices are correct.
        if self.owner.load(Ordering::Relaxed) != key {
            self.owner.store(key, Ordering::Relaxed);
        }
    }

    /// Whether the calling thread owns this cache.
    #[inline]
    pub(crate) fn is_owner(&self) -> bool {
        self.owner.load(Ordering::Relaxed) == thread_key()
    }

    /// Takes a ready buffer, or else (if `help`) a dirty one the caller
    /// may clean (the owner's fast path).
    #[inline]
    pub(crate) fn take(&self, device: usize, shift: u32, help: bool) -> Option<Found> {
        let mut state = self.state.lock();
        if let Some(block) = state.ready[device * CLASSES + shift as usize].pop() {
            self.taken(&block);
            return Some(Found::Ready(block));
        }
        if !help {
            return None;
        }
        let index = state.dirty.iter().position(|d| d.helpable(device, shift))?;
        Some(Found::Dirty(state.dirty.swap_remove(index)))
    }

    /// Takes a ready buffer if the cache is not busy (another thread's
    /// path); the bytes are tallied to `thief`.
    pub(crate) fn steal(&self, device: usize, shift: u32, thief: &ThreadCache) -> Option<Block> {
        let mut state = self.state.try_lock()?;
        let block = state.ready[device * CLASSES + shift as usize].pop()?;
        self.sub_bytes(&block);
        thief.untally(block.footprint());
        Some(block)
    }

    /// Appends a dropped buffer to the dirty list and says whether the
    /// caller must queue a drain token (always if `urgent`).
    #[inline]
    pub(crate) fn push_dirty(&self, dirty: Dirty, urgent: bool) -> Push {
        let mut state = self.state.lock();
        state.dirty.push(dirty);
        if state.token {
            Push::Queued
        } else if urgent {
            state.token = true;
            Push::Token
        } else {
            Push::Deferred
        }
    }

    /// Takes the whole dirty list (serving the drain token).
    pub(crate) fn take_dirty(&self) -> Vec<Dirty> {
        let mut state = self.state.lock();
        state.token = false;
        std::mem::take(&mut state.dirty)
    }

    /// Whether deferred buffers wait here with no token queued; if so, the
    /// caller must queue one (this marks it queued).
    pub(crate) fn sweep(&self) -> bool {
        let mut state = self.state.lock();
        let needed = !state.token && !state.dirty.is_empty();
        state.token |= needed;
        needed
    }

    /// Keeps `block` if the cache has room for it; hands it back otherwise.
    pub(crate) fn offer(&self, block: Block) -> Result<(), Block> {
        let mut state = self.state.lock();
        let list = &mut state.ready[block.device() * CLASSES + block.shift() as usize];
        if list.len() >= PER_CLASS || self.bytes() + block.footprint() > self.limit {
            return Err(block);
        }
        // Relaxed: a statistic and a local limit; the pool's cap is kept by
        // its own estimate.
        self.bytes.fetch_add(block.footprint(), Ordering::Relaxed);
        list.push(block);
        Ok(())
    }

    /// Takes one ready buffer of class `shift`, any device (cap eviction).
    pub(crate) fn evict(&self, shift: u32) -> Option<Block> {
        let mut state = self.state.lock();
        let devices = state.ready.len() / CLASSES;
        let block = (0..devices).find_map(|d| state.ready[d * CLASSES + shift as usize].pop())?;
        self.sub_bytes(&block);
        Some(block)
    }

    /// Takes every ready buffer.
    pub(crate) fn drain(&self) -> Vec<Block> {
        let mut state = self.state.lock();
        let blocks: Vec<Block> = state.ready.iter_mut().flat_map(std::mem::take).collect();
        self.bytes.store(0, Ordering::Relaxed);
        blocks
    }

    /// Footprint bytes ready in this cache.
    #[inline]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Ready buffers in this cache, indexed by `device * CLASSES + shift`.
    pub(crate) fn buffers(&self) -> Vec<usize> {
        self.state.lock().ready.iter().map(Vec::len).collect()
    }

    /// Records that this thread took `bytes` out of the pool.
    #[inline]
    pub(crate) fn untally(&self, bytes: usize) {
        // Relaxed: a counter folded into the pool's estimate under its
        // admission lock; it publishes nothing.
        self.untallied.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Hands the untallied bytes to the caller (to subtract from the pool's
    /// estimate).
    pub(crate) fn fold_untallied(&self) -> usize {
        self.untallied.swap(0, Ordering::Relaxed)
    }

    pub(crate) fn untallied(&self) -> usize {
        self.untallied.load(Ordering::Relaxed)
    }

    /// Counts a take served from the pool. Only the owner calls this, so a
    /// load and a store (no read-modify-write) suffice; Relaxed because the
    /// counter publishes nothing.
    #[inline]
    pub(crate) fn count_hit(&self) {
        self.hits
            .store(self.hits.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// Counts a take of class `shift` that allocated; as `count_hit`.
    #[inline]
    pub(crate) fn count_miss(&self, shift: u32) {
        let counter = &self.misses[shift as usize];
        counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// Counts a dirty buffer of `bytes` dirty bytes the owner cleaned; as
    /// `count_hit`.
    #[inline]
    pub(crate) fn count_help(&self, bytes: usize) {
        self.helped
            .store(self.helped.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        let zeroed = self.helped_bytes.load(Ordering::Relaxed) + bytes as u64;
        self.helped_bytes.store(zeroed, Ordering::Relaxed);
    }

    /// Buffers and bytes the owner cleaned itself.
    pub(crate) fn helped(&self) -> (u64, u64) {
        (
            self.helped.load(Ordering::Relaxed),
            self.helped_bytes.load(Ordering::Relaxed),
        )
    }

    pub(crate) fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Misses by size class.
    pub(crate) fn misses(&self) -> impl Iterator<Item = u64> + '_ {
        self.misses.iter().map(|m| m.load(Ordering::Relaxed))
    }

    /// Accounts for `block` leaving `ready` through the owner's take.
    fn taken(&self, block: &Block) {
        self.sub_bytes(block);
        self.untally(block.footprint());
    }

    fn sub_bytes(&self, block: &Block) {
        // Relaxed: see `offer`.
        self.bytes.fetch_sub(block.footprint(), Ordering::Relaxed);
    }
}
