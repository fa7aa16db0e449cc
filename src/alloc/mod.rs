//! Page-aligned host memory: the mapping behind every buffer, and the
//! metadata that travels with it.
//!
//! A [`Block`] is one anonymous `mmap` plus a boxed [`Meta`], its entry in
//! the side table: the bookkeeping of a buffer's trip through the pool
//! (dirty length, fences, flush ticket, the link of a remote list) lives in
//! the metadata, never in the buffer's bytes, which a DMA may still be
//! reading and which must come back all-zero. The mapping arrives zeroed and
//! its pages fault in lazily, so a pool miss costs a system call, not a
//! memset of the whole buffer on the caller's path. Blocks of at least one
//! transparent huge page are aligned to it and advised for huge pages,
//! which makes the first touch and the registration of large buffers
//! several times faster. Page and huge-page sizes are read from the system.
//!
//! A block never moves and never changes size, so the base pointer a
//! registration was made for stays valid for the block's life. A block that
//! is still page-locked is never unmapped: dropping one leaks its mapping
//! (and says so), and [`Block::leak`] does it on purpose for memory whose
//! copies are not known to have finished.
//!
//! Buffers shorter than a page are carved from a one-page [`Slab`] instead
//! of having a mapping each: a miss maps the slab and hands out its first
//! buffer, the *head*; the head's first trip through the cleaner registers
//! the whole slab (one call) and carves the rest of it into *siblings*,
//! ready and pinned, so a 1 KiB buffer pins 1 KiB and no buffer spans two
//! registrations. Each block holds a share of its slab; the last share
//! freed unregisters and unmaps it, so a slab goes back to the OS once all
//! of its buffers have been freed (evicted, trimmed or cleared). On a pool
//! that carves from regions, a slab is a page carved from a region instead
//! ([`Block::carved_slab`]): never registered on its own, and given back
//! to the region, all-zero, with its last buffer.
//!
//! This file holds blocks and their metadata; `mmap` the system calls
//! behind them (mappings, huge pages, zeroing and pre-faulting a range),
//! and `slab` the slabs and their shares.

mod mmap;
mod region;
mod slab;

use std::ptr::NonNull;
use std::time::Instant;

use crate::error::Error;
use crate::fence::Fences;
use crate::flush::Ticket;
use crate::size_class::{page_size, Classes, SizeClass};
use crate::sync::track::{Contents, Track};
use crate::sync::{AtomicU8, Mutex, MutexGuard};
use crate::tune::{Tune, Tuning};

pub(crate) use mmap::{clean_range, host_memory};

use mmap::{huge_page_size, map, map_huge};
pub(crate) use region::{cover, Carved, Demand, Drained, Fold, Regions, Shortfall, Unlisted};

use region::Region;
use slab::{LastShare, Slab};

