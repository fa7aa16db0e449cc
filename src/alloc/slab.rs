//! Slabs: one registered mapping shared by several sub-page blocks.
//!
//! A miss of a class shorter than a slab maps a whole [`Slab`] and hands
//! out its first block, the *head*; the head's first trip through the
//! cleaner registers the slab (one call) and carves the rest of it into
//! *siblings* (`Block::carve`). Each block holds one share of its slab,
//! counted here as an `Arc` counts; the holder of the last share, a
//! [`LastShare`], unregisters the slab through the backend if it is
//! registered, then unmaps it (or leaks it, if that failed). The count is
//! kept by hand because a `Drop` cannot call the backend.
//!
//! On a pool that carves from regions, a slab is instead one page carved
//! from a region ([`Slab::carved`]): pinned with the region, never
//! registered on its own, and given back to the region by the holder of the
//! last share (see `Block::unpin`).

use std::ptr::NonNull;

use crate::sync::track::Track;
use crate::sync::{AtomicBool, AtomicUsize, Ordering};

use super::region::Region;

/// A page-aligned mapping that sub-page blocks are carved from; see the
/// module docs. Boxed and shared by raw pointer, its shares counted in
/// `shares` (as an `Arc` counts, but the last share must unregister the
/// slab through the backend before unmapping it, which a `Drop` cannot).
#[derive(Debug)]
pub(crate) struct Slab {
    base: NonNull<u8>,
    /// The bytes registered: the whole slab.
    len: usize,
    /// The bytes mapped: `len` rounded up to pages.
    mapped: usize,
    /// Blocks carved from the slab and not freed.
    shares: AtomicUsize,
    /// Whether the slab is registered. Set by the head's owner before any
    /// sibling exists, and read and cleared by the holder of the last
    /// share; they reach it through block handoffs and the AcqRel count of
    /// `shares`.
    pinned: AtomicBool,
    /// Whether a block of the slab was leaked (which keeps the slab from
    /// the OS for good), so that the slab's bytes are counted leaked once.
    leaked: AtomicBool,
    /// The region the slab's page was carved from, if it was (then it is
    /// pinned with the region, and goes back to it, never unmapped).
    carved_from: Option<NonNull<Region>>,
    _track: Track,
}

impl Slab {
    /// A slab over the mapping at `base` (`mapped` bytes, of which `len`
    /// are registered), with one share: the head's.
    pub(super) fn new(base: NonNull<u8>, len: usize, mapped: usize) -> NonNull<Slab> {
        Self::boxed(base, len, mapped, None, false)
    }

    /// A slab over `mapped` bytes at `base` carved from `region` (pinned
    /// if the region is), with one share: the head's.
    pub(super) fn carved(
        base: NonNull<u8>,
        len: usize,
        mapped: usize,
        region: NonNull<Region>,
        pinned: bool,
    ) -> NonNull<Slab> {
        Self::boxed(base, len, mapped, Some(region), pinned)
    }

    fn boxed(
        base: NonNull<u8>,
        len: usize,
        mapped: usize,
        carved_from: Option<NonNull<Region>>,
        pinned: bool,
    ) -> NonNull<Slab> {
        let slab = Box::new(Slab {
            base,
            len,
            mapped,
            shares: AtomicUsize::new(1),
            pinned: AtomicBool::new(pinned),
            leaked: AtomicBool::new(false),
            carved_from,
            _track: Track::new(),
        });
        NonNull::from(Box::leak(slab))
    }

    /// The region the slab was carved from, if it was.
    pub(super) fn carved_from(&self) -> Option<NonNull<Region>> {
        self.carved_from
    }

    /// For a slab carved from a region whose page will never be given
    /// back (a buffer of it leaked, or the slab freed rather than given
    /// back): marks the region leaked, so that it is never unmapped and a
    /// drain of it is given up. Whether the slab was carved from one.
    pub(super) fn keep_page_carved(&self) -> bool {
        let Some(region) = self.carved_from else {
            return false;
        };
        // SAFETY: the slab's page was carved from `region` and is never
        // given back, so the region stays alive.
        unsafe { Region::leak_block(region) };
        true
    }

    /// The range a registration of the slab page-locks: all of it.
    pub(super) fn region(&self) -> (*mut u8, usize) {
        (self.base.as_ptr(), self.len)
    }

    /// Marks the slab registered, after the head's owner registered it.
    pub(super) fn set_pinned(&self) {
        // Relaxed: see `pinned`.
        self.pinned.store(true, Ordering::Relaxed);
    }

