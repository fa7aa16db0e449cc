//! Regions: large registrations that buffers are carved from.
//!
//! A [`Region`] is one mapping on its device's NUMA node, registered with
//! one call when the pool pins, then carved into buffers: a carved block
//! lies wholly inside its region, so no copy from it spans two
//! registrations, and pinning a buffer costs no registration at all. The
//! region keeps its *free extents* (the ranges no block holds) coalesced,
//! by offset and by size, under a lock of its own: a block given back
//! merges with free neighbours, so memory moves between size classes. Free
//! extents are always all-zero: a mapping starts zeroed, and a block is
//! given back only once its bytes are (the releaser zeroes what was
//! written).
//!
//! A device has one set of [`Regions`] (see `Shard::regions`), which every
//! buffer of whole pages, and every sub-page slab's page, is carved from.
//! It grows by demand: the most
//! bytes its takes held at once, misses included, as the provisioning
//! tick counts them and as each miss counts them at its take (see
//! [`Regions::note_in_use`] and [`Regions::note_miss`]); the cleaner grows
//! a set by what it falls short of that peak plus an eighth, ahead of
//! misses once the demand comes near what it holds (the provisioning
//! sweep, and a returned miss, once the demand has stopped rising: see
//! [`GROWTH_SETTLE`](Tuning::GROWTH_SETTLE) and [`Regions::growth_waits`]).
//!
//! A growth folds the set's wholly free regions into the region it
//! registers, their pages moved rather than faulted again (see
//! [`Regions::fold_plan`] and [`Regions::grow`]), so a set keeps a
//! few large regions whose extents can hold its largest buffers.
//!
//! A set lists the regions that takes may carve from; the
//! list's lock is held across a carve, so a region is unlisted (to be
//! unregistered and unmapped) only while no carve can pick it. A region is
//! released once it is wholly free and unlisted: by [`Regions::unlist_idle`]
//! (idle trim, the cap, `clear`) or [`Regions::drain_excess`] (a set that
//! holds far more than its demand) when nothing is carved from it, or, for
//! a region unlisted with blocks still out (`shutdown` while buffers are
//! held), by whoever gives back its last block. A region *drained* with
//! blocks out is held by its set, which releases it once wholly free, or
//! lists it again if it does not drain within the idle-trim time
//! ([`Regions::settle_drains`]).
//! A block that is leaked
//! (its copies not known to have finished) stays carved for good, so its
//! region is never unmapped.
//!
//! Both locks are taken on the slow paths only (a take that found no
//! buffer of its class, the cleaner, trims), never by a take or drop that
//! its thread cache or a class stack serves.

use std::collections::{BTreeMap, BTreeSet};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::sync::track::Track;
use crate::sync::{Arc, AtomicBool, AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering};
use crate::tune::{Tune, Tuning};

use super::mmap::{huge_page_size, map, map_huge, move_pages};

/// What the regions fall short of (see [`Regions::take_shortfall`]):
/// `want` bytes to grow by, headroom included, of which `need` at the
/// least (what the demand itself passes them by, or a buffer that must fit
/// in one extent): a growth for a miss of another size keeps `need` of it
/// when the budget or a failed registration makes it smaller. All 0 when
/// nothing is short.
///
/// `merge`: the footprint of a missed buffer that no free extent holds
/// while the regions hold the bytes the demand needs: one extent for it
/// may be made of wholly free regions, moved together, adding no bytes
/// (see [`Regions::merge_plan`]); 0 otherwise.
///
/// `whole`: the largest footprint a take found no free extent for since
/// the last growth (0 if none), which a region of the growth must hold in
/// one extent: a growth cut short at a given cap is not cut below it.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Shortfall {
    pub(crate) want: usize,
    pub(crate) need: usize,
    pub(crate) merge: usize,
    pub(crate) whole: usize,
}

impl Shortfall {
    /// The least a growth for it must add to be worth its registration:
    /// `need` when the demand passes the regions (or a buffer must fit in
    /// one extent), else all of `want` (growth ahead of demand is all or
    /// nothing).
    pub(crate) fn least(&self) -> usize {
        if self.need > 0 {
            self.need
        } else {
            self.want
        }
    }
}

/// The next region's serial number (see `Region::serial`). A plain
/// atomic, not the loom-aware one: it only tells regions apart.
static REGION_SERIALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A wholly free region, as [`Regions::free_regions`] lists it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FreeRegion {
    /// Its length.
    pub(crate) len: usize,
    /// What [`Regions::unlist_chosen`] knows it by: its serial number
    /// (an address may be reused by a region listed since).
    pub(crate) key: u64,
    /// Whether the caller's `eligible` accepted it.
    pub(crate) eligible: bool,
}

/// The positions in `lens` of the set whose lengths add up to at least
/// `at_least` and at most `at_most` with the fewest bytes (of equal sets,
/// the one whose largest is smallest); `None` if no set does. A search
/// over every set: at most 16 lengths.
fn fewest_covering(lens: &[usize], at_least: usize, at_most: usize) -> Option<Vec<usize>> {
    assert!(
        lens.len() <= 16,
        "a search over every set of {} lengths",
        lens.len()
    );
    let members = |set: u32| (0..lens.len()).filter(move |i| set & (1 << i) != 0);
    let mut best: Option<(usize, usize, u32)> = None;
    for set in 1u32..(1 << lens.len()) {
        let total: usize = members(set).map(|i| lens[i]).sum();
        let largest = members(set).map(|i| lens[i]).max().unwrap_or(0);
        let fits = (at_least..=at_most).contains(&total);
        if fits && best.is_none_or(|(t, l, _)| (total, largest) < (t, l)) {
            best = Some((total, largest, set));
        }
    }
    best.map(|(_, _, set)| members(set).collect())
}

/// Which of `lens` (ascending) to release to cover `bytes`: the fewest
/// bytes that do among the 16 smallest (see [`fewest_covering`]), else
/// the smallest first until covered, or all of them if they hold less.
/// Positions in `lens`.
pub(crate) fn cover(lens: &[usize], bytes: usize) -> Vec<usize> {
    let small = &lens[..lens.len().min(16)];
    if let Some(set) = fewest_covering(small, bytes, usize::MAX) {
        return set;
    }
    let mut left = bytes;
    (0..lens.len())
        .take_while(|&i| {
            let take = left > 0;
            left = left.saturating_sub(lens[i]);
            take
        })
        .collect()
}

/// The wholly free regions a growth folds (see [`Regions::grow`]): a
/// length per region, and how long each must have been wholly free when
/// it is unlisted (a region of a planned length freed since the plan, not
/// so long ago, is left: see [`Regions::idle_cover`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Fold {
    /// The regions' lengths, one region each.
    pub(crate) lens: Vec<usize>,
    /// How long a region must have been wholly free to be folded.
    pub(crate) idle: Duration,
}

impl From<Vec<usize>> for Fold {
    /// Regions of these lengths, however long they have been free.
    fn from(lens: Vec<usize>) -> Self {
        Self {
            lens,
            idle: Duration::ZERO,
        }
    }
}

/// A growth that failed (see [`Regions::grow`]): its error, and what was
/// kept of the regions it folded: `Some(bytes)` registered again as one
/// region of their own (a registration the caller counts), `None` if
/// nothing was folded or that registration failed too (then they are
/// freed).
#[derive(Debug)]
pub(crate) struct GrowFailed {
    pub(crate) error: Error,
    pub(crate) kept: Option<usize>,
}

/// What a device's takes wanted of its regions over the idle-trim window
/// (see [`Regions::drain_excess`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Demand {
    /// The most bytes in use, or carved, at once.
    pub(crate) bytes: usize,
    /// The largest block carved, or held (in use, or idle in its class)
    /// at a tick.
    pub(crate) largest: usize,
}

/// A region [`Regions::drain_excess`] unlisted.
#[derive(Debug)]
pub(crate) enum Drained {
    /// Nothing was carved from it: the caller releases it.
    Free(Unlisted),
    /// Blocks of it are out: the set holds it until they are back (see
    /// [`Regions::settle_drains`]).
    WithBlocksOut,
}

/// One registration that blocks are carved from; see the module docs.
#[derive(Debug)]
pub(crate) struct Region {
    base: NonNull<u8>,
    /// The bytes mapped (and registered, when pinned).
    len: usize,
    /// A number no other region of the process had (see
    /// [`Regions::free_regions`]): its address may be a freed region's.
    serial: u64,
    /// When it was listed.
    listed_at: Instant,
    state: Mutex<Extents>,
    /// `state.draining`, for reads without the lock (see
    /// [`drains_hint`](Self::drains_hint)); written with it, under it.
    drains: AtomicBool,
    totals: Arc<Totals>,
    _track: Track,
}

/// A region's free extents and carved blocks.
#[derive(Debug)]
struct Extents {
    /// Free extents: offset -> length, never adjacent (coalesced).
    by_offset: BTreeMap<usize, usize>,
    /// The same extents as (length, offset), for best fit.
    by_size: BTreeSet<(usize, usize)>,
    free: usize,
    /// Blocks carved and not given back (leaked ones included).
    out: usize,
    /// In its device's list, so that takes may carve from it.
    listed: bool,
    /// Registered: unregister before unmapping.
    registered: bool,
    /// A block of it was leaked: the region is never unmapped.
    leaked: bool,
    /// Unlisted by [`Regions::drain_excess`] with blocks out, and held in
    /// its set's drains until [`Regions::settle_drains`] releases it
    /// (wholly free) or lists it again (a drain that did not end in time).
    draining: bool,
    /// A drain of it was given up: it is not drained again until it has
    /// been wholly free (what kept the drain from ending is gone then).
    undrainable: bool,
    /// When the region last became wholly free.
    idle_since: Option<Instant>,
}

impl Extents {
    fn insert(&mut self, mut offset: usize, mut len: usize) {
        if let Some((&before, &before_len)) = self.by_offset.range(..offset).next_back() {
            debug_assert!(
                before + before_len <= offset,
                "a free extent given back twice"
            );
            if before + before_len == offset {
                self.remove(before, before_len);
                offset = before;
                len += before_len;
            }
        }
        if let Some((&after, &after_len)) = self.by_offset.range(offset + len..).next() {
            if offset + len == after {
                self.remove(after, after_len);
                len += after_len;
            }
        }
        self.by_offset.insert(offset, len);
        self.by_size.insert((len, offset));
    }

    fn remove(&mut self, offset: usize, len: usize) {
        self.by_offset.remove(&offset);
        self.by_size.remove(&(len, offset));
    }

    /// The smallest free extent of at least `len` bytes, as (length,
    /// offset).
    fn best_fit(&self, len: usize) -> Option<(usize, usize)> {
        self.by_size.range((len, 0)..).next().copied()
    }

    fn largest(&self) -> usize {
        self.by_size.last().map_or(0, |&(len, _)| len)
    }
}

