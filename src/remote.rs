//! A thread cache's remote lists: where other threads (and the cleaner)
//! hand buffers to the cache's owner, the [`Inbox`] of the lists the
//! cleaner fills, and the [`Returns`] of buffers other threads drop.
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
use crate::sync::{AtomicPtr, AtomicU32, AtomicUsize, Ordering, UnsafeCell};
use crate::tune::{Tune, Tuning};

/// Pushes `node` onto the stack whose top is `head` (nodes linked by
/// `link(node, next)`), with a Release CAS; returns the top it replaced.
/// Takers swap the whole stack out with Acquire.
///
/// # Safety
///
/// `node` is valid, and the caller holds it alone until the push (`link`
/// writes it before it is shared).
unsafe fn push_linked<N>(
    head: &AtomicPtr<N>,
    node: *mut N,
    link: impl Fn(*mut N, *mut N),
) -> *mut N {
    // Relaxed: only the expected value of the CAS, which re-checks it.
    let mut top = head.load(Ordering::Relaxed);
    loop {
        link(node, top);
        // Release publishes what the caller wrote to `node` (and its
        // link) to the taker's Acquire swap.
        match head.compare_exchange_weak(top, node, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return top,
            Err(actual) => top = actual,
        }
    }
}

/// Puts `batch`, which the caller holds alone, into `slot` if it is empty;
/// returns whether it did. Release publishes what the caller wrote to the
/// batch (its values, or its clearing) to the next holder's Acquire swap
/// of the slot.
fn put_if_empty<T>(slot: &AtomicPtr<T>, batch: *mut T) -> bool {
    slot.compare_exchange(
        std::ptr::null_mut(),
        batch,
        Ordering::Release,
        Ordering::Relaxed,
    )
    .is_ok()
}

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
        // SAFETY: `node` came from `into_raw` and is not yet shared. The
        // push's Release publishes the block's metadata (and `next`) to the
        // swap in `take_all`, whose Acquire pairs with it.
        let head = unsafe { push_linked(&self.head, node, |node, next| (*node).next = next) };
        head.is_null()
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

/// Values other threads hand one owner, in batches: what a thread that
/// did not take a buffer writes when it drops it (the buffer and its flush
/// ticket), so that a run of such drops shares its cache lines between
/// threads once per batch, not once per buffer.
///
/// A [`push`](Self::push) appends to the *open* batch, which the pusher
/// holds alone while it appends: it swaps the batch out of `open` and puts
/// it back (or, once full, pushes it onto `full`, a stack the owner takes
/// whole with one swap, as a [`RemoteList`]). Nothing is written to the
/// values' own memory (a buffer's metadata stays in its taker's cache),
/// and the owner reads a batch's values from consecutive lines instead of
/// following a link per buffer. A batch is never out of every taker's
/// sight for longer than one push: [`take_open`](Self::take_open) takes
/// the open batch, and a batch a pusher holds is back in `open` or on
/// `full` when its push returns. One emptied batch is kept in `spare` for
/// the next pusher that needs one.
#[derive(Debug)]
pub(crate) struct Returns<T> {
    /// Batches to take, newest first (full ones, and open ones a racing
    /// pusher could not put back).
    full: CachePadded<AtomicPtr<Batch<T>>>,
    /// The batch pushers append to; null while none is open or while a
    /// pusher holds it.
    open: CachePadded<AtomicPtr<Batch<T>>>,
    /// An emptied batch for the next pusher that finds none open.
    spare: AtomicPtr<Batch<T>>,
    /// Called on each value a take takes, before the taker reads any of
    /// them: a hint (the cache asks the CPU to fetch each buffer's
    /// metadata, so that the misses on them overlap instead of following
    /// one another).
    hint: fn(&T),
}

/// One batch of [`Returns`], on cache lines of its own: a batch a taker
/// empties must not share a line with one a pusher fills (two batches in
/// one line, or a batch's values spilling into the next's, move that line
/// between the two threads at every value).
#[derive(Debug)]
#[repr(align(128))]
struct Batch<T> {
    /// The next batch on `full`.
    next: *mut Batch<T>,
    /// Written only by whoever holds the batch alone (a pusher after its
    /// swap, a taker after its swap).
    values: UnsafeCell<Values<T>>,
}

/// A batch's values: the first `len` of `values` are `Some`.
#[derive(Debug)]
struct Values<T> {
    len: usize,
    values: [Option<T>; Tune::RETURNS_BATCH],
}

impl<T> Values<T> {
    /// Appends `value` (the caller checks there is room); returns the
    /// values held now.
    fn push(&mut self, value: T) -> usize {
        self.values[self.len] = Some(value);
        self.len += 1;
        self.len
    }