/// A buffer's side-table entry. Its owner writes it on every take and drop,
/// so it gets cache lines of its own (256 bytes: two pairs of lines, as
/// adjacent lines are fetched in pairs): metadata of buffers used by
/// different threads must not share a line. In declaration order
/// (`repr(C)`), the first pair holds what the owner writes on every trip
/// (the link, the ticket, the dirty prefix, what the guard shows, the
/// taker's name) and what the cleaner writes; the second pair what a drop
/// reads to choose where the buffer goes (its slot, footprint, pinning and
/// fences), which nothing writes on a trip without copies: a buffer dropped
/// by another thread so leaves the pair its owner writes where it is, and
/// the pair the dropper reads stays shared by both threads' caches.
#[derive(Debug)]
#[repr(C, align(128))]
pub(crate) struct Meta {
    /// The next entry of the remote list, or of the cache's deferred list,
    /// that this block is on.
    pub(crate) next: *mut Meta,
    /// While the buffer is dropped and not yet ready, released or leaked:
    /// its drop's flush ticket (see `flush`).
    ticket: Option<Ticket>,
    /// The prefix written since the take (the whole buffer until the guard
    /// narrows it). The guard's home pointer carries whether it is small,
    /// so that a drop need not read it here (see `PinnedBuffer`).
    pub(crate) dirty: usize,
    /// While the buffer is out: the length its guard shows (its class's,
    /// or less for a block borrowed by a smaller class).
    pub(crate) shown: usize,
    /// While the buffer is out of a pool that traces: the name of the
    /// thread that took it (see `trace`), which its drop record names.
    pub(crate) taker: u64,
    /// For a pinned buffer dropped without events: the device synchronizes
    /// started before the drop (see `cleaner::device_sync`).
    pub(crate) sync_gen: u64,
    /// When a buffer on its way to the cleaner was dropped.
    pub(crate) dropped_at: Option<Instant>,
    /// When the buffer last became ready (admission), for idle trimming.
    pub(crate) ready_since: Option<Instant>,
    /// Bytes of the pinned budget that `reserve` admitted for this block
    /// when it was asked for, held until the block's registration takes
    /// them over (or they are given back): so that a second `reserve`
    /// asked before this one's registration sees them taken.
    pub(crate) reserve_share: u64,
    /// While the buffer is out: whether the take was served from the pool.
    pub(crate) pooled: bool,
    /// While the buffer is out: the copies made through cudarc since host
    /// access last waited for them (see `PinnedBuffer`). Kept here, not in
    /// the guard, so that shared borrows of the guard can update it.
    pub(crate) copies_pending: AtomicU8,
    /// The slab a sub-page block was carved from (the block holds one
    /// share of it).
    slab: Option<NonNull<Slab>>,
    /// Siblings the head of a slab has still to carve (0 once carved).
    uncarved: usize,
    /// The region a block was carved from (see `region`).
    region: Option<NonNull<Region>>,
    // The second pair of lines starts here.
    footprint: usize,
    ptr: NonNull<u8>,
    len: usize,
    /// The (device, class) slot index (`Classes::slot`), so that the
    /// caches find a block's lists without the class table.
    slot: u32,
    device: u16,
    class: SizeClass,
    pinned: bool,
    /// Pinned on request ([`Pool::reserve`](crate::pool::Pool::reserve)):
    /// the generation of reservations it was asked in (see
    /// `Admission::reservations`), 0 for none. Idle trimming keeps it
    /// while no `clear` has come since.
    pub(crate) reserved: u32,
    /// What the copies reading the buffer left behind, and spare events;
    /// locked only by copies made through cudarc, which see the buffer
    /// through `&`.
    fences: Mutex<Fences>,
    contents: Contents,
    _track: Track,
}

/// What [`Block::unpin`] leaves to its caller.
#[derive(Debug)]
pub(crate) enum Unpinned {
    /// A block with a registration of its own: unregister it.
    Alone(Block),
    /// A slab block whose slab other blocks still hold: nothing to do.
    Shared,
    /// The slab's last block: unregister the slab.
    Last(LastShare),
    /// A block carved from a region, or the last block of a slab carved
    /// from one, given back to it (the slab's page); the region, if that
    /// was its unlisted region's last block: unregister and free it.
    Carved(Option<Unlisted>),
}

/// The bytes of a slab's mapping, or of the page carved from a region for
/// one: the slab rounded up to pages.
pub(crate) fn slab_len(classes: &Classes) -> usize {
    classes.slab_bytes().next_multiple_of(page_size())
}

impl Meta {
    /// The footprint, for readers that only see the metadata.
    pub(crate) fn footprint_bytes(&self) -> usize {
        self.footprint
    }

    /// The slot, for readers that only see the metadata.
    pub(crate) fn slot(&self) -> usize {
        self.slot as usize
    }
}

/// One buffer's memory and metadata; see the module docs.
#[derive(Debug)]
pub(crate) struct Block {
    meta: NonNull<Meta>,
}

// SAFETY: a block exclusively owns its mapping (for a slab block: its own
// range of the slab, disjoint from its siblings', and one share of the
// slab, counted atomically) and its metadata, like a `Box<[u8]>` plus a
// `Box<Meta>`; the raw pointers carry no thread affinity.
unsafe impl Send for Block {}
// SAFETY: shared access reads the pointer, sizes and flags; the bytes are
// written only through `&mut self` or by a cleaner worker that owns the block.
unsafe impl Sync for Block {}