// SAFETY: a region owns its mapping; its mutable state is behind its lock,
// and the bytes of each extent are written only by the block carved there.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// How long it has been wholly free and how long listed, at `now`, if
    /// nothing is carved from it (`state` is its extents, locked).
    fn free_times(&self, state: &Extents, now: Instant) -> Option<(Duration, Duration)> {
        let since = state.idle_since.filter(|_| state.out == 0)?;
        Some((
            now.saturating_duration_since(since),
            now.saturating_duration_since(self.listed_at),
        ))
    }

    /// The base pointer the region is registered at.
    pub(crate) fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Gives back the block of `len` bytes at `ptr`, all-zero, carved from
    /// `region`. `Some` if that was the last block of an unlisted region:
    /// the caller now owns it, to unregister and free.
    ///
    /// # Safety
    /// The block was carved from `region` at `ptr` with `len` bytes, is
    /// given back once, and its bytes are all zero; no copy reads them.
    pub(crate) unsafe fn give_back(
        region: NonNull<Region>,
        ptr: *mut u8,
        len: usize,
    ) -> Option<Unlisted> {
        // SAFETY: a carved block keeps its region alive (`out > 0`).
        let this = unsafe { region.as_ref() };
        let offset = ptr as usize - this.base() as usize;
        let mut state = this.state.lock();
        debug_assert!(state.out > 0 && offset + len <= this.len);
        state.insert(offset, len);
        state.free += len;
        state.out -= 1;
        if state.listed {
            // Relaxed: see `Totals`.
            this.totals.out.fetch_sub(len, Ordering::Relaxed);
        }
        if state.out > 0 {
            return None;
        }
        state.idle_since = Some(Instant::now());
        // What kept a drain from ending (a buffer held for good, reserved,
        // or idle in a hot class) is gone: it may drain again.
        state.undrainable = false;
        // A drained region is released by `settle_drains`, which holds it.
        (!state.listed && !state.draining).then_some(Unlisted(region))
    }

    /// Whether `region` is listed (see `Regions`).
    ///
    /// # Safety
    /// The caller holds a block carved from `region`.
    pub(crate) unsafe fn is_listed(region: NonNull<Region>) -> bool {
        // SAFETY: a carved block keeps its region alive.
        unsafe { region.as_ref() }.state.lock().listed
    }

    /// Notes that the block carved from `region` will never come back (its
    /// copies are not known to have finished): the region stays mapped,
    /// and registered if it was, for good.
    ///
    /// # Safety
    /// The block was carved from `region` and is not given back.
    pub(crate) unsafe fn leak_block(region: NonNull<Region>) {
        // SAFETY: a carved block keeps its region alive.
        let this = unsafe { region.as_ref() };
        // A drain of it never ends: `settle_drains` gives it up in time.
        this.state.lock().leaked = true;
    }

    /// Whether `region` drains, without its lock: a hint for a take that
    /// would reuse one of its blocks.
    ///
    /// # Safety
    /// The caller holds a block carved from `region`.
    pub(crate) unsafe fn drains_hint(region: NonNull<Region>) -> bool {
        // SAFETY: a carved block keeps its region alive.
        let this = unsafe { region.as_ref() };
        // Relaxed: a stale `false` lets one more reuse of a block of a
        // region that began draining (the next reuse, or the tick's pull,
        // sends it back); a stale `true` sends a block of a drain just
        // ended through the cleaner, which gives it back to its region or
        // its class as it would any drop. Neither loses it.
        this.drains.load(Ordering::Relaxed)
    }

    /// Sets `state.draining`, and its hint.
    fn set_draining(&self, state: &mut Extents, on: bool) {
        state.draining = on;
        // Relaxed: a hint (see `drains_hint`); the state is the truth.
        self.drains.store(on, Ordering::Relaxed);
    }
}

/// A region taken out of its list with nothing carved from it: its holder
/// unregisters it if [`registered`](Self::registered), then
/// [`free`](Self::free)s or [`leak`](Self::leak)s it.
#[derive(Debug)]
pub(crate) struct Unlisted(NonNull<Region>);

// SAFETY: an unlisted region with nothing out is owned by its holder alone.
unsafe impl Send for Unlisted {}

impl Unlisted {
    fn region(&self) -> &Region {
        // SAFETY: the holder owns the live region.
        unsafe { self.0.as_ref() }
    }

    /// The base pointer the region was registered at.
    pub(crate) fn base(&self) -> *mut u8 {
        self.region().base()
    }

    /// The bytes the region pins while registered.
    pub(crate) fn len(&self) -> usize {
        self.region().len
    }

    /// Whether the region is still registered.
    pub(crate) fn registered(&self) -> bool {
        self.region().state.lock().registered
    }

    /// Marks the region unregistered, after its holder unregistered it.
    pub(crate) fn set_unregistered(&self) {
        let mut state = self.region().state.lock();
        state.registered = false;
    }

    /// Unmaps the region, or leaks it if it is still registered or a block
    /// of it was leaked.
    pub(crate) fn free(self) {
        // SAFETY: the holder owns the region box, made by `Box::leak`.
        let region = unsafe { Box::from_raw(self.0.as_ptr()) };
        let state = region.state.lock();
        if state.registered || state.leaked {
            if state.registered {
                tracing::error!(
                    bytes = region.len,
                    "pinpool: a pinned region was freed without unregistering; leaking it"
                );
            }
            return;
        }
        drop(state);
        // SAFETY: `base` starts a mapping of `len` bytes made for this
        // region, and no block of it is left.
        let rc = unsafe { libc::munmap(region.base().cast(), region.len) };
        if rc != 0 {
            tracing::error!(error = %std::io::Error::last_os_error(), "pinpool: munmap failed");
        }
    }

    /// Forgets the region, whose pages were moved elsewhere or unmapped
    /// (see `move_into`): nothing is left mapped at its base.
    fn forget_moved(self) {
        // SAFETY: as in `free`; the mapping is gone already.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }

    /// Forgets the region: it stays mapped, and registered if it was.
    pub(crate) fn leak(self) {
        // SAFETY: as in `free`; the mapping is not touched.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

/// A block's place in a region: what [`Regions::carve`] hands out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Carved {
    pub(crate) region: NonNull<Region>,
    pub(crate) ptr: NonNull<u8>,
    /// Whether the region is registered.
    pub(crate) pinned: bool,
}

/// What a device's listed regions hold, and what the device's takes have
/// wanted of them. Every access is Relaxed: the figures size the next
/// region, and a stale one makes it a little larger or smaller than the
/// demand, which the next miss corrects.
#[derive(Debug, Default)]
struct Totals {
    /// When `peak` last rose: nanoseconds since the process's first
    /// reading (see `since_epoch`), 0 before it ever did.
    peak_rose: AtomicU64,
    /// When the run of rises that `peak_rose` ends began: the first rise
    /// after a settling time without any (same clock).
    rising_since: AtomicU64,
    /// Bytes of the listed regions.
    bytes: AtomicUsize,
    /// Bytes carved from them and not given back.
    out: AtomicUsize,
    /// The bytes of pinned buffers of this set that takes held at the last
    /// provisioning tick (see [`note_in_use`](Regions::note_in_use)).
    held: AtomicUsize,
    /// The most bytes wanted at once: in use, misses included (see
    /// [`note_in_use`](Regions::note_in_use) and
    /// [`note_miss`](Regions::note_miss)).
    peak: AtomicUsize,
    /// The largest footprint a take found no free extent for since a
    /// grower last took the shortfall.
    largest_miss: AtomicUsize,
    /// The most wanted at once since the last tick took it (see
    /// [`Regions::take_demand_peak`]): unlike `peak`, never reset by an
    /// unlisting.
    demand_since_tick: AtomicUsize,
    /// A take missed, or the demand passed what the regions hold, since a
    /// grower last took the shortfall (see
    /// [`take_shortfall`](Regions::take_shortfall)): only then may the
    /// regions grow.
    missed: AtomicBool,
    /// Growths begun and ended (see [`Regions::growth_begins`]), so that a
    /// flush can wait for those under way when it starts.
    growths_begun: AtomicU64,
    growths_ended: AtomicU64,
    /// Regions draining (the length of [`Regions::drains`]): while one
    /// is, no other is drained.
    draining: AtomicUsize,
    /// The most of `out` since the last tick took it (see
    /// [`Regions::take_out_peak`]).
    out_peak: AtomicUsize,
    /// The largest block carved since the last tick took it (see
    /// [`Regions::take_largest_carve`]).
    largest_carve: AtomicUsize,
}

/// A device's regions; see the module docs.
#[derive(Debug)]
pub(crate) struct Regions {
    list: Mutex<Vec<NonNull<Region>>>,
    /// Regions unlisted by [`drain_excess`](Self::drain_excess), and when:
    /// owned here until [`settle_drains`](Self::settle_drains) releases or
    /// lists them again. Locked after `list` when both are.
    drains: Mutex<Vec<(NonNull<Region>, Instant)>>,
    totals: Arc<Totals>,
    /// Held by the one cleaner worker growing the regions, so that workers
    /// short of memory at once register one region, not one each (the
    /// others do not wait for it: see [`try_growing`](Self::try_growing)).
    growth: Mutex<()>,
    node: Option<u32>,
}

// SAFETY: the list's pointers are to live boxed regions, which are `Sync`;
// it is only read or changed under its lock.
unsafe impl Send for Regions {}
// SAFETY: as above.
unsafe impl Sync for Regions {}

/// A growth under way (see [`Regions::growth_begins`]).
#[derive(Debug)]
pub(crate) struct GrowthUnderWay<'a>(&'a Regions);

impl Drop for GrowthUnderWay<'_> {
    fn drop(&mut self) {
        // Release: publishes the growth's listing to a flush's Acquire
        // load in `wait_for_growths`.
        self.0.totals.growths_ended.fetch_add(1, Ordering::Release);
    }
}

/// What a device's regions hold (statistics).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RegionFigures {
    pub(crate) regions: usize,
    pub(crate) bytes: usize,
    pub(crate) free: usize,
    pub(crate) largest_free: usize,
}

impl Regions {
    /// No regions yet, on NUMA `node` when mapped.
    pub(crate) fn new(node: Option<u32>) -> Self {
        Self {
            list: Mutex::new(Vec::new()),
            drains: Mutex::new(Vec::new()),
            totals: Arc::new(Totals::default()),
            growth: Mutex::new(()),
            node,
        }
    }

