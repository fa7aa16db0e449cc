//! A lock-free LIFO of values, ABA-safe, with no links in the values.
//!
//! This is Treiber's stack (R. K. Treiber, *Systems Programming: Coping with
//! Parallelism*, IBM RJ 5118, 1986) over indices into a side table of entries,
//! with a generation tag beside the index in the head word, the classic cure
//! for ABA (as in IBM's System/370 free-list with a "counter" word).
//!
//! Each entry holds one value and one `next` index. Two stacks thread through
//! the same entries: `ready` (entries holding a value) and `free` (empty entries).
//! A push takes a free entry (or a never-used one), writes the value, and
//! pushes the entry on `ready`; a pop takes an entry off `ready`, moves the
//! value out and pushes the entry on `free`. The value itself, a buffer that a
//! DMA may still be reading or that must come back all-zero, is never
//! written to for bookkeeping.
//!
//! Entries live in pages of doubling size, installed on first use by CAS and
//! freed only when the stack is dropped, so a popper may read the `next` of
//! an entry that another thread has just taken without touching freed memory.
//! The read is then stale, but the head's tag has moved on and the CAS
//! fails. A tag wraps after 2^32 operations on one head between a popper's
//! load and its CAS, which no real schedule reaches.

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering, UnsafeCell};
use crate::tune::{Tune, Tuning};

/// The index meaning "no entry".
const NIL: u32 = u32::MAX;

/// Entries in page 0 (`1 << FIRST_PAGE_SHIFT`); page `p` has `FIRST << p`.
const FIRST_PAGE_SHIFT: u32 = Tune::STACK_FIRST_PAGE_SHIFT;

/// Enough pages for every index below `NIL - 1` (up to 2^32 - 2 + FIRST,
/// whose highest bit is bit 32).
const PAGES: usize = 33 - FIRST_PAGE_SHIFT as usize;

struct Entry<T> {
    /// The next entry down the stack this entry is on (`NIL` at the bottom).
    next: AtomicU32,
    /// The value; only the thread that popped this entry off a stack (or
    /// freshly claimed it) touches it, until it pushes the entry again.
    value: UnsafeCell<Option<T>>,
}

/// A lock-free stack of `T`.
pub(crate) struct Stack<T> {
    ready: CachePadded<AtomicU64>,
    free: CachePadded<AtomicU64>,
    /// Values on the stack; raised before a push is visible and lowered after
    /// a pop, so it never under-counts.
    len: AtomicUsize,
    /// Entries ever claimed; the next never-used entry index.
    claimed: AtomicU32,
    pages: [AtomicPtr<Entry<T>>; PAGES],
}

// SAFETY: values move between threads through the stack, so `T: Send` is
// required and sufficient; the entries' cells are accessed by one owner at a
// time (see `Entry::value`).
unsafe impl<T: Send> Send for Stack<T> {}
// SAFETY: as above; `&Stack` only moves whole values in and out.
unsafe impl<T: Send> Sync for Stack<T> {}

// === impl Stack ===

impl<T> Stack<T> {
    pub(crate) fn new() -> Self {
        Self {
            ready: CachePadded::new(AtomicU64::new(pack(0, NIL))),
            free: CachePadded::new(AtomicU64::new(pack(0, NIL))),
            len: AtomicUsize::new(0),
            claimed: AtomicU32::new(0),
            pages: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
        }
    }