/// Zeroes `bytes`: up to 64 bytes with two overlapping fixed-size stores
/// (a call to `memset` costs more than that; the take's own small prefixes
/// end here first), from [`STREAM_ZERO_MIN`](mmap::STREAM_ZERO_MIN) up
/// with streaming stores (a block given back to its region uncleaned), the
/// rest with `fill`.
#[inline]
fn zero(bytes: &mut [u8]) {
    let n = bytes.len();
    if (32..=64).contains(&n) {
        bytes[..32].fill(0);
        bytes[n - 32..].fill(0);
    } else if (16..32).contains(&n) {
        bytes[..16].fill(0);
        bytes[n - 16..].fill(0);
    } else if n >= mmap::STREAM_ZERO_MIN {
        // SAFETY: the slice is valid for writes and borrowed mutably.
        unsafe { mmap::zero_streaming(bytes.as_mut_ptr(), n) };
    } else {
        bytes.fill(0);
    }
}

impl Meta {
    /// Fresh metadata of a block at `ptr` in `slot` (`Classes::slot`).
    fn new(
        ptr: NonNull<u8>,
        len: usize,
        footprint: usize,
        slot: u32,
        class: SizeClass,
        device: usize,
    ) -> Self {
        Meta {
            ptr,
            len,
            footprint,
            class,
            device: device as u16,
            slot,
            pinned: false,
            dirty: len,
            shown: len,
            pooled: false,
            copies_pending: AtomicU8::new(0),
            fences: Mutex::new(Fences::default()),
            ticket: None,
            sync_gen: 0,
            taker: 0,
            dropped_at: None,
            reserved: 0,
            reserve_share: 0,
            ready_since: None,
            next: std::ptr::null_mut(),
            slab: None,
            uncarved: 0,
            region: None,
            contents: Contents::new(len.div_ceil(Tune::CHUNK)),
            _track: Track::new(),
        }
    }
}

impl Block {
    /// Maps a fresh, zeroed, unpinned block of `class` for `device`, its
    /// pages to be allocated on NUMA `node` if given. A sub-page class's
    /// block is the head of a new slab, to be carved whole.
    pub(crate) fn allocate(
        classes: &Classes,
        class: SizeClass,
        device: usize,
        node: Option<u32>,
    ) -> Result<Self, Error> {
        Self::allocate_for(classes, class, device, node, usize::MAX)
    }

    /// As [`allocate`](Self::allocate), but the head of a slab carves it
    /// into at most `buffers` blocks, itself included (`buffers >= 1`).
    pub(crate) fn allocate_for(
        classes: &Classes,
        class: SizeClass,
        device: usize,
        node: Option<u32>,
        buffers: usize,
    ) -> Result<Self, Error> {
        let footprint = classes.footprint(class);
        let len = classes.size(class);
        let per_slab = classes.per_slab(class);
        let mapped = if per_slab > 1 {
            slab_len(classes)
        } else {
            footprint
        };
        let ptr = if mapped >= huge_page_size() {
            map_huge(mapped)?
        } else {
            map(mapped)?
        };
        if let Some(node) = node {
            // Before any page is touched, so that every fault (the caller's
            // writes, a cleaner's pre-fault, the driver pinning) lands on
            // the node. A failure leaves the kernel's default placement:
            // slower copies, never a lost buffer.
            if let Err(error) = crate::numa::bind_range(ptr.as_ptr(), mapped, node) {
                tracing::debug!(node, %error, "pinpool: a block could not be bound to its NUMA node");
            }
        }
        let slot = classes.slot(device, class) as u32;
        let mut meta = Box::new(Meta::new(ptr, len, footprint, slot, class, device));
        if per_slab > 1 {
            meta.slab = Some(Slab::new(ptr, classes.slab_bytes(), mapped));
            meta.uncarved = per_slab.min(buffers.max(1)) - 1;
        }
        Ok(Self {
            meta: NonNull::from(Box::leak(meta)),
        })
    }