    /// The right to grow the regions: one grower at a time.
    pub(crate) fn growing(&self) -> MutexGuard<'_, ()> {
        self.growth.lock()
    }

    /// The right to grow the regions if no other grower holds it: `None`
    /// while one does (a growth maps, pre-faults and registers, for
    /// milliseconds; a cleaner worker that waited for it would stop
    /// recycling meanwhile). A miss noted while it runs is not lost: the
    /// grower took the misses noted before its growth, and later ones make
    /// the regions fall short again (see [`take_shortfall`](Self::take_shortfall)).
    /// A returned miss that finds it held is parked until it is not (see
    /// `Cleaner::carve_for`).
    pub(crate) fn try_growing(&self) -> Option<MutexGuard<'_, ()>> {
        self.growth.try_lock()
    }

    /// Counts a growth begun (one `Cleaner::grow`: the mappings,
    /// pre-faults and registrations it tries, none if the budget refuses
    /// it); the guard returned counts it ended when dropped, panics
    /// included.
    pub(crate) fn growth_begins(&self) -> GrowthUnderWay<'_> {
        // Relaxed: a count; the flush that reads it orders itself by the
        // ended count below.
        self.totals.growths_begun.fetch_add(1, Ordering::Relaxed);
        GrowthUnderWay(self)
    }

    /// Growths begun so far.
    pub(crate) fn growths_begun(&self) -> u64 {
        // Relaxed: a flush reads it at its start, after the drops it waits
        // for. A growth whose admission made the intake free one of them
        // was counted begun before it claimed, and the drop's Acquire read
        // of the claim (`Counters::fits_pinned`) orders this read after
        // that count; a flush on another thread is ordered after the drop
        // by whatever made the drop come before the call.
        self.totals.growths_begun.load(Ordering::Relaxed)
    }

    /// Waits until `begun` growths (as [`growths_begun`](Self::growths_begun)
    /// read them) have ended: a flush returns once the growths under way at
    /// its start, which may be meeting the demand of misses dropped before
    /// it (freed at the intake while the growth's admission held the pinned
    /// budget), have ended (registered, or failed, or been refused), however
    /// long their registrations take. A set's growths run one at
    /// a time (each under [`growing`](Self::growing) or
    /// [`try_growing`](Self::try_growing)), so they end in the order they
    /// began: as many ended as had begun means those have.
    pub(crate) fn wait_for_growths(&self, begun: u64) {
        let mut round = 0u32;
        // Acquire pairs with the Release in `GrowthUnderWay::drop`: the
        // regions those growths listed are visible once counted.
        while self.totals.growths_ended.load(Ordering::Acquire) < begun {
            if cfg!(pinpool_loom) || round < 64 {
                crate::sync::spin(round);
            } else {
                std::thread::sleep(Tune::FLUSH_POLL);
            }
            round = round.saturating_add(1);
        }
    }

    /// Whether a grower holds [`growing`](Self::growing) now (it may let go
    /// at once: a hint for whoever waits for it without blocking).
    pub(crate) fn growth_running(&self) -> bool {
        self.growth.try_lock().is_none()
    }

    /// The length of the next region, for `want` bytes of which at least
    /// `least` (a buffer that must fit whole): at least
    /// [`REGION_MIN`](Tuning::REGION_MIN), at most
    /// [`REGION_MAX`](Tuning::REGION_MAX) unless `least` alone is more, in
    /// huge pages once it is one or more, and never less than `least`.
    pub(crate) fn next_len(&self, want: usize, least: usize) -> usize {
        self.fit_len(want.clamp(Tune::REGION_MIN, Tune::REGION_MAX).max(least))
    }

    /// Notes a take that found no memory (a pool miss), or one that carved
    /// while misses were out, with `demand` bytes of this set's buffers
    /// held now, the take's own included (counted as the provisioning tick
    /// counts them, at the take: see `provision::demand_from`): the demand
    /// the regions should have met. Counted at the take, not at the last
    /// tick, so that a burst of takes held for less than a tick still
    /// counts whole.
    ///
    /// `len` is the footprint the take found no free extent for (0 for a
    /// take that carved): the next growth makes room for it in one extent,
    /// even if the regions hold enough bytes in smaller ones.
    pub(crate) fn note_miss(&self, demand: usize, len: usize) {
        // Relaxed: see `Totals`.
        self.raise_peak(demand);
        self.totals.largest_miss.fetch_max(len, Ordering::Relaxed);
        self.totals.missed.store(true, Ordering::Relaxed);
    }

    /// Notes `in_use` bytes of buffers of this set taken and not dropped
    /// (hits and misses alike), `missed` bytes of them misses, as the
    /// provisioning tick counts them. That is the demand: memory carved
    /// but idle, or dropped and still in the cleaner, is not (so a cleaner
    /// that falls behind does not make the regions grow). Once the demand,
    /// with an eighth as headroom, passes what the regions hold, they fall
    /// short *ahead* of any miss: growth follows a working set that creeps
    /// up before its takes find nothing.
    pub(crate) fn note_in_use(&self, in_use: usize, missed: usize) {
        // Relaxed: see `Totals`.
        let bytes = self.totals.bytes.load(Ordering::Relaxed);
        self.totals
            .held
            .store(in_use.saturating_sub(missed), Ordering::Relaxed);
        self.raise_peak(in_use);
        if in_use + in_use / 8 > bytes {
            self.totals.missed.store(true, Ordering::Relaxed);
        }
    }

    /// Raises the most wanted at once to `demand`, noting when it rose.
    fn raise_peak(&self, demand: usize) {
        // Relaxed: see `Totals`.
        self.totals
            .demand_since_tick
            .fetch_max(demand, Ordering::Relaxed);
        if self.totals.peak.fetch_max(demand, Ordering::Relaxed) < demand {
            let now = since_epoch();
            let last = self.totals.peak_rose.swap(now, Ordering::Relaxed);
            if now.saturating_sub(last) >= Tune::GROWTH_SETTLE.as_nanos() as u64 {
                self.totals.rising_since.store(now, Ordering::Relaxed);
            }
        }
    }

    /// Whether the most wanted at once rose within the last
    /// [`GROWTH_SETTLE`](Tuning::GROWTH_SETTLE), in a run of rises that
    /// began less than [`GROWTH_SETTLE_MAX`](Tuning::GROWTH_SETTLE_MAX)
    /// ago: its demand is still arriving (a burst of takes under way), and
    /// a growth sized now would soon be followed by another. The sweep
    /// waits for the burst to end; a demand that keeps rising for longer
    /// grows as it rises. Rises `GROWTH_SETTLE` or more apart each
    /// begin a run of their own: such a demand is settled only between
    /// them (the sweep may miss those windows; a returned miss waits
    /// `GROWTH_SETTLE_MAX` at most, see `Cleaner::carve_for`).
    pub(crate) fn rising(&self) -> bool {
        // Relaxed: see `Totals`; a stale time delays a growth by one
        // settling time at most, or lets one run a little early.
        let rose = self.totals.peak_rose.load(Ordering::Relaxed);
        let since = self.totals.rising_since.load(Ordering::Relaxed);
        let now = since_epoch();
        rose != 0
            && now.saturating_sub(rose) < Tune::GROWTH_SETTLE.as_nanos() as u64
            && now.saturating_sub(since) < Tune::GROWTH_SETTLE_MAX.as_nanos() as u64
    }

    /// Whether a growth is due but should wait: a take missed (or the
    /// demand passed what the regions hold) since they last grew, and the
    /// demand is still [`rising`](Self::rising). A returned miss then waits
    /// (see `Cleaner::carve_for`), so that the burst grows the regions once
    /// it settles, for all of it; one with no growth due carves at once.
    pub(crate) fn growth_waits(&self) -> bool {
        // Relaxed: see `Totals`; a stale flag lets one miss grow a little
        // early, or wait one settling time for nothing.
        self.totals.missed.load(Ordering::Relaxed) && self.rising()
    }

    /// What the regions fall short of: the most wanted at once plus an
    /// eighth of it as headroom (so that a workload whose peak creeps up
    /// does not register a region at every new peak), and room for the
    /// largest footprint a take found no extent for, unless a free extent
    /// holds it now; nothing if no take missed (nor demand passed what
    /// they hold) since they last grew. As
    /// [`take_shortfall`](Self::take_shortfall) counts it, leaving it to
    /// be taken.
    pub(crate) fn shortfall(&self) -> Shortfall {
        // Relaxed: see `Totals`.
        if !self.totals.missed.load(Ordering::Relaxed) {
            return Shortfall::default();
        }
        let len = self.totals.largest_miss.load(Ordering::Relaxed);
        self.with_extent(self.short_of_peak(), len)
    }

    /// As [`shortfall`](Self::shortfall), for the grower (who holds
    /// [`growing`](Self::growing)): the misses noted so far count as met
    /// by what it grows, and one noted from now on makes the regions fall
    /// short again, even while this growth runs. A grower that fails gives
    /// them back with [`unmet`](Self::unmet).
    pub(crate) fn take_shortfall(&self) -> Shortfall {
        // Relaxed: see `Totals`. A note racing the swap either sets the
        // flag again, or is taken with it, its peak possibly read stale:
        // a growth a little short, which the next miss corrects.
        if !self.totals.missed.swap(false, Ordering::Relaxed) {
            return Shortfall::default();
        }
        let len = self.totals.largest_miss.swap(0, Ordering::Relaxed);
        self.with_extent(self.short_of_peak(), len)
    }

    /// `short`, and room for a buffer of `len` bytes that a take found no
    /// free extent for: a miss for want of one extent large enough, not of
    /// bytes, makes the growth at least a region that holds it (the bytes
    /// free in smaller extents cannot serve it, however many they are),
    /// unless a free extent holds it now.
    fn with_extent(&self, mut short: Shortfall, len: usize) -> Shortfall {
        if len > short.need && len > self.figures().largest_free {
            if short.need == 0 {
                short.merge = len;
            }
            short.want = short.want.max(len);
            short.need = len;
        }
        if short.want > 0 {
            short.whole = len;
        }
        short
    }

    /// The misses a failed growth took count as unmet again.
    pub(crate) fn unmet(&self) {
        // Relaxed: see `Totals`.
        self.totals.missed.store(true, Ordering::Relaxed);
    }

    /// As [`unmet`](Self::unmet), for a shortfall whose buffer that no
    /// extent held (`short.merge`) counts again too.
    pub(crate) fn unmet_merge(&self, short: Shortfall) {
        // Relaxed: see `Totals`.
        self.totals
            .largest_miss
            .fetch_max(short.merge, Ordering::Relaxed);
        self.unmet();
    }

    /// What the regions fall short of the peak plus its headroom; at least
    /// an eighth of what they hold once they fall short at all, so that a
    /// demand creeping up registers a few growing regions, not one small
    /// one per step. Nothing while they hold the peak and at least half its
    /// headroom: growing by an eighth of what they hold to restore the last
    /// sixteenth of the peak would pin up to a quarter more than the
    /// demand at once.
    fn short_of_peak(&self) -> Shortfall {
        // Relaxed: see `Totals`.
        let peak = self.totals.peak.load(Ordering::Relaxed);
        let bytes = self.totals.bytes.load(Ordering::Relaxed);
        match (peak + peak / 8).saturating_sub(bytes) {
            0 => Shortfall::default(),
            // The peak held, and half its headroom or more: a growth now
            // would add an eighth of the regions for a sixteenth at most.
            short if bytes >= peak && short <= peak / 16 => Shortfall::default(),
            short => Shortfall {
                want: short.max(bytes / 8),
                need: peak.saturating_sub(bytes),
                merge: 0,
                whole: 0,
            },
        }
    }

    /// Forgets the most wanted at once, down to what takes held at the
    /// last tick (when regions are unlisted).
    fn reset_peak(&self) {
        // Relaxed: see `Totals`.
        let held = self.totals.held.load(Ordering::Relaxed);
        self.totals.peak.store(held, Ordering::Relaxed);
    }

    /// The bytes of the listed regions.
    pub(crate) fn listed_bytes(&self) -> usize {
        // Relaxed: see `Totals`; a stale figure cuts a growth at a given
        // cap a little early or late, which the cap's release corrects.
        self.totals.bytes.load(Ordering::Relaxed)
    }

    /// The most bytes of whole pages (huge pages from one up) within
    /// `bytes`: [`fit_len`](Self::fit_len) rounding down.
    pub(crate) fn fit_len_within(&self, bytes: usize) -> usize {
        let huge = huge_page_size();
        let page = crate::size_class::page_size();
        if bytes >= huge {
            bytes - bytes % huge
        } else {
            bytes - bytes % page
        }
    }

    /// `bytes` rounded up to whole pages, or to huge pages from one up.
    pub(crate) fn fit_len(&self, bytes: usize) -> usize {
        let huge = huge_page_size();
        if bytes >= huge {
            bytes.next_multiple_of(huge)
        } else {
            bytes.next_multiple_of(crate::size_class::page_size())
        }
    }

    /// Carves `len` bytes (a page multiple) from the smallest free extent
    /// that holds them, in any listed region, at its top if `len` is below
    /// [`TOP_CARVE_BELOW`](Tuning::TOP_CARVE_BELOW), else at its bottom;
    /// `None` if no extent holds them.
    pub(crate) fn carve(&self, len: usize) -> Option<Carved> {
        let list = self.list.lock();
        let mut best: Option<(usize, NonNull<Region>)> = None;
        for &region in list.iter() {
            // SAFETY: listed regions are live.
            let state = unsafe { region.as_ref() }.state.lock();
            if let Some((fit, _)) = state.best_fit(len) {
                if best.is_none_or(|(b, _)| fit < b) {
                    best = Some((fit, region));
                }
            }
        }
        let (_, region) = best?;
        // SAFETY: as above; the list lock is still held, so nobody else
        // carves, and give-backs only grow extents: the fit is still there.
        let this = unsafe { region.as_ref() };
        let mut state = this.state.lock();
        let (fit, offset) = state
            .best_fit(len)
            .expect("extents only grow under the list lock");
        state.remove(offset, fit);
        let offset = if len < Tune::TOP_CARVE_BELOW {
            if fit > len {
                state.insert(offset, fit - len);
            }
            offset + fit - len
        } else {
            if fit > len {
                state.insert(offset + len, fit - len);
            }
            offset
        };
        state.free -= len;
        state.out += 1;
        state.idle_since = None;
        // Relaxed: see `Totals`. (The peak follows what takes hold, not
        // this: what is carved out includes idle buffers and buffers in
        // the cleaner, which are not demand.)
        let out = self.totals.out.fetch_add(len, Ordering::Relaxed) + len;
        self.totals.out_peak.fetch_max(out, Ordering::Relaxed);
        self.totals.largest_carve.fetch_max(len, Ordering::Relaxed);
        let pinned = state.registered;
        drop(state);
        drop(list);
        // SAFETY: `offset + len <= this.len`, inside the mapping.
        let ptr = unsafe { NonNull::new_unchecked(this.base().add(offset)) };
        Some(Carved {
            region,
            ptr,
            pinned,
        })
    }

    /// Maps a region of `len` bytes plus the wholly free regions of the
    /// lengths `fold` names (see [`fold_plan`](Self::fold_plan)), each free
    /// for `fold.idle` or longer (see [`Fold`]), registers
    /// it through `register` (if given), lists it, wholly free, and returns
    /// its length. With `len` 0 it only merges the regions `fold` names
    /// (see [`merge_plan`](Self::merge_plan)), those still wholly free and
    /// unregistered; 0 if none was (nothing registered then).
    ///
    /// What the growth adds is pre-faulted first, with the regions to fold
    /// still listed (and carved from, meanwhile, by any take). Then they
    /// are unlisted, given to `unregister` (which hands back those it
    /// unregistered, and leaks the others), and their pages moved into the
    /// new mapping, after what the growth adds, rather than faulted in
    /// again: the pinned bytes never hold them twice, and takes miss their
    /// memory only for an unregistration, a move and a registration. The
    /// place of a region carved from meanwhile is unmapped before the
    /// registration. On a registration failure what the growth added is
    /// freed, and the pages moved in are registered again as a region of
    /// their own (see [`GrowFailed::kept`]), else freed too.
    pub(crate) fn grow(
        &self,
        len: usize,
        fold: impl Into<Fold>,
        unregister: &mut dyn FnMut(Unlisted) -> Option<Unlisted>,
        register: Option<&mut dyn FnMut(*mut u8, usize) -> Result<(), Error>>,
    ) -> Result<usize, GrowFailed> {
        let fold = fold.into();
        let planned = len + fold.lens.iter().sum::<usize>();
        let mapped = if planned >= huge_page_size() {
            map_huge(planned)
        } else {
            map(planned)
        };
        let ptr = mapped.map_err(|error| GrowFailed { error, kept: None })?;
        if let Some(node) = self.node {
            if let Err(error) = crate::numa::bind_range(ptr.as_ptr(), planned, node) {
                tracing::debug!(node, %error, "pinpool: a region could not be bound to its NUMA node");
            }
        }
        if register.is_some() {
            prefault(ptr.as_ptr(), len);
        }
        let unregistered = self
            .unlist_folded(fold)
            .into_iter()
            .filter_map(&mut *unregister)
            .collect();
        // SAFETY: `len <= planned`: inside the mapping.
        let tail = unsafe { ptr.as_ptr().add(len) };
        let (placed, unmoved) = move_into(tail, planned - len, unregistered);
        let total = len + placed;
        if register.is_some() {
            for (offset, n) in unmoved {
                // SAFETY: `offset + n <= placed`: inside the mapping.
                prefault(unsafe { tail.add(offset) }, n);
            }
        }
        if total < planned {
            // SAFETY: the unused end of the fresh mapping, which nothing
            // holds.
            unsafe { libc::munmap(ptr.as_ptr().add(total).cast(), planned - total) };
        }
        if total == 0 {
            // A merge (`len` 0) whose regions were all carved from since
            // its plan: nothing moved, nothing to register.
            return Ok(0);
        }
        let registered = match register {
            Some(register) => {
                // A registration that panics (a backend's bug) unwinds
                // past the code below: the mapping goes with it.
                let whole = UnmapOnUnwind(ptr.as_ptr(), total);
                let registration = register(ptr.as_ptr(), total);
                std::mem::forget(whole);
                if let Err(error) = registration {
                    // SAFETY: the part the growth added, just mapped,
                    // unregistered, nothing carved from it.
                    unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
                    let folded = UnmapOnUnwind(tail, placed);
                    let kept = placed > 0 && self.keep_folded(tail, placed, register);
                    std::mem::forget(folded);
                    if !kept && placed > 0 {
                        // SAFETY: as above, for the folded part.
                        unsafe { libc::munmap(tail.cast(), placed) };
                    }
                    return Err(GrowFailed {
                        error,
                        kept: kept.then_some(placed),
                    });
                }
                true
            }
            None => false,
        };
        self.list_new(ptr, total, registered);
        Ok(total)
    }

    /// After a growth that folded regions failed to register: registers
    /// the folded part (`len` bytes at `at`, the regions' own memory) as
    /// a region of its own, so that the set keeps what it had; whether it
    /// registered (else the caller frees it).
    fn keep_folded(
        &self,
        at: *mut u8,
        len: usize,
        register: &mut dyn FnMut(*mut u8, usize) -> Result<(), Error>,
    ) -> bool {
        if register(at, len).is_err() {
            return false;
        }
        // Inside the mapping: not null.
        let at = NonNull::new(at).expect("a mapped address");
        self.list_new(at, len, true);
        true
    }

    /// Lists a fresh region over the `len` bytes at `ptr`, wholly free.
    fn list_new(&self, ptr: NonNull<u8>, len: usize, registered: bool) {
        let mut extents = Extents {
            by_offset: BTreeMap::new(),
            by_size: BTreeSet::new(),
            free: len,
            out: 0,
            listed: true,
            registered,
            leaked: false,
            draining: false,
            undrainable: false,
            idle_since: Some(Instant::now()),
        };
        extents.insert(0, len);
        // Relaxed: a number to tell regions apart, publishing nothing.
        let serial = REGION_SERIALS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let region = Box::new(Region {
            base: ptr,
            len,
            serial,
            listed_at: Instant::now(),
            state: Mutex::new(extents),
            drains: AtomicBool::new(false),
            totals: Arc::clone(&self.totals),
            _track: Track::new(),
        });
        self.list.lock().push(NonNull::from(Box::leak(region)));
        // Relaxed: see `Totals`.
        self.totals.bytes.fetch_add(len, Ordering::Relaxed);
    }

    /// Unlists the regions that nothing is carved from and that `pick`
    /// chooses (given each one's length and how long it has been wholly
    /// free), for the caller to unregister and free; with `all`, unlists
    /// every other region too, each to be released by the give-back of its
    /// last block.
    pub(crate) fn unlist_idle(
        &self,
        pick: impl FnMut(usize, Duration) -> bool,
        all: bool,
    ) -> Vec<Unlisted> {
        let (out, unlisted) = self.unlist(pick, all);
        if unlisted {
            // Demand from before counts no more once regions go: what is
            // carved now is what the rest must hold, not the peak the
            // unlisted ones met (else the next tick would grow them back).
            self.reset_peak();
        }
        out
    }

    /// Unlists wholly free regions that `eligible` accepts (given how long
    /// each has been wholly free and how long it has been listed), of
    /// `bytes` or more in all if they hold that much, choosing the fewest
    /// bytes that do (of sets of equal bytes, the one whose largest region
    /// is smallest: the largest regions, which hold the largest buffers, go
    /// last), among the 16 smallest of them; past 16, or if those fall
    /// short, the smallest first. All of them if they hold less. Chosen
    /// and unlisted under one hold of the list lock: carves take it, and
    /// give-backs only free, so those chosen are still wholly free. For
    /// the caller to unregister and free; the demand peak falls as with
    /// [`unlist_idle`](Self::unlist_idle).
    pub(crate) fn unlist_to_cover(
        &self,
        bytes: usize,
        mut eligible: impl FnMut(Duration, Duration) -> bool,
    ) -> Vec<Unlisted> {
        if bytes == 0 {
            return Vec::new();
        }
        let now = Instant::now();
        let mut list = self.list.lock();
        // (length, index in the list) of the eligible ones.
        let mut free: Vec<(usize, usize)> = Vec::new();
        for (i, &region) in list.iter().enumerate() {
            // SAFETY: listed regions are live.
            let this = unsafe { region.as_ref() };
            let state = this.state.lock();
            if this
                .free_times(&state, now)
                .is_some_and(|(idle, age)| eligible(idle, age))
            {
                free.push((this.len, i));
            }
        }
        free.sort_unstable();
        let lens: Vec<usize> = free.iter().map(|&(len, _)| len).collect();
        let mut chosen: Vec<usize> = cover(&lens, bytes).into_iter().map(|k| free[k].1).collect();
        // Removed from the back, so the indices still left stay valid.
        chosen.sort_unstable_by(|a, b| b.cmp(a));
        let mut out = Vec::with_capacity(chosen.len());
        for i in chosen {
            let region = list.remove(i);
            // SAFETY: it was listed until now, under the list lock: live.
            let this = unsafe { region.as_ref() };
            self.take_off(this, &mut this.state.lock());
            out.push(Unlisted(region));
        }
        drop(list);
        if !out.is_empty() {
            // As in `unlist_idle`: what the rest must hold is what is
            // carved now.
            self.reset_peak();
        }
        out
    }

    /// The wholly free listed regions, for a choice among several sets
    /// (see [`cover`] and [`unlist_chosen`](Self::unlist_chosen)): each
    /// one's length, its key, and whether `eligible` accepts it (given how
    /// long it has been wholly free and how long it has been listed).
    pub(crate) fn free_regions(
        &self,
        mut eligible: impl FnMut(Duration, Duration) -> bool,
    ) -> Vec<FreeRegion> {
        let now = Instant::now();
        let list = self.list.lock();
        let mut free = Vec::new();
        for &region in list.iter() {
            // SAFETY: listed regions are live.
            let this = unsafe { region.as_ref() };
            let state = this.state.lock();
            if let Some((idle, age)) = this.free_times(&state, now) {
                free.push(FreeRegion {
                    len: this.len,
                    key: this.serial,
                    eligible: eligible(idle, age),
                });
            }
        }
        free
    }

    /// The bytes of the listed regions wholly free for `idle` or longer.
    pub(crate) fn idle_bytes(&self, idle: Duration) -> usize {
        self.idle_lens(idle).iter().sum()
    }

    /// The lengths of the listed regions wholly free for `idle` or longer.
    fn idle_lens(&self, idle: Duration) -> Vec<usize> {
        self.free_regions(|free, _| free >= idle)
            .into_iter()
            .filter(|region| region.eligible)
            .map(|region| region.len)
            .collect()
    }

    /// Listed regions wholly free for `idle` or longer, the largest first,
    /// until they hold `bytes` together (all of them if they hold less),
    /// within [`REGION_MAX`](Tuning::REGION_MAX): a plan for
    /// [`grow`](Self::grow) to fold (regions free as long), so that a
    /// growth the pinned budget refuses whole adds only what they leave of
    /// `bytes`.
    pub(crate) fn idle_cover(&self, bytes: usize, idle: Duration) -> Fold {
        let mut lens = self.idle_lens(idle);
        lens.sort_unstable_by(|a, b| b.cmp(a));
        let mut plan = Vec::new();
        let mut total = 0;
        for len in lens {
            if total >= bytes {
                break;
            }
            if total + len <= Tune::REGION_MAX {
                total += len;
                plan.push(len);
            }
        }
        Fold { lens: plan, idle }
    }

    /// Unlists the regions of `keys` (from [`free_regions`](Self::free_regions))
    /// that are still listed, wholly free and accepted by `eligible`, for
    /// the caller to unregister and free; the demand peak falls as with
    /// [`unlist_idle`](Self::unlist_idle). One carved from since it was
    /// listed by `free_regions` stays.
    pub(crate) fn unlist_chosen(
        &self,
        keys: &[u64],
        mut eligible: impl FnMut(Duration, Duration) -> bool,
    ) -> Vec<Unlisted> {
        let now = Instant::now();
        let mut list = self.list.lock();
        let mut out = Vec::new();
        let mut i = 0;
        while i < list.len() {
            let region = list[i];
            // SAFETY: listed regions are live.
            let this = unsafe { region.as_ref() };
            let mut state = this.state.lock();
            let chosen = keys.contains(&this.serial)
                && this
                    .free_times(&state, now)
                    .is_some_and(|(idle, age)| eligible(idle, age));
            if chosen {
                list.remove(i);
                self.take_off(this, &mut state);
                drop(state);
                out.push(Unlisted(region));
            } else {
                i += 1;
            }
        }
        drop(list);
        if !out.is_empty() {
            // As in `unlist_idle`.
            self.reset_peak();
        }
        out
    }

    /// Drains a region of a set that holds far more than its takes wanted:
    /// if the listed regions hold more than half as much again as
    /// `wanted.bytes` (the most bytes of this set's buffers in use, or
    /// carved, at once over the idle-trim `window`), plus
    /// [`REGION_MIN`](Tuning::REGION_MIN), the one of them listed a
    /// `window` ago or more with the most bytes free is unlisted, of those
    /// worth draining: what grows again for the demand once it is gone
    /// (what the rest fall short of it and an eighth) is at least
    /// `REGION_MIN` less than it, and the rest have a free extent for
    /// `wanted.largest` (the largest block carved, or held at a tick,
    /// over the window) unless it alone holds more than half as much
    /// again as the demand, plus `REGION_MIN`. Takes carve from it no
    /// more, and its buffers go back to it as they are
    /// dropped (idle ones in their classes are given back: see
    /// `cleaner::cool` and `Admission::trim`); meanwhile the demand they
    /// held is met by growing the rest again
    /// (the bytes it held count no more, and the peak falls to what takes
    /// hold now), by one right-sized region. Returned, for the caller to
    /// release, if nothing was carved from it; else the set holds it until
    /// [`settle_drains`](Self::settle_drains) releases it, or lists it
    /// again. A region with a leaked block, or whose drain was given up
    /// and that has not been wholly free since, is not drained.
    ///
    /// A workload that shrinks keeps some buffers carved from each of its
    /// large regions (those in use, those idle in their classes), so they
    /// would never be wholly free for the idle trim: this gives their
    /// memory back. So it does for a region wholly free at most ticks that
    /// takes carve from now and then (a small workload spilling past the
    /// regions it fills), which is never idle for the whole idle-trim
    /// time either. One region drains at a time. `None` if none was
    /// drained.
    pub(crate) fn drain_excess(&self, wanted: Demand, window: Duration) -> Option<Drained> {
        let demand = wanted.bytes;
        let now = Instant::now();
        let mut list = self.list.lock();
        let mut drains = self.drains.lock();
        if !drains.is_empty() {
            return None;
        }
        let mut listed = 0;
        let mut candidates = Vec::new();
        // The two largest free extents, and in which region the largest.
        let mut extents = (0, 0, usize::MAX);
        for (i, &region) in list.iter().enumerate() {
            // SAFETY: listed regions are live.
            let this = unsafe { region.as_ref() };
            let state = this.state.lock();
            listed += this.len;
            let largest = state.largest();
            if largest > extents.0 {
                extents = (largest, extents.0, i);
            } else if largest > extents.1 {
                extents.1 = largest;
            }
            // A region younger than the window was grown for a demand the
            // window holds, or one still rising: not one that shrank. One
            // with a leaked block, or whose drain was given up (and that
            // has not been wholly free since), would not drain in time.
            let old = now.saturating_duration_since(this.listed_at) >= window;
            if old && !state.leaked && !state.undrainable {
                candidates.push((state.free, this.len, i));
            }
        }
        let excess = demand + demand / 2 + Tune::REGION_MIN;
        if listed <= excess {
            return None;
        }
        // Only a region worth draining: what grows again for the demand
        // once it is gone (the bytes the rest fall short of the demand and
        // the eighth a growth adds) is less than it by a smallest region
        // at least, and the rest have an extent for the largest block
        // carved, or held at a tick, over the window, unless it alone
        // holds far more than the
        // demand (so what grows again for that block is much less). Else a
        // set whose excess lies in regions that cannot drain, or in
        // extents too small for its largest buffers, would drain the region
        // its demand needs, and grow it again, window after window.
        let worth = |&(_, len, i): &(usize, usize, usize)| {
            let regrown = (demand + demand / 8).saturating_sub(listed - len);
            let rest_extent = if i == extents.2 { extents.1 } else { extents.0 };
            regrown + Tune::REGION_MIN <= len && (rest_extent >= wanted.largest || len > excess)
        };
        let (_, _, i) = candidates
            .into_iter()
            .filter(worth)
            .max_by_key(|&(free, ..)| free)?;
        let region = list.remove(i);
        // SAFETY: it was listed until now, under the list lock: live.
        let this = unsafe { region.as_ref() };
        let mut state = this.state.lock();
        self.take_off(this, &mut state);
        let drained = if state.out == 0 {
            // Wholly free (when looked at, or its last block came back
            // since): released at once. No carve can have picked it since
            // the look, the list lock being held.
            Drained::Free(Unlisted(region))
        } else {
            this.set_draining(&mut state, true);
            drains.push((region, now));
            // Relaxed: a hint (see `draining`); `drains` is the truth.
            self.totals.draining.store(drains.len(), Ordering::Relaxed);
            Drained::WithBlocksOut
        };
        tracing::debug!(
            bytes = this.len,
            free = state.free,
            listed,
            demand,
            largest = wanted.largest,
            "pinpool: draining a region that holds more than the demand"
        );
        drop(state);
        drop(drains);
        drop(list);
        self.reset_peak();
        Some(drained)
    }

    /// Ends the drains that can end: hands over, for the caller to
    /// release, the drained regions whose last block came back; lists
    /// again, not to be drained until they have been wholly free, those
    /// that have drained for `limit` or
    /// longer with blocks still out (a buffer held for good, a reserved
    /// one idle in its class, a leaked one), so that the set does not grow
    /// more for the demand while their memory stays pinned and idle.
    pub(crate) fn settle_drains(&self, limit: Duration) -> Vec<Unlisted> {
        // Relaxed: see `draining`; a drain begun meanwhile is settled at
        // the next tick.
        if self.totals.draining.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        let now = Instant::now();
        let mut list = self.list.lock();
        let mut drains = self.drains.lock();
        let mut released = Vec::new();
        drains.retain(|&(region, since)| {
            // SAFETY: a draining region is owned by `drains` until it
            // leaves it here (or at `unlist(all)` or the set's drop).
            let this = unsafe { region.as_ref() };
            let mut state = this.state.lock();
            if state.out == 0 {
                this.set_draining(&mut state, false);
                released.push(Unlisted(region));
                return false;
            }
            if now.saturating_duration_since(since) < limit {
                return true;
            }
            this.set_draining(&mut state, false);
            state.undrainable = true;
            state.listed = true;
            // Relaxed: see `Totals`.
            self.totals.bytes.fetch_add(this.len, Ordering::Relaxed);
            self.totals
                .out
                .fetch_add(this.len - state.free, Ordering::Relaxed);
            list.push(region);
            tracing::debug!(
                bytes = this.len,
                blocks = state.out,
                "pinpool: a region did not drain in time; it is carved from again"
            );
            false
        });
        self.totals.draining.store(drains.len(), Ordering::Relaxed);
        released
    }

    /// The most bytes carved from the listed regions at once since the
    /// last call (buffers in use, idle in their classes, or in the
    /// cleaner), counted at each carve: the provisioning tick keeps it in
    /// the window that [`drain_excess`](Self::drain_excess) is given, so
    /// that a demand held between two ticks counts too.
    pub(crate) fn take_out_peak(&self) -> usize {
        // Relaxed: see `Totals`; a carve racing the swap counts in this
        // peak or the next.
        let now = self.totals.out.load(Ordering::Relaxed);
        self.totals.out_peak.swap(now, Ordering::Relaxed).max(now)
    }

    /// The largest block carved since the last call (the provisioning
    /// tick keeps it in the window that
    /// [`drain_excess`](Self::drain_excess) is given).
    pub(crate) fn take_largest_carve(&self) -> usize {
        // Relaxed: see `Totals`; a carve racing the swap counts in this
        // figure or the next.
        self.totals.largest_carve.swap(0, Ordering::Relaxed)
    }

    /// The most bytes of this set's buffers wanted at once since the last
    /// call: in use, misses included, as noted at each miss (and at a
    /// carve while misses are out) and at each tick (see
    /// [`note_miss`](Self::note_miss) and
    /// [`note_in_use`](Self::note_in_use)). The provisioning tick keeps
    /// it in the window the cap that follows the working set follows, and
    /// in the device's window for draining (with
    /// [`take_out_peak`](Self::take_out_peak)), so that a burst of takes
    /// held between two ticks counts whole.
    pub(crate) fn take_demand_peak(&self) -> usize {
        // Relaxed: see `Totals`; a note racing the swap counts in this
        // peak or the next.
        self.totals.demand_since_tick.swap(0, Ordering::Relaxed)
    }

    /// Whether a region drains (see [`drain_excess`](Self::drain_excess)).
    pub(crate) fn draining(&self) -> bool {
        // Relaxed: see `Totals`; a stale answer gives a drained region's
        // idle buffers back a tick later, or looks for them for nothing.
        self.totals.draining.load(Ordering::Relaxed) > 0
    }

    /// The lengths of the wholly free regions a growth of `len` bytes
    /// folds into the region it registers (see [`grow`](Self::grow)), so
    /// that a set's memory gathers in a few large regions, whose free
    /// extents can hold its largest buffers, instead of scattering over one
    /// region per growth: smallest first, each no larger than the new
    /// region has grown so far (so that a large region is not registered
    /// again to add a little to it: region sizes grow geometrically),
    /// within [`REGION_MAX`](Tuning::REGION_MAX).
    pub(crate) fn fold_plan(&self, len: usize) -> Vec<usize> {
        let mut lens = Vec::new();
        {
            let list = self.list.lock();
            for &region in list.iter() {
                // SAFETY: listed regions are live.
                let this = unsafe { region.as_ref() };
                if this.state.lock().out == 0 {
                    lens.push(this.len);
                }
            }
        }
        lens.sort_unstable();
        let mut total = len;
        let mut fold = Vec::new();
        for l in lens {
            if l > total || total + l > Tune::REGION_MAX {
                break;
            }
            total += l;
            fold.push(l);
        }
        fold
    }

    /// The lengths of wholly free regions that, moved together (a growth
    /// of 0 bytes that folds them: see [`grow`](Self::grow)), make one
    /// extent of at least `len` bytes: of the sets of them that do, the one
    /// with the fewest bytes (so the fewest to unregister and register
    /// again), within [`REGION_MAX`](Tuning::REGION_MAX), looking at the
    /// 16 largest only, of those wholly free for `idle` or longer. `None`
    /// if those together hold less, or if one of them holds `len` alone
    /// (no merge needed).
    pub(crate) fn merge_plan(&self, len: usize, idle: Duration) -> Option<Fold> {
        let mut lens = self.idle_lens(idle);
        if lens.iter().any(|&l| l >= len) {
            return None;
        }
        // Past 16 of them, only the 16 largest are looked at.
        lens.sort_unstable();
        let lens = &lens[lens.len().saturating_sub(16)..];
        let set = fewest_covering(lens, len, Tune::REGION_MAX)?;
        Some(Fold {
            lens: set.into_iter().map(|i| lens[i]).collect(),
            idle,
        })
    }

    /// Unlists wholly free regions of the lengths `fold` names (one each),
    /// each free for `fold.idle` or longer, the demand peak left as it is
    /// (the new region holds their bytes again). A region carved from since
    /// the plan was made is not picked (only wholly free ones are offered);
    /// another of the same length, free as long, may go in its place.
    fn unlist_folded(&self, fold: Fold) -> Vec<Unlisted> {
        let Fold {
            lens: mut plan,
            idle,
        } = fold;
        let pick = |region_len: usize, free: Duration| {
            if free < idle {
                return false;
            }
            match plan.iter().position(|&l| l == region_len) {
                Some(i) => {
                    plan.swap_remove(i);
                    true
                }
                None => false,
            }
        };
        self.unlist(pick, false).0
    }

    /// Marks `this`, just removed from the list (whose lock the caller
    /// holds, with `state`, its extents' lock), as no longer listed, and
    /// takes its bytes out of the totals.
    fn take_off(&self, this: &Region, state: &mut Extents) {
        state.listed = false;
        // Relaxed: see `Totals`.
        self.totals.bytes.fetch_sub(this.len, Ordering::Relaxed);
        self.totals
            .out
            .fetch_sub(this.len - state.free, Ordering::Relaxed);
    }

    /// As [`unlist_idle`](Self::unlist_idle), the demand peak left as it
    /// is; also whether any region was unlisted (those with blocks out are
    /// not returned).
    fn unlist(
        &self,
        mut pick: impl FnMut(usize, Duration) -> bool,
        all: bool,
    ) -> (Vec<Unlisted>, bool) {
        let now = Instant::now();
        let mut list = self.list.lock();
        let mut out = Vec::new();
        let before = list.len();
        list.retain(|&region| {
            // SAFETY: listed regions are live.
            let this = unsafe { region.as_ref() };
            let mut state = this.state.lock();
            let idle = this.free_times(&state, now).map(|(idle, _)| idle);
            let unlist = match idle {
                Some(idle) => pick(this.len, idle) || all,
                None => all,
            };
            if !unlist {
                return true;
            }
            self.take_off(this, &mut state);
            if state.out == 0 {
                out.push(Unlisted(region));
            }
            false
        });
        let mut unlisted = list.len() < before;
        if all {
            // Drains end too: each region goes now, or with its last block.
            let mut drains = self.drains.lock();
            unlisted |= !drains.is_empty();
            for (region, _) in drains.drain(..) {
                // SAFETY: owned by `drains` until now.
                let this = unsafe { region.as_ref() };
                let mut state = this.state.lock();
                this.set_draining(&mut state, false);
                if state.out == 0 {
                    out.push(Unlisted(region));
                }
            }
            self.totals.draining.store(0, Ordering::Relaxed);
        }
        (out, unlisted)
    }

    /// The listed regions' figures.
    pub(crate) fn figures(&self) -> RegionFigures {
        let list = self.list.lock();
        let mut figures = RegionFigures::default();
        for &region in list.iter() {
            // SAFETY: listed regions are live.
            let this = unsafe { region.as_ref() };
            let state = this.state.lock();
            figures.regions += 1;
            figures.bytes += this.len;
            figures.free += state.free;
            figures.largest_free = figures.largest_free.max(state.largest());
        }
        figures
    }
}