    /// Values on the stack: raised before a push is visible and lowered
    /// after a pop, so a racing read over-counts, never under-counts.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        // Relaxed: a statistic and a hint (eviction skips empty classes; a
        // stale non-zero only costs a failed pop).
        self.len.load(Ordering::Relaxed)
    }

    /// Pushes `value`; hands it back if the entry table is exhausted.
    pub(crate) fn push(&self, value: T) -> Result<(), T> {
        let Some(index) = self.pop_index(&self.free).or_else(|| self.claim()) else {
            return Err(value);
        };
        let entry = self.entry(index);
        // SAFETY: the entry was just taken off `free` or freshly claimed, so
        // this thread owns it until `push_index` below publishes it.
        entry.value.with_mut(|v| unsafe { *v = Some(value) });
        // Relaxed: only has to be counted before the value is visible, which
        // the Release CAS in `push_index` orders.
        self.len.fetch_add(1, Ordering::Relaxed);
        self.push_index(&self.ready, index);
        Ok(())
    }

    /// Pops the most recently pushed value.
    #[inline]
    pub(crate) fn pop(&self) -> Option<T> {
        let index = self.pop_index(&self.ready)?;
        let entry = self.entry(index);
        // SAFETY: the entry was just taken off `ready`, so this thread owns it
        // until it is pushed on `free` below; the pusher's write is visible
        // through the Acquire in `pop_index`.
        let value = entry.value.with_mut(|v| unsafe { (*v).take() });
        self.len.fetch_sub(1, Ordering::Relaxed);
        self.push_index(&self.free, index);
        value
    }

    /// Pushes entry `index`, which the caller owns, onto `head`.
    fn push_index(&self, head: &AtomicU64, index: u32) {
        let entry = self.entry(index);
        // Relaxed: the value read is only used as the expected value of the
        // CAS, which re-checks it.
        let mut current = head.load(Ordering::Relaxed);
        loop {
            // Relaxed: published by the Release CAS below.
            entry.next.store(index_of(current), Ordering::Relaxed);
            let new = pack(tag_of(current).wrapping_add(1), index);
            // Release publishes the entry's `next` and value to the thread
            // whose Acquire load in `pop_index` reads this head.
            match head.compare_exchange_weak(current, new, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }

    /// Pops an entry off `head`, transferring its ownership to the caller.
    fn pop_index(&self, head: &AtomicU64) -> Option<u32> {
        // Acquire pairs with the Release CAS of the push that installed this
        // head, so the entry's `next` and value are visible.
        let mut current = head.load(Ordering::Acquire);
        loop {
            let index = index_of(current);
            if index == NIL {
                return None;
            }
            // Relaxed: ordered by the Acquire load of `current`. If another
            // thread popped and re-pushed this entry meanwhile, `next` may be
            // stale, but the tag in the head has changed and the CAS fails.
            let next = self.entry(index).next.load(Ordering::Relaxed);
            let new = pack(tag_of(current).wrapping_add(1), next);
            // Acquire on both outcomes: on failure, the reloaded head is
            // dereferenced on the next iteration.
            match head.compare_exchange_weak(current, new, Ordering::Acquire, Ordering::Acquire) {
                Ok(_) => return Some(index),
                Err(actual) => current = actual,
            }
        }
    }

    /// Claims a never-used entry, installing its page if needed.
    #[cold]
    fn claim(&self) -> Option<u32> {
        // Relaxed: the counter only hands out distinct indices; the page
        // itself is published by the CAS in `page`.
        let index = self.claimed.fetch_add(1, Ordering::Relaxed);
        if index >= NIL - 1 {
            self.claimed.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        let (page, _) = locate(index);
        self.page(page);
        Some(index)
    }

    /// Page `page`, allocated and installed if it is not yet.
    fn page(&self, page: usize) -> *mut Entry<T> {
        // Acquire pairs with the Release of the CAS that installed the page.
        let existing = self.pages[page].load(Ordering::Acquire);
        if !existing.is_null() {
            return existing;
        }
        let len = 1usize << (FIRST_PAGE_SHIFT as usize + page);
        let fresh: Box<[Entry<T>]> = (0..len)
            .map(|_| Entry {
                next: AtomicU32::new(NIL),
                value: UnsafeCell::new(None),
            })
            .collect();
        let fresh = Box::into_raw(fresh).cast::<Entry<T>>();
        // Release publishes the initialised entries; Acquire on failure pairs
        // with the winner's Release.
        match self.pages[page].compare_exchange(
            std::ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => fresh,
            Err(winner) => {
                // SAFETY: `fresh` came from `Box::into_raw` of a slice of
                // `len` entries above and was never shared.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(fresh, len)) });
                winner
            }
        }
    }

    fn entry(&self, index: u32) -> &Entry<T> {
        let (page, offset) = locate(index);
        // Acquire pairs with the installing CAS in `page`. Every index handed
        // out was claimed after its page was installed.
        let base = self.pages[page].load(Ordering::Acquire);
        debug_assert!(!base.is_null());
        // SAFETY: `index` was claimed, so its page is installed, `offset` is
        // below the page's length, and pages live as long as `self`.
        unsafe { &*base.add(offset) }
    }
}

impl<T> Drop for Stack<T> {
    fn drop(&mut self) {
        for (page, ptr) in self.pages.iter().enumerate() {
            let ptr = ptr.load(Ordering::Relaxed);
            if ptr.is_null() {
                continue;
            }
            let len = 1usize << (FIRST_PAGE_SHIFT as usize + page);
            // SAFETY: installed pages come from `Box::into_raw` of `len`
            // entries, and `&mut self` means no one else references them.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) });
        }
    }
}

impl<T> std::fmt::Debug for Stack<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack").field("len", &self.len()).finish()
    }
}