    /// A block of `class` for `device` at a place [`Regions::carve`] gave,
    /// all-zero, pinned if its region is.
    pub(crate) fn carved(classes: &Classes, class: SizeClass, device: usize, at: Carved) -> Self {
        let (len, footprint) = (classes.size(class), classes.footprint(class));
        let slot = classes.slot(device, class) as u32;
        let mut meta = Box::new(Meta::new(at.ptr, len, footprint, slot, class, device));
        meta.region = Some(at.region);
        meta.pinned = at.pinned;
        meta.dirty = 0;
        Self {
            meta: NonNull::from(Box::leak(meta)),
        }
    }

    /// A block of the sub-page `class` for `device`, the head of a slab
    /// over the page [`Regions::carve`] gave (of [`slab_len`] bytes),
    /// pinned if its region is: all-zero, its siblings still to carve
    /// ([`carve`](Self::carve)). The slab goes back to the region with its
    /// last buffer (see [`unpin`](Self::unpin)).
    pub(crate) fn carved_slab(
        classes: &Classes,
        class: SizeClass,
        device: usize,
        at: Carved,
    ) -> Self {
        debug_assert!(classes.per_slab(class) > 1, "a slab of a page class");
        let (len, footprint) = (classes.size(class), classes.footprint(class));
        let slot = classes.slot(device, class) as u32;
        let mut meta = Box::new(Meta::new(at.ptr, len, footprint, slot, class, device));
        meta.slab = Some(Slab::carved(
            at.ptr,
            classes.slab_bytes(),
            slab_len(classes),
            at.region,
            at.pinned,
        ));
        meta.uncarved = classes.per_slab(class) - 1;
        meta.pinned = at.pinned;
        meta.dirty = 0;
        Self {
            meta: NonNull::from(Box::leak(meta)),
        }
    }

    /// The block carved at `at` (of [`carve_len`](Self::carve_len) bytes)
    /// to take the place of `like`, a pageable one of the same class: a
    /// page block, or the head of a slab with as many siblings to carve as
    /// `like` had.
    pub(crate) fn carved_like(classes: &Classes, like: &Block, at: Carved) -> Self {
        let (class, device) = (like.class(), like.device());
        if !like.in_slab() {
            return Self::carved(classes, class, device, at);
        }
        let mut head = Self::carved_slab(classes, class, device, at);
        head.meta_mut().uncarved = like.meta().uncarved;
        head
    }

    /// Whether the block was carved from a region (a slab's buffers are
    /// not: their slab's page was, see [`is_region_memory`](Self::is_region_memory)).
    pub(crate) fn is_carved(&self) -> bool {
        self.meta().region.is_some()
    }

    /// Whether the block's memory is a region's: carved from one, or a
    /// buffer of a slab carved from one.
    pub(crate) fn is_region_memory(&self) -> bool {
        self.region_of().is_some()
    }

    /// The bytes a region gives for a block like this one: its footprint,
    /// or for a sub-page block, a slab's page.
    pub(crate) fn carve_len(&self, classes: &Classes) -> usize {
        if self.in_slab() {
            slab_len(classes)
        } else {
            self.footprint()
        }
    }

    /// The region the block's memory is a region's of: the one it was
    /// carved from, or its slab's page was.
    #[inline]
    fn region_of(&self) -> Option<NonNull<Region>> {
        let meta = self.meta();
        meta.region.or_else(|| {
            // SAFETY: a slab block holds a share of its slab.
            let slab = unsafe { meta.slab?.as_ref() };
            slab.carved_from()
        })
    }

    /// Whether the block's region is listed (carvable); false for a block
    /// of a region unlisted while it was out, or one not from a region
    /// (see [`is_region_memory`](Self::is_region_memory)).
    pub(crate) fn region_listed(&self) -> bool {
        // SAFETY: a block from a region keeps it alive (its slab's page,
        // for a slab block, is carved until its last share goes).
        self.region_of()
            .is_some_and(|region| unsafe { Region::is_listed(region) })
    }

    /// Whether the block's region drains, read without its lock (see
    /// `Region::drains_hint`).
    pub(crate) fn region_drains_hint(&self) -> bool {
        // SAFETY: as in `region_listed`.
        self.region_of()
            .is_some_and(|region| unsafe { Region::drains_hint(region) })
    }

