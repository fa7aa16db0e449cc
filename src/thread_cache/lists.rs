//! A thread cache's lists: per slot (device and size class), a LIFO of
//! ready buffers and a FIFO of deferred ones, linked through the blocks'
//! metadata. Only the cache's owner inside an operation, or a thief that
//! has locked the owner out, touches them (see the parent module); the
//! counts that go with them are kept by the cache.

use crate::alloc::{Block, Meta};

/// Ready and deferred buffers of one slot.
#[derive(Debug, Default)]
pub(super) struct Slot {
    pub(super) ready: Vec<Block>,
    pub(super) deferred: Deferred,
}

/// A slot's deferred buffers, oldest first: a FIFO linked through the
/// blocks' metadata (`Meta::next`, which only the remote lists use
/// otherwise, and a block in a cache's lists is on none), so that deferring
/// and reusing a buffer write nothing but the slot and the block's own
/// metadata.
#[derive(Debug)]
pub(super) struct Deferred {
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
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Adds `block` as the newest.
    #[inline]
    pub(super) fn push_back(&mut self, block: Block) {
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
    pub(super) fn push_front(&mut self, block: Block) {
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
    pub(super) fn pop_front(&mut self) -> Option<Block> {
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
    pub(super) fn drain(&mut self) -> impl Iterator<Item = Block> + '_ {
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
    pub(super) fn push_ready(&mut self, block: Block) {
        if self.ready.capacity() == 0 {
            self.ready.reserve(SLOT_ROOM);
        }
        self.ready.push(block);
    }

    #[inline]
    pub(super) fn defer(&mut self, block: Block) {
        self.deferred.push_back(block);
    }
}

/// A cache's lists: only its owner inside an operation, or a thief that has
/// locked the owner out, touches them.
#[derive(Debug, Default)]
pub(crate) struct Lists {
    /// Per slot (device and class); allocated for all devices on first use.
    slots: Vec<Slot>,
    pub(super) deferred: usize,
}

impl Lists {
    #[inline]
    pub(super) fn slot(&mut self, slots: usize, slot: usize) -> &mut Slot {
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
    pub(super) fn slots(&mut self) -> impl Iterator<Item = (usize, &mut Slot)> {
        self.slots.iter_mut().enumerate()
    }
}