    /// Takes the newest value.
    fn pop(&mut self) -> Option<T> {
        self.len = self.len.checked_sub(1)?;
        self.values[self.len].take()
    }
}

// SAFETY: the batches' values are touched only by the one thread that holds
// each batch (see `Returns`), and sent between threads with it.
unsafe impl<T: Send> Send for Returns<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Returns<T> {}

impl<T> Returns<T> {
    /// No values; batches of [`RETURNS_BATCH`] values. `hint` is called on
    /// each value a take takes, before the taker reads any of them.
    ///
    /// [`RETURNS_BATCH`]: crate::tune::Tuning::RETURNS_BATCH
    pub(crate) fn new(hint: fn(&T)) -> Self {
        Self {
            full: CachePadded::new(AtomicPtr::new(std::ptr::null_mut())),
            open: CachePadded::new(AtomicPtr::new(std::ptr::null_mut())),
            spare: AtomicPtr::new(std::ptr::null_mut()),
            hint,
        }
    }

    /// Calls `hint` on every value of the batches linked from `batch`,
    /// which the caller holds alone.
    fn hint_all(&self, mut batch: *mut Batch<T>) {
        while !batch.is_null() {
            // SAFETY: the caller's swap made it the only holder of the
            // chain.
            unsafe {
                (*batch).values.with_mut(|values| {
                    let values = &*values;
                    for value in values.values[..values.len].iter().flatten() {
                        (self.hint)(value);
                    }
                });
                batch = (*batch).next;
            }
        }
    }

    /// Whether a batch is waiting on `full`. Relaxed: a stale answer
    /// either way only moves a collection to the next take.
    #[inline]
    pub(crate) fn has_full(&self) -> bool {
        !self.full.load(Ordering::Relaxed).is_null()
    }

    /// Whether a batch is open. Relaxed, as `has_full`; a batch a pusher
    /// holds reads as none.
    #[inline]
    pub(crate) fn has_open(&self) -> bool {
        !self.open.load(Ordering::Relaxed).is_null()
    }

    /// Whether anything looks waiting (as `has_full` and `has_open`).
    pub(crate) fn is_empty(&self) -> bool {
        !self.has_full() && !self.has_open()
    }

    /// Appends `value` to the open batch.
    pub(crate) fn push(&self, value: T) {
        // Acquire pairs with the Release that put the batch in `open` (the
        // last pusher's), so its values are this thread's to extend.
        let mut batch = self.open.swap(std::ptr::null_mut(), Ordering::Acquire);
        if batch.is_null() {
            // Acquire pairs with the Release in `recycle`: the taker's
            // clearing of the batch happens before this push.
            batch = self.spare.swap(std::ptr::null_mut(), Ordering::Acquire);
        }
        if batch.is_null() {
            batch = Box::into_raw(Box::new(Batch {
                next: std::ptr::null_mut(),
                values: UnsafeCell::new(Values {
                    len: 0,
                    values: std::array::from_fn(|_| None),
                }),
            }));
        }
        // SAFETY: the swap (or the allocation) made this thread the batch's
        // only holder: it is in neither `open` nor `spare` nor `full`. A
        // batch held is never full: one that fills leaves `open` below.
        let len = unsafe { (*batch).values.with_mut(|values| (*values).push(value)) };
        // Failing to reopen it, another pusher opened a batch meanwhile:
        // this one goes to the takers as it is.
        if len >= Tune::RETURNS_BATCH || !put_if_empty(&self.open, batch) {
            self.push_full(batch);
        }
    }

    /// Pushes a batch this thread holds onto `full`.
    fn push_full(&self, batch: *mut Batch<T>) {
        // SAFETY: the caller holds the batch alone until the push, whose
        // Release publishes it (values and link) to the Acquire swap in
        // `take_full`.
        unsafe { push_linked(&self.full, batch, |batch, next| (*batch).next = next) };
    }