    /// Whether the block shares a slab.
    pub(crate) fn in_slab(&self) -> bool {
        self.meta().slab.is_some()
    }

    /// Moves what the cleaner tracks of a dropped buffer's trip (its flush
    /// ticket, its drop time, whether it was pinned on request) to
    /// `other`, the block replacing it.
    pub(crate) fn hand_over(&mut self, other: &mut Block) {
        let meta = self.meta_mut();
        let (ticket, dropped_at, reserved) =
            (meta.ticket.take(), meta.dropped_at.take(), meta.reserved);
        let to = other.meta_mut();
        to.ticket = ticket;
        to.dropped_at = dropped_at;
        to.reserved = reserved;
    }

    /// The range a registration of this block page-locks: its own mapping,
    /// or its whole slab.
    pub(crate) fn region(&self) -> (*mut u8, usize) {
        match self.meta().slab {
            // SAFETY: the block holds a share of its slab.
            Some(slab) => unsafe { slab.as_ref() }.region(),
            None => (self.as_ptr(), self.footprint()),
        }
    }

    /// Marks the block pinned after its [`region`](Self::region) was
    /// registered, and, for the head of a slab, the slab with it.
    pub(crate) fn set_registered(&mut self) {
        let meta = self.meta_mut();
        meta.pinned = true;
        if let Some(slab) = meta.slab {
            // SAFETY: the block holds a share of its slab.
            unsafe { slab.as_ref() }.set_pinned();
        }
    }

    /// The head of a slab, on its first trip through the cleaner (after the
    /// slab's registration, when the pool pins): carves the rest of the
    /// slab into zeroed siblings, pinned as the head is. Empty for any
    /// other block.
    pub(crate) fn carve(&mut self) -> Vec<Block> {
        let meta = self.meta_mut();
        let count = std::mem::take(&mut meta.uncarved);
        let Some(slab) = meta.slab.filter(|_| count > 0) else {
            return Vec::new();
        };
        // SAFETY: the head holds a share of its slab.
        unsafe { slab.as_ref() }.add_shares(count);
        let (len, footprint, class, device) = (meta.len, meta.footprint, meta.class, meta.device);
        let (slot, pinned, reserved) = (meta.slot, meta.pinned, meta.reserved);
        let base = meta.ptr.as_ptr();
        (1..=count)
            .map(|i| {
                // SAFETY: the slab holds `per_slab > count` footprints, so
                // the `i`-th lies inside its mapping; nobody has written it
                // (the head's bytes come first), so it is zero.
                let ptr = unsafe { NonNull::new_unchecked(base.add(i * footprint)) };
                let mut sibling = Box::new(Meta::new(
                    ptr,
                    len,
                    footprint,
                    slot,
                    class,
                    usize::from(device),
                ));
                sibling.pinned = pinned;
                sibling.reserved = reserved;
                sibling.dirty = 0;
                sibling.slab = Some(slab);
                Block {
                    meta: NonNull::from(Box::leak(sibling)),
                }
            })
            .collect()
    }

    /// Gives up the block after its copies have finished, for its caller to
    /// unregister what it pinned (see [`Unpinned`]).
    pub(crate) fn unpin(mut self) -> Unpinned {
        if let Some(region) = self.meta().region {
            self.zero_dirty();
            let (ptr, footprint) = (self.as_ptr(), self.footprint());
            let meta = self.into_raw();
            // SAFETY: from `into_raw` above, owned by nobody else; the
            // memory is the region's.
            drop(unsafe { Box::from_raw(meta) });
            // SAFETY: the block was carved there with its footprint and is
            // given back once, all-zero; its copies have finished (the
            // caller's contract).
            return Unpinned::Carved(unsafe { Region::give_back(region, ptr, footprint) });
        }
        let Some(slab) = self.meta().slab else {
            return Unpinned::Alone(self);
        };
        // SAFETY: the block holds a share of its slab.
        if unsafe { slab.as_ref() }.carved_from().is_some() {
            // The page goes back to its region all-zero, with its last
            // buffer: each buffer zeroes what it wrote before giving up
            // its share.
            self.zero_dirty();
        }
        let meta = self.into_raw();
        // SAFETY: from `into_raw` above, owned by nobody else; the mapping
        // is the slab's, freed with it.
        drop(unsafe { Box::from_raw(meta) });
        // SAFETY: the block held a share, given up here.
        match unsafe { Slab::release_share(slab) } {
            Some(last) => match last.into_carved() {
                Ok((region, base, len)) => {
                    // SAFETY: the page was carved from `region` with `len`
                    // bytes and is given back once, all-zero (every buffer
                    // of it zeroed its bytes above, and the Acquire of the
                    // last share's release sees their writes); no copy from
                    // it is in flight (the caller's contract, for every
                    // buffer).
                    let back = unsafe { Region::give_back(region, base, len) };
                    Unpinned::Carved(back)
                }
                Err(last) => Unpinned::Last(last),
            },
            None => Unpinned::Shared,
        }
    }