impl Drop for Regions {
    fn drop(&mut self) {
        let drains = self.drains.get_mut().drain(..).map(|(region, _)| region);
        let list: Vec<_> = self.list.get_mut().drain(..).chain(drains).collect();
        for region in list {
            // SAFETY: listed regions are live; dropping the list owns them.
            let this = unsafe { region.as_ref() };
            let mut state = this.state.lock();
            if state.out > 0 {
                // Blocks still out keep it: freed by the last give-back.
                state.listed = false;
                this.set_draining(&mut state, false);
                continue;
            }
            drop(state);
            // Dropped with its pool: freed if the pool unregistered it,
            // else leaked, and said so.
            Unlisted(region).free();
        }
    }
}

/// Moves the pages of the regions `fold` into the `room` bytes of a fresh
/// mapping at `at`, one after another, largest first (so that those of
/// whole huge pages stay aligned to them), and returns how many bytes from
/// `at` they fill, with the places (offset from `at`, length) of the parts
/// the kernel would not move: those are left to the fresh mapping, zero
/// and not yet faulted in, and the regions' own pages there are freed.
fn move_into(at: *mut u8, room: usize, mut fold: Vec<Unlisted>) -> (usize, Vec<(usize, usize)>) {
    fold.sort_unstable_by_key(|r| std::cmp::Reverse(r.len()));
    let mut placed = 0;
    let mut unmoved = Vec::new();
    for region in fold {
        let (from, n) = (region.base(), region.len());
        debug_assert!(!region.registered());
        if placed + n > room {
            free_folded(region);
            continue;
        }
        // SAFETY: the region is unlisted with nothing carved from it,
        // unregistered, and its holder gives it up here: nobody uses its
        // pages; `[at + placed, at + placed + n)` lies in the fresh mapping,
        // which only this grower holds.
        let moved = unsafe { move_pages(from, n, at.wrapping_add(placed)) };
        if moved < n {
            unmoved.push((placed + moved, n - moved));
            // SAFETY: what is left of the region's own mapping, which
            // nobody uses.
            unsafe { libc::munmap(from.wrapping_add(moved).cast(), n - moved) };
        }
        region.forget_moved();
        placed += n;
    }
    (placed, unmoved)
}

