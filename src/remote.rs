//! A thread cache's remote lists: where other threads (and the cleaner)
//! hand buffers to the cache's owner, and the [`Inbox`] of the lists the
//! cleaner fills.
//!
//! A multi-producer stack of blocks linked through their metadata (never
//! through the buffers' bytes): a return is one CAS onto the head, and the
//! owner collects everything with one swap on its next take. There is no
//! single pop, so ABA cannot happen: a pusher's CAS only succeeds against
//! the head it linked to, and the only other write is the swap to empty.
//! This is mimalloc's thread-free list (Leijen, Zorn and de Moura, 2019)
//! and sharded-slab's remote-free stack.

use crossbeam_utils::CachePadded;

use crate::alloc::{Block, Meta};
use crate::slots::Slots;
use crate::sync::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};

/// See the module docs.
#[derive(Debug)]
pub(crate) struct RemoteList {
    head: AtomicPtr<Meta>,
    /// Footprint bytes of the blocks on the list: raised before a push and
    /// lowered by the swap that takes them (a counted list only).
    bytes: AtomicUsize,
    /// Blocks on the list per slot, counted the same way (written by
    /// pushers and the owner's swap: on lines of its own); `None` for a
    /// list whose counts nobody reads, whose pushes then write only the
    /// head: each counter a push writes is a line the taker writes too,
    /// moved between their cores at every push.
    per_slot: Option<Slots<AtomicU32>>,
}

impl RemoteList {
    /// An empty list for a pool of `slots` slots, counting its bytes and
    /// its blocks per slot.
    pub(crate) fn new(slots: usize) -> Self {
        Self {
            head: AtomicPtr::new(std::ptr::null_mut()),
            bytes: AtomicUsize::new(0),
            per_slot: Some(Slots::new(slots)),
        }
    }

    /// An empty list that counts nothing ([`bytes`](Self::bytes) and
    /// [`count_in`](Self::count_in) read 0).
    pub(crate) fn uncounted() -> Self {
        Self {
            head: AtomicPtr::new(std::ptr::null_mut()),
            bytes: AtomicUsize::new(0),
            per_slot: None,
        }
    }

    /// Blocks of `slot` on the list (a statistic or a hint).
    pub(crate) fn count_in(&self, slot: usize) -> u32 {
        // Relaxed: a statistic or a hint.
        self.per_slot
            .as_ref()
            .map_or(0, |counts| counts[slot].load(Ordering::Relaxed))
    }

    /// Whether the list looks empty. Relaxed: a stale answer either way
    /// only moves a collection to the next take.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.head.load(Ordering::Relaxed).is_null()
    }

    /// Footprint bytes of the blocks on the list (a bound on a cache's
    /// size; a racing read may be off by the blocks in transit).
    #[inline]
    pub(crate) fn bytes(&self) -> usize {
        // Relaxed: a bound on a cache's size, publishing nothing.
        self.bytes.load(Ordering::Relaxed)
    }

    /// Pushes `block`; returns whether the list was empty before.
    pub(crate) fn push(&self, block: Block) -> bool {
        if let Some(counts) = &self.per_slot {
            // Relaxed: counts; see `bytes`.
            self.bytes.fetch_add(block.footprint(), Ordering::Relaxed);
            counts[block.slot()].fetch_add(1, Ordering::Relaxed);
        }
        let node = block.into_raw();
        // Relaxed: only the expected value of the CAS, which re-checks it.
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            // SAFETY: `node` came from `into_raw` and is not yet shared.
            unsafe { (*node).next = head };
            // Release publishes the block's metadata (and `next`) to the
            // swap in `take_all`, whose Acquire pairs with it.
            match self
                .head
                .compare_exchange_weak(head, node, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return head.is_null(),
                Err(actual) => head = actual,
            }
        }
    }

    /// Takes every block on the list, newest first.
    pub(crate) fn take_all(&self) -> Taken {
        if self.is_empty() {
            return Taken {
                next: std::ptr::null_mut(),
            };
        }
        // Acquire pairs with the Release CAS of every push it takes.
        let head = self.head.swap(std::ptr::null_mut(), Ordering::Acquire);
        let taken = Taken { next: head };
        let Some(counts) = &self.per_slot else {
            return taken;
        };
        let mut bytes = 0;
        for meta in taken.peek() {
            bytes += meta.footprint_bytes();
            // Relaxed: see `bytes`.
            counts[meta.slot()].fetch_sub(1, Ordering::Relaxed);
        }
        // Relaxed: see `bytes`.
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
        taken
    }
}

/// What the cleaner hands one thread cache: the ready buffers it made for
/// the cache's owner, and the pinned buffers dropped through the cache that
/// it is to release in bulk. Cleaner jobs point here, not at the cache, so
/// that finishing a buffer reaches nothing above the lists.
#[derive(Debug)]
pub(crate) struct Inbox {
    /// Ready buffers for the owner, who collects them on its next take.
    pub(crate) ready: RemoteList,
    /// Pinned buffers dropped through the cache past the cleaner's
    /// recycling backlog, for the cleaner to release in bulk.
    pub(crate) released: RemoteList,
    /// Footprint bytes in the owner's own ready lists: written by the owner
    /// (or a thief that has locked it out), read to bound the cache.
    listed: CachePadded<AtomicUsize>,
    /// The most ready bytes the cache holds.
    limit: usize,
}