    #[inline]
    fn meta(&self) -> &Meta {
        // SAFETY: `meta` is a live box owned by this block.
        unsafe { self.meta.as_ref() }
    }

    /// The metadata, for the block's owner to update.
    #[inline]
    pub(crate) fn meta_mut(&mut self) -> &mut Meta {
        // SAFETY: as in `meta`, and `&mut self` makes the access exclusive.
        unsafe { self.meta.as_mut() }
    }

    /// Carries the flush ticket of the block's drop (see `flush`) until
    /// [`take_ticket`](Self::take_ticket).
    #[inline]
    pub(crate) fn set_ticket(&mut self, ticket: Ticket) {
        let meta = self.meta_mut();
        debug_assert!(meta.ticket.is_none(), "a block dropped twice");
        meta.ticket = Some(ticket);
    }

    /// The flush ticket of the block's drop, for the caller to close once
    /// the block is ready, released or leaked; `None` for a block that was
    /// not dropped (a miss, or one swept out of a shard).
    #[inline]
    pub(crate) fn take_ticket(&mut self) -> Option<Ticket> {
        self.meta_mut().ticket.take()
    }

    /// The block's class.
    #[inline]
    pub(crate) fn class(&self) -> SizeClass {
        self.meta().class
    }

    /// The block's (device, class) slot index.
    #[inline]
    pub(crate) fn slot(&self) -> usize {
        self.meta().slot()
    }