/// Unmaps `.1` bytes at `.0` when dropped: armed around a call that may
/// panic while a fresh mapping no region lists yet is the caller's alone
/// (see [`Regions::grow`]), and forgotten once the call returns.
struct UnmapOnUnwind(*mut u8, usize);

impl Drop for UnmapOnUnwind {
    fn drop(&mut self) {
        if self.1 > 0 {
            // SAFETY: a mapping of at least these bytes that the caller
            // made and that nothing else holds (no region lists it, nothing
            // is carved from it); unwinding out of the caller, so nobody
            // uses it after this.
            unsafe { libc::munmap(self.0.cast(), self.1) };
        }
    }
}

/// Frees a region unlisted to be folded that was not moved after all.
fn free_folded(region: Unlisted) {
    region.free();
}

/// Touches every page of the `len` bytes at `ptr` (writing a zero), so
/// that the registration finds them resident. Faulting a page in zeroes
/// it, at a few GB/s per core: a large region is touched by several
/// threads at once, each a run of whole huge pages (up to 8 threads, at
/// least 64 MiB each).
fn prefault(ptr: *mut u8, len: usize) {
    const PER_THREAD: usize = 64 << 20;
    const MAX_THREADS: usize = 8;
    let threads = if cfg!(pinpool_loom) {
        1
    } else {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(MAX_THREADS)
            .min(len / PER_THREAD)
            .max(1)
    };
    if threads == 1 {
        touch(ptr, len);
        return;
    }
    let run = (len / threads).next_multiple_of(huge_page_size());
    let base = ptr as usize;
    std::thread::scope(|scope| {
        let mut offset = run;
        while offset < len {
            let n = run.min(len - offset);
            // Addresses cross as integers: each thread touches its own run.
            let at = base + offset;
            let spawned = std::thread::Builder::new()
                .name("pinpool-prefault".into())
                .spawn_scoped(scope, move || touch(at as *mut u8, n));
            if spawned.is_err() {
                touch(at as *mut u8, n);
            }
            offset += n;
        }
        touch(ptr, run.min(len));
    });
}