    /// Adds `count` shares, for siblings carved by a holder of a share.
    pub(super) fn add_shares(&self, count: usize) {
        // Relaxed, as `Arc`'s clone: a new share made from one held needs
        // no ordering.
        self.shares.fetch_add(count, Ordering::Relaxed);
    }

    /// The bytes a leaked block of the slab keeps from the OS for good, to
    /// count as leaked: the whole slab for the first block leaked, 0 for
    /// the next ones.
    pub(super) fn leaked_bytes(&self) -> usize {
        // Relaxed: a once-only count; the swap decides which leak counts
        // the slab, and orders nothing.
        if self.leaked.swap(true, Ordering::Relaxed) {
            0
        } else {
            self.len
        }
    }

    /// Gives up one share of `slab`: `Some` for the last one, whose holder
    /// now owns the slab.
    ///
    /// # Safety
    /// The caller holds a share of `slab`, which it gives up.
    pub(super) unsafe fn release_share(slab: NonNull<Slab>) -> Option<LastShare> {
        // SAFETY: a share keeps the slab alive.
        let shares = unsafe { &slab.as_ref().shares };
        // AcqRel, as `Arc`'s drop: Release publishes this share's last use
        // of the slab's memory (a sibling's bytes, its registration) to the
        // last holder, whose Acquire sees every other share's before it
        // unregisters and unmaps.
        (shares.fetch_sub(1, Ordering::AcqRel) == 1).then_some(LastShare(slab))
    }
}

/// The last share of a slab: its holder unregisters the slab if
/// [`registered`](Self::registered), then frees or leaks it.
#[derive(Debug)]
pub(crate) struct LastShare(NonNull<Slab>);

// SAFETY: the last share owns the slab exclusively.
unsafe impl Send for LastShare {}

impl LastShare {
    fn slab(&self) -> &Slab {
        // SAFETY: the last share owns the live slab.
        unsafe { self.0.as_ref() }
    }

    /// The base pointer the slab was registered with.
    pub(crate) fn base(&self) -> *mut u8 {
        self.slab().base.as_ptr()
    }

    /// The bytes the slab pins while registered.
    pub(crate) fn len(&self) -> usize {
        self.slab().len
    }

    /// Whether the slab is still registered.
    pub(crate) fn registered(&self) -> bool {
        // Relaxed: see `Slab::pinned`.
        self.slab().pinned.load(Ordering::Relaxed)
    }

    /// Marks the slab unregistered, after its holder unregistered it.
    pub(crate) fn set_unregistered(&self) {
        self.slab().pinned.store(false, Ordering::Relaxed);
    }

    /// For a slab carved from a region: frees the slab's record and
    /// returns the region, and the page to give back to it (`base` and
    /// `mapped`); a slab of its own mapping comes back as `Err`.
    pub(super) fn into_carved(self) -> Result<(NonNull<Region>, *mut u8, usize), LastShare> {
        let Some(region) = self.slab().carved_from else {
            return Err(self);
        };
        // SAFETY: the last share owns the slab box, made by `Box::leak`.
        let slab = unsafe { Box::from_raw(self.0.as_ptr()) };
        Ok((region, slab.base.as_ptr(), slab.mapped))
    }

    /// Unmaps the slab, or leaks its mapping if it is still registered. A
    /// slab carved from a region is kept from reuse instead (its page stays
    /// carved for good): whoever frees rather than gives it back cannot say
    /// that its bytes are zero.
    pub(crate) fn free(self) {
        // SAFETY: the last share owns the slab box, made by `Box::leak`.
        let slab = unsafe { Box::from_raw(self.0.as_ptr()) };
        if slab.keep_page_carved() {
            tracing::error!(
                bytes = slab.mapped,
                "pinpool: a slab carved from a region was freed without being given back; leaking it"
            );
            return;
        }
        if slab.pinned.load(Ordering::Relaxed) {
            tracing::error!(
                bytes = slab.len,
                "pinpool: a pinned slab was freed without unregistering; leaking it"
            );
            return;
        }
        // SAFETY: `base` starts a mapping of `mapped` bytes made by `map`
        // for this slab, and no block of it is left.
        let rc = unsafe { libc::munmap(slab.base.as_ptr().cast(), slab.mapped) };
        if rc != 0 {
            tracing::error!(error = %std::io::Error::last_os_error(), "pinpool: munmap failed");
        }
    }

    /// Forgets the slab: it stays mapped, and registered if it was.
    pub(crate) fn leak(self) {
        // SAFETY: as in `free`; the mapping is not touched.
        let slab = unsafe { Box::from_raw(self.0.as_ptr()) };
        slab.keep_page_carved();
    }
}