impl Inbox {
    /// An empty inbox for a pool of `slots` slots, whose cache holds at
    /// most `limit` ready bytes.
    pub(crate) fn new(slots: usize, limit: usize) -> Self {
        Self {
            ready: RemoteList::new(slots),
            released: RemoteList::uncounted(),
            listed: CachePadded::new(AtomicUsize::new(0)),
            limit,
        }
    }

    /// Whether the cache can take `bytes` more ready bytes (a racing read
    /// may over- or under-state the room by one buffer; the cap is kept by
    /// the pool's estimate, not by this).
    pub(crate) fn has_room(&self, bytes: usize) -> bool {
        self.listed() + self.ready.bytes() + bytes <= self.limit
    }

    /// Footprint bytes in the owner's ready lists.
    pub(crate) fn listed(&self) -> usize {
        // Relaxed: a soft limit and a hint.
        self.listed.load(Ordering::Relaxed)
    }

    /// Records that the owner's ready lists gained (`grew`) or lost
    /// `bytes`. Only the owner, or a thief that has locked it out, calls.
    pub(crate) fn relist(&self, bytes: usize, grew: bool) {
        // Relaxed: one writer at a time (the owner / thief handshake
        // orders them); readers take it as a hint.
        let now = self.listed.load(Ordering::Relaxed);
        let next = if grew { now + bytes } else { now - bytes };
        self.listed.store(next, Ordering::Relaxed);
    }
}

impl Drop for RemoteList {
    fn drop(&mut self) {
        // Lists are drained before a pool goes away; dropping a block here
        // unmaps it (or leaks it if still pinned).
        // Relaxed: `&mut self`, nothing races.
        let head = self.head.swap(std::ptr::null_mut(), Ordering::Relaxed);
        drop(Taken { next: head });
    }
}

/// The blocks a [`RemoteList::take_all`] took, as an iterator.
#[derive(Debug)]
pub(crate) struct Taken {
    next: *mut Meta,
}

impl Taken {
    /// The metadata of the blocks, without taking them.
    fn peek(&self) -> impl Iterator<Item = &Meta> {
        let mut next = self.next;
        std::iter::from_fn(move || {
            // SAFETY: the swap transferred the whole chain to this value;
            // each node is a live metadata box until taken by `next`.
            let meta = unsafe { next.as_ref()? };
            next = meta.next;
            Some(meta)
        })
    }
}

impl Iterator for Taken {
    type Item = Block;

    fn next(&mut self) -> Option<Block> {
        if self.next.is_null() {
            return None;
        }
        // SAFETY: as in `peek`; the node is unlinked here and owned by the
        // block returned.
        let block = unsafe { Block::from_raw(self.next) };
        // SAFETY: as above: a live node this value owns.
        self.next = unsafe { (*self.next).next };
        Some(block)
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        for block in self.by_ref() {
            drop(block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::size_class::{page_size, Classes, SizeClasses};

    fn blocks(classes: &Classes, sizes: &[usize]) -> Vec<Block> {
        sizes
            .iter()
            .map(|&size| {
                let class = classes.class_for(size).expect("a class");
                Block::allocate(classes, class, 0, None).expect("map a block")
            })
            .collect()
    }

    #[test]
    fn a_counted_list_counts_its_slots_and_an_uncounted_one_nothing() {
        let classes = Classes::new(SizeClasses::Fine, page_size());
        let sizes = [8192, 8192, 65536, 8192, 65536, 65536, 8192];
        let small = blocks(&classes, &[8192])[0].slot();
        let large = blocks(&classes, &[65536])[0].slot();
        assert_ne!(small, large);
        let slots = classes.count();

        let counted = RemoteList::new(slots);
        let mut footprint = 0;
        for block in blocks(&classes, &sizes) {
            footprint += block.footprint();
            counted.push(block);
        }
        assert_eq!((counted.count_in(small), counted.count_in(large)), (4, 3));
        assert_eq!(counted.bytes(), footprint);
        // Newest first, every block, and the counts back to zero.
        let lens: Vec<usize> = counted.take_all().map(|b| b.len()).collect();
        let mut expected: Vec<usize> = sizes.iter().rev().copied().collect();
        for (len, asked) in lens.iter().zip(&mut expected) {
            assert!(len >= asked, "{lens:?}");
            *asked = *len;
        }
        assert_eq!(lens.len(), sizes.len());
        assert_eq!((counted.count_in(small), counted.count_in(large)), (0, 0));
        assert_eq!(counted.bytes(), 0);
        assert!(counted.is_empty());

        let uncounted = RemoteList::uncounted();
        assert!(uncounted.push(blocks(&classes, &[8192]).remove(0)));
        assert!(!uncounted.push(blocks(&classes, &[65536]).remove(0)));
        assert_eq!((uncounted.count_in(small), uncounted.bytes()), (0, 0));
        assert!(!uncounted.is_empty());
        assert_eq!(uncounted.take_all().count(), 2);
        assert!(uncounted.is_empty());
    }
}