/// [`prefault`] on one thread.
fn touch(ptr: *mut u8, len: usize) {
    let page = crate::size_class::page_size();
    let mut offset = 0;
    while offset < len {
        // SAFETY: `offset < len`, inside the fresh mapping (the caller's
        // run of it), whose bytes are zero: writing zero leaves them as
        // they are.
        unsafe { std::ptr::write_volatile(ptr.add(offset), 0) };
        offset += page;
    }
}

#[cfg(all(test, not(pinpool_loom)))]
mod tests {
    use super::*;

    /// A demand of `bytes`, the largest block a page.
    fn wanted(bytes: usize) -> Demand {
        Demand {
            bytes,
            largest: page(),
        }
    }

    fn page() -> usize {
        crate::size_class::page_size()
    }

    #[test]
    fn carving_takes_the_best_fit_and_giving_back_coalesces() {
        let regions = Regions::new(None);
        regions
            .grow(16 * page(), Vec::new(), &mut Some, None)
            .unwrap();
        // Short buffers: each from the top of the free extent.
        let a = regions.carve(4 * page()).unwrap();
        let b = regions.carve(4 * page()).unwrap();
        let c = regions.carve(4 * page()).unwrap();
        let at = |x: &Carved| x.ptr.as_ptr() as usize;
        assert_eq!(at(&a) - at(&b), 4 * page());
        assert_eq!(at(&b) - at(&c), 4 * page());
        assert_eq!(regions.figures().free, 4 * page());
        // SAFETY: carved above, given back once, untouched (zero).
        unsafe {
            assert!(Region::give_back(a.region, a.ptr.as_ptr(), 4 * page()).is_none());
            assert!(Region::give_back(c.region, c.ptr.as_ptr(), 4 * page()).is_none());
        }
        // Two free extents (a's, and c's merged with the head): 4 and 8
        // pages. A 6-page carve fits only the merged one, at its top.
        let f = regions.figures();
        assert_eq!((f.free, f.largest_free), (12 * page(), 8 * page()));
        let d = regions.carve(6 * page()).unwrap();
        assert_eq!(at(&d) + 6 * page(), at(&c) + 4 * page());
        // SAFETY: as above.
        unsafe {
            Region::give_back(b.region, b.ptr.as_ptr(), 4 * page());
            Region::give_back(d.region, d.ptr.as_ptr(), 6 * page());
        }
        let f = regions.figures();
        assert_eq!((f.free, f.largest_free), (16 * page(), 16 * page()));
        assert!(regions.carve(17 * page()).is_none());
        let unlisted = regions.unlist_idle(|_, _| true, false);
        assert_eq!(unlisted.len(), 1);
        unlisted.into_iter().for_each(Unlisted::free);
        assert_eq!(regions.figures().regions, 0);
    }

    #[test]
    fn long_buffers_are_carved_from_the_bottom_and_short_ones_from_the_top() {
        let regions = Regions::new(None);
        let len = 4 * Tune::TOP_CARVE_BELOW;
        // Not registered: address space only, never touched.
        regions.grow(len, Vec::new(), &mut Some, None).unwrap();
        let long = regions.carve(Tune::TOP_CARVE_BELOW).unwrap();
        let short = regions.carve(page()).unwrap();
        let base = long.ptr.as_ptr() as usize;
        let f = regions.figures();
        assert_eq!(f.regions, 1);
        assert_eq!(short.ptr.as_ptr() as usize, base + len - page());
        // One run of free space between them.
        assert_eq!(f.largest_free, len - Tune::TOP_CARVE_BELOW - page());
        // SAFETY: carved above, given back once, untouched (zero).
        unsafe {
            Region::give_back(long.region, long.ptr.as_ptr(), Tune::TOP_CARVE_BELOW);
            Region::give_back(short.region, short.ptr.as_ptr(), page());
        }
        for r in regions.unlist_idle(|_, _| true, false) {
            r.free();
        }
    }

    /// Pages of `[ptr, ptr + len)` resident in memory.
    fn resident(ptr: *mut u8, len: usize) -> usize {
        let mut vec = vec![0u8; len / page()];
        // SAFETY: `vec` has one byte per page of the range, which is mapped.
        let rc = unsafe { libc::mincore(ptr.cast(), len, vec.as_mut_ptr()) };
        assert_eq!(rc, 0);
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }

    /// A test's unregistration: marks the region so and hands it back.
    fn unregistered(r: Unlisted) -> Option<Unlisted> {
        r.set_unregistered();
        Some(r)
    }