/// Page and offset of entry `index`: page `p` holds indices
/// `[FIRST << p - FIRST, FIRST << (p + 1) - FIRST)`.
#[inline]
fn locate(index: u32) -> (usize, usize) {
    let biased = u64::from(index) + (1 << FIRST_PAGE_SHIFT);
    let page = (63 - biased.leading_zeros() - FIRST_PAGE_SHIFT) as usize;
    let offset = (biased - (1u64 << (FIRST_PAGE_SHIFT as usize + page))) as usize;
    (page, offset)
}

#[inline]
fn pack(tag: u32, index: u32) -> u64 {
    (u64::from(tag) << 32) | u64::from(index)
}

#[inline]
fn index_of(word: u64) -> u32 {
    word as u32
}

#[inline]
fn tag_of(word: u64) -> u32 {
    (word >> 32) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_covers_indices_without_gaps() {
        let mut expected = (0, 0);
        for index in 0..10_000u32 {
            let (page, offset) = locate(index);
            assert_eq!((page, offset), expected, "index {index}");
            expected.1 += 1;
            if expected.1 == 1 << (FIRST_PAGE_SHIFT as usize + page) {
                expected = (page + 1, 0);
            }
        }
        assert!(locate(NIL - 2).0 < PAGES);
    }

    #[test]
    fn lifo_and_reuses_entries() {
        let stack = Stack::new();
        for round in 0..3 {
            for i in 0..100 {
                stack.push(i).unwrap();
            }
            assert_eq!(stack.len(), 100);
            for i in (0..100).rev() {
                assert_eq!(stack.pop(), Some(i), "round {round}");
            }
            assert_eq!(stack.pop(), None);
        }
        assert_eq!(stack.claimed.load(Ordering::Relaxed), 100);
    }

    #[test]
    fn concurrent_push_pop_loses_nothing() {
        let stack = std::sync::Arc::new(Stack::new());
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let stack = stack.clone();
                std::thread::spawn(move || {
                    let mut popped = Vec::new();
                    for i in 0..10_000 {
                        stack.push(t * 1_000_000 + i).unwrap();
                        if i % 2 == 0 {
                            popped.extend(stack.pop());
                        }
                    }
                    popped
                })
            })
            .collect();
        let mut all: Vec<u64> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        while let Some(v) = stack.pop() {
            all.push(v);
        }
        all.sort_unstable();
        let before = all.len();
        all.dedup();
        assert_eq!(before, all.len(), "a value was popped twice");
        assert_eq!(all.len(), 40_000, "a value was lost");
    }
}
