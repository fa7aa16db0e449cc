//! The per-thread cache in front of the shards.
//!
//! Each thread that takes buffers gets one `ThreadCache`. The cleaner
//! returns a recycled buffer to the cache of the thread that took it (as
//! mimalloc returns a remote free to the owning page), so a thread's
//! take/drop loop keeps drawing from its own small LIFO without touching
//! shared state.
//!
//! The cache is guarded by a mutex that is uncontended on the fast path: its
//! owner takes from it, the cleaner delivers into it, and other threads reach
//! it only on slow paths: a miss (stealing from idle or exited threads),
//! cap eviction, `clear` and `shutdown`. Caches are never dropped before the
//! pool (the `thread_local` crate keeps exited threads' entries), so buffers
//! cached by an exited thread stay reachable.
//!
//! State touched only by the owner (hit and miss counters) is kept apart
//! from state any thread touches (the lists, the in-flight counters).

use crossbeam_utils::CachePadded;

use crate::alloc::Block;
use crate::cleaner::Inbox;
use crate::size_class::CLASSES;
use crate::sync::{Arc, AtomicU64, AtomicUsize, Mutex, Ordering};

/// At most this many buffers of one class and device sit in one cache.
const PER_CLASS: usize = 32;

/// One thread's cache of ready buffers.
#[derive(Debug)]
pub(crate) struct ThreadCache {
    /// Ready buffers, indexed by `device * CLASSES + shift`.
    lists: CachePadded<Mutex<Vec<Vec<Block>>>>,
    /// Footprint bytes in `lists`; written under the lock, read without it.
    bytes: AtomicUsize,
    /// Takes served without allocating, counted by the owner alone.
    hits: CachePadded<AtomicU64>,
    /// Takes that had to allocate, counted by the owner alone.
    misses: AtomicU64,
    /// Buffers taken through this cache that are in the cleaner, split by
    /// flush epoch parity (see `cleaner::flush`).
    pub(crate) inflight: CachePadded<[AtomicUsize; 2]>,
    /// Where this cache's buffers go when dropped.
    pub(crate) inbox: Arc<Inbox>,
    limit: usize,
}

// === impl ThreadCache ===

impl ThreadCache {
    pub(crate) fn new(inbox: Arc<Inbox>, devices: usize, limit: usize) -> Self {
        Self {
            lists: CachePadded::new(Mutex::new(
                (0..devices * CLASSES).map(|_| Vec::new()).collect(),
            )),
            bytes: AtomicUsize::new(0),
            hits: CachePadded::new(AtomicU64::new(0)),
            misses: AtomicU64::new(0),
            inflight: CachePadded::new([AtomicUsize::new(0), AtomicUsize::new(0)]),
            inbox,
            limit,
        }
    }

    /// Takes a ready buffer (owner's fast path).
    #[inline]
    pub(crate) fn pop(&self, device: usize, shift: u32) -> Option<Block> {
        let mut lists = self.lists.lock();
        let block = lists[device * CLASSES + shift as usize].pop()?;
        self.sub_bytes(&block);
        Some(block)
    }

    /// Takes a ready buffer if the cache is not busy (another thread's path).
    pub(crate) fn steal(&self, device: usize, shift: u32) -> Option<Block> {
        let mut lists = self.lists.try_lock()?;
        let block = lists[device * CLASSES + shift as usize].pop()?;
        self.sub_bytes(&block);
        Some(block)
    }

    /// Keeps `block` if the cache has room for it; hands it back otherwise.
    pub(crate) fn offer(&self, block: Block) -> Result<(), Block> {
        let mut lists = self.lists.lock();
        let list = &mut lists[block.device() * CLASSES + block.shift() as usize];
        if list.len() >= PER_CLASS || self.bytes() + block.footprint() > self.limit {
            return Err(block);
        }
        // Relaxed: the count is read for statistics and for admission under
        // the pool's admission lock, which orders it; see `Shared::admit`.
        self.bytes.fetch_add(block.footprint(), Ordering::Relaxed);
        list.push(block);
        Ok(())
    }

    /// Takes one buffer of class `shift`, any device (for cap eviction).
    pub(crate) fn evict(&self, shift: u32) -> Option<Block> {
        let mut lists = self.lists.lock();
        let devices = lists.len() / CLASSES;
        let block = (0..devices).find_map(|d| lists[d * CLASSES + shift as usize].pop())?;
        self.sub_bytes(&block);
        Some(block)
    }

    /// Takes every cached buffer.
    pub(crate) fn drain(&self) -> Vec<Block> {
        let mut lists = self.lists.lock();
        let blocks: Vec<Block> = lists.iter_mut().flat_map(std::mem::take).collect();
        self.bytes.store(0, Ordering::Relaxed);
        blocks
    }

    /// Footprint bytes cached.
    #[inline]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Buffers cached.
    pub(crate) fn buffers(&self) -> usize {
        self.lists.lock().iter().map(Vec::len).sum()
    }

    /// Counts a take served from the pool. Only the owner calls this, so a
    /// load and a store (no read-modify-write) suffice; Relaxed because the
    /// counter publishes nothing.
    #[inline]
    pub(crate) fn count_hit(&self) {
        self.hits
            .store(self.hits.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// Counts a take that allocated; as `count_hit`.
    #[inline]
    pub(crate) fn count_miss(&self) {
        self.misses
            .store(self.misses.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    pub(crate) fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    pub(crate) fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }

    fn sub_bytes(&self, block: &Block) {
        // Relaxed: see `offer`.
        self.bytes.fetch_sub(block.footprint(), Ordering::Relaxed);
    }
}