    #[test]
    fn a_growth_moves_the_pages_of_the_regions_it_folds() {
        let regions = Regions::new(None);
        let huge = huge_page_size();
        let mut registered = |_: *mut u8, _: usize| Ok(());
        let mut unregister = unregistered;
        regions
            .grow(2 * huge, Vec::new(), &mut unregister, Some(&mut registered))
            .unwrap();
        let plan = regions.fold_plan(2 * huge);
        assert_eq!(plan, [2 * huge], "a wholly free region no larger is folded");
        // Not registered, so not pre-faulted: what is resident was moved.
        let len = regions.grow(2 * huge, plan, &mut unregister, None).unwrap();
        assert_eq!(len, 4 * huge);
        let f = regions.figures();
        assert_eq!((f.regions, f.bytes, f.free), (1, 4 * huge, 4 * huge));
        only_the_end_is_resident(&regions, 4 * huge, 2 * huge);
    }

    /// Regions that hold the peak and at least half its headroom do not
    /// grow: a growth of an eighth of what they hold (the least one adds)
    /// to restore the rest of the headroom pinned about a quarter more
    /// than the peak (the working-set test's 1.3x bound was missed that
    /// way). Short of the peak, or of more than half its headroom, they
    /// grow as before.
    #[test]
    fn regions_holding_the_peak_and_half_its_headroom_do_not_grow() {
        let regions = Regions::new(None);
        let mib = 1 << 20;
        let len = regions.grow(16 * mib, Vec::new(), &mut Some, None).unwrap();
        assert_eq!(len, 16 * mib);
        // 15 MiB and its eighth: 16.875 MiB, short by 0.875, a sixteenth of
        // the peak or less.
        regions.note_in_use(15 * mib, 0);
        assert_eq!(regions.shortfall().want, 0, "grew for the last sixteenth");
        // 15.5 MiB: short by 1.44 MiB, more than a sixteenth of it.
        regions.note_in_use(15 * mib + mib / 2, 0);
        let short = regions.shortfall();
        assert_eq!((short.want, short.need), (2 * mib, 0));
        // Past what they hold: short of the peak itself.
        regions.note_in_use(16 * mib + mib / 2, 0);
        let short = regions.shortfall();
        assert_eq!(short.need, mib / 2);
        assert!(short.want >= 2 * mib + mib / 2, "{short:?}");
        for r in regions.unlist_idle(|_, _| true, false) {
            r.free();
        }
    }

    /// A merge moves wholly free regions together, the fewest bytes that
    /// hold the length asked, and adds nothing; none is planned when one
    /// region holds it alone, or when all of them together do not.
    #[test]
    fn a_merge_moves_the_fewest_free_bytes_that_hold_a_buffer() {
        let regions = Regions::new(None);
        let huge = huge_page_size();
        let mut registered = |_: *mut u8, _: usize| Ok(());
        let mut unregister = unregistered;
        for n in [2, 3, 5] {
            regions
                .grow(n * huge, Vec::new(), &mut unregister, Some(&mut registered))
                .unwrap();
        }
        assert_eq!(
            regions.merge_plan(5 * huge, Duration::ZERO),
            None,
            "one region holds it"
        );
        assert_eq!(
            regions.merge_plan(11 * huge, Duration::ZERO),
            None,
            "all of them hold less"
        );
        let mut plan = regions.merge_plan(6 * huge, Duration::ZERO).unwrap();
        plan.lens.sort_unstable();
        assert_eq!(plan.lens, [2 * huge, 5 * huge], "7 huge pages, not 8 or 10");
        let len = regions.grow(0, plan, &mut unregister, None).unwrap();
        assert_eq!(len, 7 * huge);
        let f = regions.figures();
        assert_eq!(
            (f.regions, f.bytes, f.largest_free),
            (2, 10 * huge, 7 * huge)
        );
        for r in regions.unlist_idle(|_, _| true, false) {
            r.free();
        }
    }

    /// A set holding one fresh region of `len` bytes.
    fn regions_of(len: usize) -> Regions {
        let regions = Regions::new(None);
        regions
            .grow(len, Vec::new(), &mut unregistered, None)
            .unwrap();
        regions
    }

    /// Frees `out` and every region `regions` still lists.
    fn free_all(regions: &Regions, out: Vec<Unlisted>) {
        for r in out
            .into_iter()
            .chain(regions.unlist_to_cover(usize::MAX, |_, _| true))
        {
            r.free();
        }
    }

    /// `free_regions` lists the wholly free regions with whether each is
    /// eligible, and `unlist_chosen` unlists only those of the keys given
    /// that are still wholly free and eligible: a caller choosing the
    /// cover among every wholly free region leaves the one chosen but not
    /// eligible yet, and the eligible one not chosen, listed.
    #[test]
    fn only_chosen_eligible_free_regions_are_unlisted() {
        let huge = huge_page_size();
        let regions = regions_of(2 * huge);
        let mut unregister = unregistered;
        std::thread::sleep(Duration::from_millis(50));
        regions
            .grow(3 * huge, Vec::new(), &mut unregister, None)
            .unwrap();
        // Eligible: listed 50 ms ago or more, the 2-huge-page region only.
        let old = |_: Duration, age: Duration| age >= Duration::from_millis(50);
        let mut free = regions.free_regions(old);
        free.sort_unstable_by_key(|f| f.len);
        assert_eq!(
            free.iter().map(|f| (f.len, f.eligible)).collect::<Vec<_>>(),
            [(2 * huge, true), (3 * huge, false)]
        );
        // The excess, 3 huge pages, is covered by the 3 alone.
        let lens: Vec<usize> = free.iter().map(|f| f.len).collect();
        let chosen: Vec<u64> = cover(&lens, 3 * huge)
            .iter()
            .map(|&k| free[k].key)
            .collect();
        assert_eq!(chosen, [free[1].key]);
        assert!(regions.unlist_chosen(&chosen, old).is_empty());
        assert_eq!(regions.figures().regions, 2);
        // Once eligible, the chosen one goes, and only it.
        let out = regions.unlist_chosen(&chosen, |_, _| true);
        assert_eq!(
            out.iter().map(Unlisted::len).collect::<Vec<_>>(),
            [3 * huge]
        );
        assert_eq!(regions.figures().regions, 1);
        free_all(&regions, out);
    }

    /// A region chosen by `free_regions` and folded into a growth before
    /// `unlist_chosen` runs is not confused with the region that growth
    /// listed (its header may take the folded one's address): nothing is
    /// unlisted.
    #[test]
    fn a_chosen_region_folded_meanwhile_unlists_nothing() {
        let huge = huge_page_size();
        let regions = regions_of(2 * huge);
        let mut unregister = unregistered;
        let free = regions.free_regions(|_, _| true);
        let chosen = [free[0].key];
        let fold = regions.fold_plan(4 * huge);
        assert_eq!(fold, [2 * huge]);
        regions.grow(4 * huge, fold, &mut unregister, None).unwrap();
        assert_eq!(regions.figures().bytes, 6 * huge);
        let out = regions.unlist_chosen(&chosen, |_, _| true);
        let lens: Vec<usize> = out.iter().map(Unlisted::len).collect();
        free_all(&regions, out);
        assert!(lens.is_empty(), "unlisted regions never chosen: {lens:?}");
    }

    /// Regions released to cover an excess: the fewest bytes, of equal
    /// sets the one whose largest region is smallest; all of them if they
    /// hold less; none that `eligible` refuses.
    #[test]
    fn an_excess_is_covered_by_the_fewest_bytes() {
        let regions = Regions::new(None);
        let huge = huge_page_size();
        let mut unregister = unregistered;
        let grow = |n: usize, unregister: &mut dyn FnMut(Unlisted) -> Option<Unlisted>| {
            regions
                .grow(n * huge, Vec::new(), unregister, None)
                .unwrap();
        };
        let lens = |out: Vec<Unlisted>| {
            let mut lens: Vec<usize> = out
                .into_iter()
                .map(|r| {
                    let len = r.len() / huge;
                    r.free();
                    len
                })
                .collect();
            lens.sort_unstable();
            lens
        };
        for n in [5, 2, 3] {
            grow(n, &mut unregister);
        }
        assert!(regions.unlist_to_cover(huge, |_, _| false).is_empty());
        // 2 + 3 and 5 are as many bytes: the largest stays.
        assert_eq!(lens(regions.unlist_to_cover(4 * huge, |_, _| true)), [2, 3]);
        for n in [2, 3] {
            grow(n, &mut unregister);
        }
        assert_eq!(lens(regions.unlist_to_cover(1, |_, _| true)), [2]);
        grow(2, &mut unregister);
        assert_eq!(lens(regions.unlist_to_cover(7 * huge, |_, _| true)), [2, 5]);
        // 3 left; 9 huge pages: only 2 + 3 + 5 hold them.
        grow(2, &mut unregister);
        grow(5, &mut unregister);
        assert_eq!(
            lens(regions.unlist_to_cover(9 * huge, |_, _| true)),
            [2, 3, 5]
        );
        assert_eq!(regions.figures().regions, 0);
        assert!(regions.unlist_to_cover(huge, |_, _| true).is_empty());
    }