    /// Takes the batches on `full`: every value pushed before the last
    /// batch that filled, and open batches put there by racing pushers.
    pub(crate) fn take_full(&self) -> Drained<'_, T> {
        self.take(false)
    }

    /// Takes the open batch, if one is open (a batch a pusher holds now
    /// reaches `open` or `full` when its push returns).
    pub(crate) fn take_open(&self) -> Drained<'_, T> {
        self.take(true)
    }

    /// Takes what `open` (if `open`) or `full` holds, and hints every
    /// value taken.
    fn take(&self, open: bool) -> Drained<'_, T> {
        let (slot, any) = if open {
            (&*self.open, self.has_open())
        } else {
            (&*self.full, self.has_full())
        };
        let mut batch = std::ptr::null_mut();
        if any {
            // Acquire pairs with the Release CAS that put each batch taken
            // there (`put_if_empty`, `push_linked`).
            batch = slot.swap(std::ptr::null_mut(), Ordering::Acquire);
            if open && !batch.is_null() {
                // SAFETY: the swap made this thread its only holder. An
                // open batch's link is stale (from its last time on
                // `full`): it is taken alone.
                unsafe { (*batch).next = std::ptr::null_mut() };
            }
            self.hint_all(batch);
        }
        Drained {
            returns: self,
            batch,
            next_open: false,
        }
    }

    /// Takes every batch: `full`, then the open one.
    pub(crate) fn take_all(&self) -> Drained<'_, T> {
        let mut drained = self.take_full();
        drained.next_open = true;
        drained
    }

    /// Keeps an emptied batch for the next pusher, or frees it.
    fn recycle(&self, batch: *mut Batch<T>) {
        if !put_if_empty(&self.spare, batch) {
            // SAFETY: the caller held the batch alone and no longer uses
            // it; it came from `Box::into_raw`.
            drop(unsafe { Box::from_raw(batch) });
        }
    }
}

impl<T> Drop for Returns<T> {
    fn drop(&mut self) {
        // Batches are drained before a pool goes away; values left here are
        // dropped with them.
        drop(self.take_all());
        // Relaxed: `&mut self`, nothing races.
        let spare = self.spare.swap(std::ptr::null_mut(), Ordering::Relaxed);
        if !spare.is_null() {
            // SAFETY: a batch in `spare` is held by nobody else and came
            // from `Box::into_raw`.
            drop(unsafe { Box::from_raw(spare) });
        }
    }
}

/// The values of the batches a [`Returns`] take took, as an iterator
/// (each batch's newest first); emptied batches go back to the spare slot
/// or are freed.
#[derive(Debug)]
pub(crate) struct Drained<'a, T> {
    returns: &'a Returns<T>,
    /// The batch being emptied, then the ones linked from it.
    batch: *mut Batch<T>,
    /// Whether to take the open batch once these run out.
    next_open: bool,
}

impl<T> Iterator for Drained<'_, T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        loop {
            if self.batch.is_null() {
                if !std::mem::take(&mut self.next_open) {
                    return None;
                }
                self.batch = self.returns.take_open().take_batch();
                continue;
            }
            let batch = self.batch;
            // SAFETY: the take's swap made this value the batch's only
            // holder (and of every batch linked from it).
            let value = unsafe { (*batch).values.with_mut(|values| (*values).pop()) };
            if value.is_some() {
                return value;
            }
            // SAFETY: as above; the batch is empty and leaves the chain.
            self.batch = unsafe { (*batch).next };
            self.returns.recycle(batch);
        }
    }
}

impl<T> Drained<'_, T> {
    /// The batch this value holds (and its chain), leaving it empty.
    fn take_batch(mut self) -> *mut Batch<T> {
        std::mem::replace(&mut self.batch, std::ptr::null_mut())
    }
}

impl<T> Drop for Drained<'_, T> {
    fn drop(&mut self) {
        for value in self.by_ref() {
            drop(value);
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

    /// Batches fill, are taken, and come back through the spare slot as
    /// open batches: every value comes out once, whichever take takes it,
    /// and is hinted once.
    /// (An open batch keeps the link it had on `full`: taking it without
    /// cutting that link walked into a batch already taken and freed.)
    #[test]
    fn returns_hand_out_each_value_once_through_reused_batches() {
        let batch = Tune::RETURNS_BATCH as u64;
        static HINTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let returns = Returns::new(|_: &u64| {
            HINTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
        let mut taken = Vec::new();
        let mut next = 0;
        for round in 0..4 {
            // Two full batches (linked on `full`) and one open.
            for _ in 0..2 * batch + 1 {
                returns.push(next);
                next += 1;
            }
            assert!(returns.has_full() && returns.has_open());
            taken.extend(returns.take_full());
            assert_eq!(taken.len() as u64, next - 1, "round {round}");
            // The open batch came from the spare slot after the first round.
            taken.extend(returns.take_open());
            assert!(returns.is_empty());
        }
        taken.sort_unstable();
        assert_eq!(taken, (0..next).collect::<Vec<_>>());
        // Each value taken was hinted once, before any was handed out.
        assert_eq!(HINTED.load(std::sync::atomic::Ordering::Relaxed), next);
        // Left in the list when it goes: dropped with it.
        returns.push(next);
        drop(returns);
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