    /// The bytes the block hands out (its class size).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.meta().len
    }

    /// The bytes the block occupies (and pins).
    #[inline]
    pub(crate) fn footprint(&self) -> usize {
        self.meta().footprint
    }

    /// The device shard the block belongs to.
    #[inline]
    pub(crate) fn device(&self) -> usize {
        usize::from(self.meta().device)
    }

    #[inline]
    pub(crate) fn is_pinned(&self) -> bool {
        self.meta().pinned
    }

    pub(crate) fn set_pinned(&mut self, pinned: bool) {
        self.meta_mut().pinned = pinned;
    }

    /// The length the buffer's guard shows (see `Meta::shown`).
    #[inline]
    pub(crate) fn shown(&self) -> usize {
        self.meta().shown
    }

    /// Whether the take was served from the pool (see `Meta::pooled`).
    #[inline]
    pub(crate) fn was_pooled(&self) -> bool {
        self.meta().pooled
    }

    /// The guard's record of copies made through cudarc (see
    /// `Meta::copies_pending`).
    #[inline]
    pub(crate) fn copies_pending(&self) -> &AtomicU8 {
        &self.meta().copies_pending
    }

    /// The dirty prefix, clamped to the length.
    #[inline]
    pub(crate) fn dirty(&self) -> usize {
        self.meta().dirty.min(self.len())
    }

    /// When the block last became ready.
    pub(crate) fn ready_since(&self) -> Option<Instant> {
        self.meta().ready_since
    }

    /// Whether the block was pinned on request.
    pub(crate) fn is_reserved(&self) -> bool {
        self.meta().reserved != 0
    }

    /// Whether the block was pinned on request in the generation of
    /// reservations `now` (none has been forgotten by a `clear` since).
    pub(crate) fn is_reserved_in(&self, now: u32) -> bool {
        self.meta().reserved == now
    }

    /// The block's fences, through exclusive access (no locking).
    #[inline]
    pub(crate) fn fences_mut(&mut self) -> &mut Fences {
        self.meta_mut().fences.get_mut()
    }

    /// The block's fences, locked (for copies through a shared borrow).
    pub(crate) fn fences_locked(&self) -> MutexGuard<'_, Fences> {
        self.meta().fences.lock()
    }

    #[inline]
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.meta().ptr.as_ptr()
    }

    /// The stand-in for the bytes, for writers that work through raw
    /// pointers (the cleaner's chunks).
    pub(crate) fn contents(&self) -> &Contents {
        &self.meta().contents
    }

    #[inline]
    pub(crate) fn as_slice(&self) -> &[u8] {
        let meta = self.meta();
        meta.contents.read();
        // SAFETY:
        // - `ptr` is a live mapping of `footprint >= len` bytes;
        // - the bytes are initialised (anonymous mappings are zero-filled);
        // - `&self` excludes writers: every writer holds `&mut self` or is a
        //   cleaner worker that owns the block.
        unsafe { std::slice::from_raw_parts(meta.ptr.as_ptr(), meta.len) }
    }

    #[inline]
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        let meta = self.meta();
        meta.contents.write();
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(meta.ptr.as_ptr(), meta.len) }
    }

    /// Zeroes the dirty prefix (the self-clean of a small buffer).
    #[inline]
    pub(crate) fn zero_dirty(&mut self) {
        let dirty = self.dirty();
        zero(&mut self.as_mut_slice()[..dirty]);
        self.meta_mut().dirty = 0;
    }

    /// Asks the CPU to fetch the block's metadata (the pair of lines its
    /// owner writes on every trip) for writing, ahead of a loop that
    /// reaches many blocks: their misses then overlap. A hint only: nothing
    /// if the CPU has no such instruction.
    #[inline]
    pub(crate) fn prefetch(&self) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0};
            let meta = self.meta.as_ptr().cast::<i8>().cast_const();
            // SAFETY: a prefetch never faults and changes no memory; the
            // second line is inside the metadata (aligned to 128 bytes).
            unsafe {
                _mm_prefetch::<_MM_HINT_ET0>(meta);
                _mm_prefetch::<_MM_HINT_ET0>(meta.wrapping_add(64));
            }
        }
    }

    /// Gives up the block's ownership as a metadata pointer (remote lists).
    pub(crate) fn into_raw(self) -> *mut Meta {
        let ptr = self.meta.as_ptr();
        std::mem::forget(self);
        ptr
    }

    /// Takes back ownership of a pointer from [`into_raw`](Self::into_raw).
    ///
    /// # Safety
    /// `ptr` came from `into_raw` and is not owned by anyone else.
    pub(crate) unsafe fn from_raw(ptr: *mut Meta) -> Self {
        Self {
            // SAFETY: `into_raw` pointers are never null.
            meta: unsafe { NonNull::new_unchecked(ptr) },
        }
    }

    /// Forgets the mapping (it stays mapped, and registered if it was) and
    /// drops the metadata: for memory that a copy may still be reading. A
    /// slab block keeps its share, so the slab is never freed either.
    /// Returns the bytes kept from the OS for good, to count as leaked: the
    /// block's footprint, or its whole slab for the first block of the slab
    /// leaked (0 for the next ones).
    pub(crate) fn leak(self) -> usize {
        let (footprint, slab, region) = (self.footprint(), self.meta().slab, self.meta().region);
        let meta = self.into_raw();
        // SAFETY: from `into_raw` above, owned by nobody else.
        drop(unsafe { Box::from_raw(meta) });
        if let Some(region) = region {
            // SAFETY: the block was carved there and never comes back.
            unsafe { Region::leak_block(region) };
            return footprint;
        }
        match slab {
            None => footprint,
            Some(slab) => {
                // SAFETY: the share kept here keeps the slab alive for good.
                let slab = unsafe { slab.as_ref() };
                // This share is never given up: the page never comes back.
                slab.keep_page_carved();
                slab.leaked_bytes()
            }
        }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: the metadata box is owned by this block and dropped once.
        let meta = unsafe { Box::from_raw(self.meta.as_ptr()) };
        if let Some(region) = meta.region {
            // The region's memory: give it back (zeroed) if its copies are
            // done, which a block dropped rather than released or leaked
            // cannot say; keep it from reuse instead.
            // SAFETY: the block was carved there and is never given back.
            unsafe { Region::leak_block(region) };
            tracing::error!(
                bytes = meta.footprint,
                "pinpool: a carved block was dropped without being given back; leaking it"
            );
            return;
        }
        if meta.pinned {
            // Unmapping page-locked memory would hand registered pages back
            // to the OS; losing the mapping is the lesser harm.
            tracing::error!(
                bytes = meta.footprint,
                "pinpool: a pinned block was dropped without unregistering; leaking it"
            );
            return;
        }
        if let Some(slab) = meta.slab {
            // SAFETY: the block held a share, given up here.
            if let Some(last) = unsafe { Slab::release_share(slab) } {
                last.free();
            }
            return;
        }
        // SAFETY: `ptr` is the start of a mapping of `footprint` bytes made
        // by `map`/`map_huge` and owned by this block alone.
        let rc = unsafe { libc::munmap(meta.ptr.as_ptr().cast(), meta.footprint) };
        if rc != 0 {
            tracing::error!(error = %std::io::Error::last_os_error(), "pinpool: munmap failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(not(pinpool_loom))]
    fn what_a_trip_writes_and_what_a_drop_reads_sit_in_different_pairs_of_lines() {
        use std::mem::{offset_of, size_of};
        let written = [
            ("next", offset_of!(Meta, next) + size_of::<*mut Meta>()),
            (
                "ticket",
                offset_of!(Meta, ticket) + size_of::<Option<Ticket>>(),
            ),
            ("dirty", offset_of!(Meta, dirty) + size_of::<usize>()),
            ("shown", offset_of!(Meta, shown) + size_of::<usize>()),
            ("taker", offset_of!(Meta, taker) + size_of::<u64>()),
            ("pooled", offset_of!(Meta, pooled) + 1),
            ("copies_pending", offset_of!(Meta, copies_pending) + 1),
        ];
        for (field, end) in written {
            assert!(end <= 128, "{field} ends at {end}");
        }
        let read = [
            ("footprint", offset_of!(Meta, footprint)),
            ("ptr", offset_of!(Meta, ptr)),
            ("len", offset_of!(Meta, len)),
            ("slot", offset_of!(Meta, slot)),
            ("device", offset_of!(Meta, device)),
            ("class", offset_of!(Meta, class)),
            ("pinned", offset_of!(Meta, pinned)),
            ("fences", offset_of!(Meta, fences)),
        ];
        for (field, start) in read {
            assert!(start >= 128, "{field} starts at {start}");
        }
        assert_eq!(size_of::<Meta>(), 256);
    }

    #[test]
    fn page_sizes_come_from_the_system() {
        // SAFETY: sysconf has no preconditions.
        let sys = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        assert_eq!(page_size(), sys);
        assert!(huge_page_size() >= page_size() && huge_page_size().is_power_of_two());
    }

    #[test]
    fn a_block_for_a_node_is_faulted_in_on_it() {
        let classes = Classes::new(crate::size_class::SizeClasses::Fine, page_size());
        let class = classes.class_for(64 * page_size()).unwrap();
        // Node 0 exists on every Linux machine.
        let mut block = Block::allocate(&classes, class, 0, Some(0)).unwrap();
        block.as_mut_slice().fill(1);
        let pages = block.footprint() / page_size();
        match crate::numa::pages_on_node(block.as_ptr(), block.footprint(), 0) {
            Ok(on) => assert_eq!(on, pages),
            // Sandboxes may forbid move_pages; mbind's effect cannot be
            // read back there.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::ENOSYS)) => {
                eprintln!("not checked: move_pages is not permitted here ({e})")
            }
            Err(e) => panic!("move_pages: {e}"),
        }
    }
}