    /// Two regions, 2 and 8 pages, with a thread carving one page and
    /// giving it back in a loop (from the 2-page region while it is
    /// listed): at any instant at least one of the two is wholly free and
    /// covers an excess of one page, so every call releases one (a choice
    /// made, the lock let go, then picked again, released nothing when the
    /// chosen one was carved from meanwhile: 4,380 calls of 300,000).
    #[test]
    fn an_eligible_region_covers_the_excess_despite_a_racing_carve() {
        struct Send(*const Regions);
        // SAFETY: test only; `Regions` is shared under its locks.
        unsafe impl std::marker::Send for Send {}
        let regions = Regions::new(None);
        regions
            .grow(2 * page(), Vec::new(), &mut Some, None)
            .unwrap();
        regions
            .grow(8 * page(), Vec::new(), &mut Some, None)
            .unwrap();
        let stop = AtomicBool::new(false);
        let mut empty = 0;
        let rounds = 100_000;
        std::thread::scope(|s| {
            let shared = Send(&regions);
            let stop = &stop;
            s.spawn(move || {
                let shared = shared;
                // SAFETY: outlives the scope.
                let regions = unsafe { &*shared.0 };
                while !stop.load(Ordering::Relaxed) {
                    if let Some(c) = regions.carve(page()) {
                        let t = Instant::now();
                        while t.elapsed() < Duration::from_nanos(300) {}
                        // SAFETY: carved above, given back once, untouched.
                        let back = unsafe { Region::give_back(c.region, c.ptr.as_ptr(), page()) };
                        if let Some(r) = back {
                            r.free();
                        }
                    }
                }
            });
            for _ in 0..rounds {
                let out = regions.unlist_to_cover(page(), |_, _| true);
                if out.is_empty() {
                    empty += 1;
                }
                for r in out {
                    let len = r.len();
                    r.free();
                    regions.grow(len, Vec::new(), &mut Some, None).unwrap();
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
        assert_eq!(
            empty, 0,
            "{empty} of {rounds} calls released nothing for an excess of one page"
        );
    }

    /// Regions of 2, 3, 4 and 10 pages, an excess of 9 pages: the three
    /// small ones cover it exactly, and the largest stays (the smallest
    /// region that held it alone, 10 pages, went).
    #[test]
    fn the_fewest_bytes_keep_the_largest_region() {
        let regions = Regions::new(None);
        for n in [2, 3, 4, 10] {
            regions
                .grow(n * page(), Vec::new(), &mut Some, None)
                .unwrap();
        }
        let mut lens: Vec<usize> = regions
            .unlist_to_cover(9 * page(), |_, _| true)
            .into_iter()
            .map(|r| {
                let n = r.len() / page();
                r.free();
                n
            })
            .collect();
        lens.sort_unstable();
        assert_eq!(lens, [2, 3, 4], "released (pages) for an excess of 9 pages");
    }

    /// Carves the whole of the one region of `regions`, `len` bytes, and
    /// checks that only its last `moved` bytes are resident (moved in,
    /// where nothing pre-faulted the rest) and all of it zero; then frees
    /// it.
    fn only_the_end_is_resident(regions: &Regions, len: usize, moved: usize) {
        let all = regions.carve(len).unwrap();
        let base = all.ptr.as_ptr();
        assert_eq!(resident(base, len - moved), 0);
        // SAFETY: inside the carved block.
        let end = unsafe { base.add(len - moved) };
        assert_eq!(resident(end, moved), moved / page());
        // SAFETY: the block is mapped and carved above, nobody else uses it.
        let bytes = unsafe { std::slice::from_raw_parts(base, len) };
        assert!(bytes.iter().all(|&b| b == 0));
        // SAFETY: carved above, given back once, all-zero.
        unsafe { Region::give_back(all.region, base, len) };
        for r in regions.unlist_idle(|_, _| true, false) {
            r.free();
        }
    }

    /// A region grown by a fold is two mappings (its fresh part and the
    /// moved one), which kernels before Linux 6.17 refuse to move in one
    /// call: folding it again moves it a huge page at a time, every page
    /// still resident after.
    #[test]
    fn a_region_of_several_mappings_folds_a_huge_page_at_a_time() {
        let regions = Regions::new(None);
        let huge = huge_page_size();
        let mut registered = |_: *mut u8, _: usize| Ok(());
        let mut unregister = unregistered;
        let mut grow = |len, registering: bool| {
            let plan = regions.fold_plan(len);
            let register: Option<&mut dyn FnMut(*mut u8, usize) -> Result<(), Error>> =
                if registering {
                    Some(&mut registered)
                } else {
                    None
                };
            regions.grow(len, plan, &mut unregister, register).unwrap()
        };
        assert_eq!(grow(2 * huge, true), 2 * huge);
        assert_eq!(grow(2 * huge, true), 4 * huge);
        super::super::mmap::PIECEWISE.store(true, Ordering::Relaxed);
        // Not registered, so not pre-faulted: what is resident was moved.
        let len = grow(4 * huge, false);
        super::super::mmap::PIECEWISE.store(false, Ordering::Relaxed);
        assert_eq!(len, 8 * huge);
        assert_eq!(regions.figures().regions, 1);
        only_the_end_is_resident(&regions, 8 * huge, 4 * huge);
    }

    /// A growth whose registration panics (a backend's bug), after it
    /// moved a wholly free region into its mapping: the mapping, moved
    /// pages included, is unmapped as the panic unwinds, not leaked.
    #[test]
    fn a_growth_whose_registration_panics_unmaps_what_it_mapped() {
        let regions = Regions::new(None);
        let huge = huge_page_size();
        let mut unregister = unregistered;
        regions
            .grow(
                2 * huge,
                Vec::new(),
                &mut unregister,
                Some(&mut |_, _| Ok(())),
            )
            .unwrap();
        let plan = regions.fold_plan(2 * huge);
        assert_eq!(plan.len(), 1);
        let mut mapped = None;
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut register = |at: *mut u8, n: usize| -> Result<(), Error> {
                mapped = Some((at as usize, n));
                panic!("a registration that panics");
            };
            let _ = regions.grow(2 * huge, plan, &mut unregister, Some(&mut register));
        }));
        assert!(panicked.is_err());
        let (at, n) = mapped.expect("the registration was called");
        assert_eq!(n, 4 * huge, "the growth and the region it folded");
        let mut vec = vec![0u8; n / page()];
        // SAFETY: `vec` has one byte per page of the range; an unmapped
        // range makes the call fail with ENOMEM, which is what is checked.
        let rc = unsafe { libc::mincore(at as *mut libc::c_void, n, vec.as_mut_ptr()) };
        let errno = std::io::Error::last_os_error().raw_os_error();
        assert_eq!(
            (rc, errno),
            (-1, Some(libc::ENOMEM)),
            "the growth's mapping is still there"
        );
        assert_eq!(regions.figures().regions, 0);
    }

    /// A plan of regions wholly free for a while (the pinned budget's
    /// fold, see `Regions::idle_cover`) folds those, not another region of
    /// the same length freed a moment ago (a buffer of it taken in a loop,
    /// whose next take would miss once it is folded), though that one
    /// comes first in the list.
    #[test]
    fn a_fold_of_idle_regions_leaves_a_region_of_their_length_freed_since() {
        let regions = Regions::new(None);
        let huge = huge_page_size();
        regions.grow(2 * huge, Vec::new(), &mut Some, None).unwrap();
        let first = regions.carve(page()).unwrap();
        let in_use = first.region;
        // SAFETY: carved above, given back once, untouched.
        unsafe { Region::give_back(first.region, first.ptr.as_ptr(), page()) };
        regions.grow(2 * huge, Vec::new(), &mut Some, None).unwrap();
        std::thread::sleep(Duration::from_millis(150));
        let again = regions.carve(page()).unwrap();
        assert_eq!(
            again.region, in_use,
            "a tie in fit carves from the first region"
        );
        // SAFETY: as above.
        unsafe { Region::give_back(again.region, again.ptr.as_ptr(), page()) };
        let idle = Duration::from_millis(100);
        let plan = regions.idle_cover(2 * huge, idle);
        assert_eq!(plan.lens, [2 * huge], "only the region idle for 150 ms");
        regions.grow(2 * huge, plan, &mut Some, None).unwrap();
        assert_eq!(regions.figures().regions, 2);
        assert_eq!(
            regions.idle_lens(idle),
            Vec::<usize>::new(),
            "the region just freed was folded, the one idle for 150 ms left"
        );
        for r in regions.unlist_idle(|_, _| true, false) {
            r.free();
        }
    }

    #[test]
    fn a_fold_leaves_out_a_region_carved_from_after_its_plan() {
        let regions = Regions::new(None);
        let huge = huge_page_size();
        regions.grow(2 * huge, Vec::new(), &mut Some, None).unwrap();
        let plan = regions.fold_plan(2 * huge);
        let held = regions.carve(page()).unwrap();
        // The region is no longer wholly free: not folded, and its place
        // in the new region is not kept.
        let len = regions.grow(2 * huge, plan, &mut Some, None).unwrap();
        assert_eq!(len, 2 * huge);
        let f = regions.figures();
        assert_eq!((f.regions, f.bytes), (2, 4 * huge));
        // SAFETY: carved above, given back once, untouched.
        unsafe { Region::give_back(held.region, held.ptr.as_ptr(), page()) };
        for r in regions.unlist_idle(|_, _| true, false) {
            r.free();
        }
    }

    #[test]
    fn a_region_unlisted_with_blocks_out_goes_with_its_last_block() {
        let regions = Regions::new(None);
        regions
            .grow(2 * page(), Vec::new(), &mut Some, None)
            .unwrap();
        let a = regions.carve(page()).unwrap();
        assert!(regions.unlist_idle(|_, _| true, true).is_empty());
        assert!(
            regions.carve(page()).is_none(),
            "carved from an unlisted region"
        );
        // SAFETY: carved above, given back once, untouched.
        let last = unsafe { Region::give_back(a.region, a.ptr.as_ptr(), page()) };
        let last = last.expect("the last block hands the region over");
        last.free();
    }

    #[test]
    fn a_region_far_larger_than_the_demand_drains_and_goes_once_wholly_free() {
        let regions = Regions::new(None);
        let len = regions
            .grow(Tune::REGION_MIN * 4, Vec::new(), &mut Some, None)
            .unwrap();
        let a = regions.carve(page()).unwrap();
        assert!(
            regions
                .drain_excess(wanted(page()), Duration::from_secs(60))
                .is_none(),
            "drained a region younger than the window"
        );
        assert!(
            regions.drain_excess(wanted(len), Duration::ZERO).is_none(),
            "drained a region the demand needs"
        );
        let drained = regions.drain_excess(wanted(page()), Duration::ZERO);
        assert!(
            matches!(drained, Some(Drained::WithBlocksOut)),
            "{drained:?}"
        );
        assert!(regions.draining());
        assert_eq!(regions.figures().bytes, 0, "still listed");
        assert!(
            regions.carve(page()).is_none(),
            "carved from a draining region"
        );
        assert!(regions.settle_drains(Duration::from_secs(60)).is_empty());
        // SAFETY: carved above, given back once, untouched.
        let last = unsafe { Region::give_back(a.region, a.ptr.as_ptr(), page()) };
        assert!(last.is_none(), "a drained region is the set's to release");
        let released = regions.settle_drains(Duration::from_secs(60));
        assert_eq!(released.len(), 1);
        assert!(!regions.draining(), "still draining once released");
        released.into_iter().for_each(Unlisted::free);
    }

    /// Two regions of about the demand each, both carved from (so that
    /// neither is wholly free), hold more than half as much again as the
    /// demand: one drains, as what grows again for the demand once it is
    /// gone is an eighth of it, not a whole region. A rule that drained a
    /// region only if the rest held the demand and its eighth kept both
    /// for good.
    #[test]
    fn of_two_regions_of_about_the_demand_each_one_drains() {
        let regions = Regions::new(None);
        let len = Tune::REGION_MIN * 9;
        assert_eq!(regions.grow(len, Vec::new(), &mut Some, None).unwrap(), len);
        let a = regions.carve(len / 2).unwrap();
        // The first is not wholly free: a second region, and a block only
        // it can hold.
        assert_eq!(regions.grow(len, Vec::new(), &mut Some, None).unwrap(), len);
        let b = regions.carve(len / 2 + page()).unwrap();
        assert_ne!(a.region, b.region);
        let drained = regions.drain_excess(wanted(len), Duration::ZERO);
        assert!(
            matches!(drained, Some(Drained::WithBlocksOut)),
            "{drained:?}"
        );
        assert_eq!(regions.figures().bytes, len, "not one region listed");
        for (at, n) in [(a, len / 2), (b, len / 2 + page())] {
            // SAFETY: carved above, given back once, untouched.
            assert!(unsafe { Region::give_back(at.region, at.ptr.as_ptr(), n) }.is_none());
        }
        let released = regions.settle_drains(Duration::MAX);
        assert_eq!(released.len(), 1);
        released.into_iter().for_each(Unlisted::free);
        regions
            .unlist_idle(|_, _| true, false)
            .into_iter()
            .for_each(Unlisted::free);
    }

    #[test]
    fn a_drain_that_does_not_end_in_time_is_given_up() {
        let regions = Regions::new(None);
        let len = regions
            .grow(Tune::REGION_MIN * 4, Vec::new(), &mut Some, None)
            .unwrap();
        let a = regions.carve(page()).unwrap();
        assert!(regions
            .drain_excess(wanted(page()), Duration::ZERO)
            .is_some());
        assert!(regions.settle_drains(Duration::ZERO).is_empty());
        assert!(!regions.draining());
        assert_eq!(regions.figures().bytes, len, "listed again");
        let b = regions.carve(page()).expect("carved from again");
        assert!(
            regions
                .drain_excess(wanted(page()), Duration::ZERO)
                .is_none(),
            "drained again after a drain was given up"
        );
        for at in [a, b] {
            // SAFETY: carved above, given back once, untouched.
            assert!(unsafe { Region::give_back(at.region, at.ptr.as_ptr(), page()) }.is_none());
        }
        // Once wholly free, what held it is gone: carved from again, it
        // may drain again.
        let c = regions.carve(page()).unwrap();
        assert!(
            regions
                .drain_excess(wanted(page()), Duration::ZERO)
                .is_some(),
            "a region wholly free since its drain was given up is never drained"
        );
        // SAFETY: as above.
        assert!(unsafe { Region::give_back(c.region, c.ptr.as_ptr(), page()) }.is_none());
        let released = regions.settle_drains(Duration::MAX);
        assert_eq!(released.len(), 1);
        released.into_iter().for_each(Unlisted::free);
    }
}

/// Nanoseconds since the first call in this process, plus one (so never 0).
fn since_epoch() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1
}
