//! Releasing buffers: unregister (if pinned) and free, or leak what the
//! driver would not unregister.

use crate::admission::{Admission, Places};
use crate::alloc::{Block, Unlisted, Unpinned};
use crate::backend::Backend;
use crate::fence::EventPool;
use crate::shard::Shard;
use crate::stats::Counters;
use crate::trace::writer::Tracer;
use crate::trace::{REGISTER_FAILED, REGISTER_REGION, UNREGISTER};
use std::time::{Duration, Instant};

/// What releasing a pool's buffer needs: its backend (to unregister), its
/// counters, its spare events (where the buffer's go back), and its trace
/// (which records each unregistration).
#[derive(Clone, Copy)]
pub(crate) struct Releaser<'a> {
    pub(crate) backend: &'a dyn Backend,
    pub(crate) counters: &'a Counters,
    pub(crate) events: &'a EventPool,
    pub(crate) trace: Option<&'a Tracer>,
}

/// Unregisters (if pinned) and frees `block`; a buffer whose unregistration
/// fails is leaked (unmapping registered memory would be worse).
pub(crate) fn release(with: Releaser<'_>, block: Block) {
    Counters::add(&with.counters.released, 1);
    free(with, block);
}

/// Gives a carved block, quiescent, back to its region (zeroing what was
/// written), not counted as released: its memory stays pooled as a free
/// extent. The region goes too if that was its last block and it was
/// unlisted.
pub(crate) fn give_back(with: Releaser<'_>, block: Block) {
    debug_assert!(block.is_region_memory());
    free(with, block);
}

fn free(with: Releaser<'_>, mut block: Block) {
    block.fences_mut().release(with.events);
    if !block.is_pinned() && !block.is_region_memory() {
        drop(block);
        return;
    }
    let device = block.device();
    match block.unpin() {
        Unpinned::Alone(mut block) => {
            // SAFETY: the block was registered by this backend, and every
            // caller knows its copies have finished (ready, or fences done).
            if unsafe { unregister(with, device, block.as_ptr(), block.footprint(), false) } {
                block.set_pinned(false);
                drop(block);
            } else {
                // Counted leaked by `unregister`: the block's own mapping.
                let _ = block.leak();
            }
        }
        // Other buffers of the slab are live: it stays registered.
        Unpinned::Shared => {}
        Unpinned::Last(slab) if slab.registered() => {
            // SAFETY: the slab was registered by this backend at its base,
            // and no buffer of it is left, so no copy from it is in flight.
            if unsafe { unregister(with, device, slab.base(), slab.len(), false) } {
                slab.set_unregistered();
                slab.free();
            } else {
                slab.leak();
            }
        }
        Unpinned::Last(slab) => slab.free(),
        // Back to its region (a page block, or a slab's page with its last
        // buffer), which stays registered while listed.
        Unpinned::Carved(None) => {}
        Unpinned::Carved(Some(region)) => release_region(with, device, region),
    }
}

/// Unregisters (if registered) a region that nothing is carved from any
/// more, for its holder to free or to move into a new region; leaks it,
/// and returns `None`, if the unregistration fails.
pub(crate) fn unregister_region(
    with: Releaser<'_>,
    device: usize,
    region: Unlisted,
) -> Option<Unlisted> {
    if region.registered() {
        // SAFETY: the region was registered by this backend at its base,
        // and no block of it is left, so no copy from it is in flight.
        let unregistered = unsafe { unregister(with, device, region.base(), region.len(), true) };
        if !unregistered {
            region.leak();
            return None;
        }
        region.set_unregistered();
    }
    Some(region)
}

/// Unregisters (if registered) and frees a region that nothing is carved
/// from any more, counting it released; leaks it if the unregistration
/// fails.
pub(crate) fn release_region(with: Releaser<'_>, device: usize, region: Unlisted) {
    Counters::add(&with.counters.regions_released, 1);
    if let Some(region) = unregister_region(with, device, region) {
        region.free();
    }
}

/// Unregisters the `bytes` registered at `ptr` (a `region`, or a buffer or
/// slab), counting and tracing the outcome; false if it failed, and the
/// caller must leak the memory.
///
/// # Safety
/// As [`Backend::unregister`].
unsafe fn unregister(
    with: Releaser<'_>,
    device: usize,
    ptr: *mut u8,
    bytes: usize,
    region: bool,
) -> bool {
    let counters = with.counters;
    let started = with.trace.map(|_| Instant::now());
    // SAFETY: the caller's guarantee.
    let result = unsafe { with.backend.unregister(device, ptr) };
    if let (Some(tracer), Some(started)) = (with.trace, started) {
        let flags = if result.is_err() { REGISTER_FAILED } else { 0 }
            | if region { REGISTER_REGION } else { 0 };
        tracer.event(
            UNREGISTER,
            flags,
            device,
            ptr as u64,
            bytes as u64,
            started.elapsed().as_nanos() as u64,
        );
    }
    match result {
        Ok(()) => {
            Counters::add(&counters.unregistered_bytes, bytes as u64);
            true
        }
        Err(e) => {
            Counters::add(&counters.unregister_failures, 1);
            Counters::add(&counters.leaked_bytes, bytes as u64);
            tracing::error!(error = %e, bytes, "pinpool: unregistering failed; leaking the memory");
            false
        }
    }
}

/// Releases the regions of `shards` that nothing is carved from and that
/// `pick` chooses (given a region's length and how long it has been wholly
/// free), and drained ones wholly free; with `all`, unlists the others
/// too, to be released by the give-back of their last block (see
/// `alloc::region`).
pub(crate) fn release_regions(
    with: Releaser<'_>,
    shards: &[Shard],
    mut pick: impl FnMut(usize, Duration) -> bool,
    all: bool,
) {
    for (device, shard) in shards.iter().enumerate() {
        // Drained regions whose last block came back go too.
        for region in shard.regions().settle_drains(Duration::MAX) {
            release_region(with, device, region);
        }
        for region in shard.regions().unlist_idle(&mut pick, all) {
            release_region(with, device, region);
        }
    }
}

/// Releases wholly free regions of `shards` while the pinned bytes exceed
/// the pinned budget (after it was lowered): the fewest bytes that cover
/// the excess.
pub(crate) fn release_regions_over_budget(with: Releaser<'_>, shards: &[Shard]) {
    let counters = with.counters;
    if counters.pinned() <= counters.max_pinned() {
        return;
    }
    for (device, shard) in shards.iter().enumerate() {
        for region in shard.regions().settle_drains(Duration::MAX) {
            release_region(with, device, region);
        }
        // The fewest bytes that cover the excess (the largest regions go
        // last: see `Regions::unlist_to_cover`).
        let over = counters.pinned().saturating_sub(counters.max_pinned());
        let over = usize::try_from(over).unwrap_or(usize::MAX);
        for region in shard.regions().unlist_to_cover(over, |_, _| true) {
            release_region(with, device, region);
        }
    }
}

/// Gives the idle carved buffers of every class that is not hot (see
/// [`Provisioner::is_hot`]) back to their regions, where they coalesce with
/// their free neighbours: a buffer kept for same-size reuse while its class
/// was in demand does not hold region memory once the demand moves to
/// other sizes (the next take of its size carves again). A sub-page buffer
/// of a slab carved from a region gives up its share, and the slab's page
/// goes back with its last buffer. While a region drains (see
/// `Regions::drain_excess`), so do the idle buffers of hot classes carved
/// from it. Buffers pinned on request (`reserve`) or not from a region stay
/// in their class.
///
/// [`Provisioner::is_hot`]: crate::provision::Provisioner::is_hot
pub(crate) fn cool(
    with: Releaser<'_>,
    admission: &Admission,
    at: Places<'_>,
    provisioner: &crate::provision::Provisioner,
) {
    let classes = &at.caches.classes;
    // A snapshot must not see a kept buffer popped and pushed back as
    // gone (see `Caches::no_moves`).
    let _no_moves = at.caches.no_moves();
    for (device, shard) in at.shards.iter().enumerate() {
        // While a region drains, the idle buffers carved from it go back
        // to it from hot classes too: it goes once they are all back.
        let draining = shard.regions().draining();
        for class in classes.all() {
            // Relaxed reads: a stale one keeps a buffer a tick longer, or
            // gives one back that the next take of its size carves again.
            let held = shard.len(class);
            let hot = provisioner.is_hot(classes.slot(device, class));
            if held == 0 || hot && !draining {
                continue;
            }
            // Kept ones go back once the stack is gone through, not on top
            // of it, where the next pop would find them again.
            let mut kept = Vec::new();
            for _ in 0..held {
                let Some(block) = shard.pop(class) else {
                    break;
                };
                // Reservations a clear forgot do not keep their buffers in
                // their class. The generation read per buffer: one read
                // before a clear that a reserve raced saw the reserve's
                // buffers as forgotten ones.
                if !block.is_region_memory()
                    || block.is_reserved_in(admission.reservations())
                    || hot && block.region_listed()
                {
                    kept.push(block);
                    continue;
                }
                admission.removed(block.footprint());
                give_back(with, block);
            }
            for block in kept {
                if let Err(block) = shard.push(block) {
                    admission.removed(block.footprint());
                    release(with, block);
                }
            }
        }
    }
}

/// Free extents are pooled bytes too: while idle buffers and free extents
/// together exceed the cap, releases wholly free regions until the excess
/// is covered. Idle buffers are left to
/// the cap's own eviction (`Admission`): giving them back to regions that
/// other buffers keep in use would bring nothing under the cap. The
/// regions released cover the excess with the fewest bytes (see
/// `Regions::unlist_to_cover`): the largest, which hold the largest
/// buffers, go last. A region
/// with a buffer in use, or idle in its class, keeps its free extents. Only
/// regions wholly free for `min_idle` or more go: a region a workload
/// empties between two of its steps is not released only to be registered
/// again at the next; nor, while the cap follows the working set, do
/// regions listed less than `min_age` ago (`Duration::ZERO` for a given
/// cap): a region grown for misses is wholly free from its registration
/// until their sizes are taken again, and the cap, which counts the bytes
/// in use at their peak, would otherwise release it whenever the bytes in
/// use dip between two steps of the workload, to grow it again at the
/// next. Nor does an excess of `slack(cap)` bytes or less release
/// anything (see [`cap_slack`]). Under a cap that is `given`, the regions
/// that cover the excess are chosen among the wholly free regions of every
/// device together, eligible or not, and those chosen go once eligible (at
/// a later call for those not yet): growths stop at a given cap (see
/// `Cleaner::grow`), and a region within it, free first once a step's
/// buffers come back, must not go in place of the one grown past it, nor
/// one device's regions for an excess that another's cover.
pub(crate) fn fit_regions_to_cap(
    with: Releaser<'_>,
    admission: &Admission,
    at: Places<'_>,
    min_idle: Duration,
    min_age: Duration,
    given: bool,
    slack: impl FnOnce(usize) -> usize,
) {
    let cap = at.caches.cap();
    let free: usize = at.shards.iter().map(Shard::free_extent_bytes).sum();
    let mut left = (admission.pooled_bytes(at) + free).saturating_sub(cap);
    if left <= slack(cap) {
        return;
    }
    let eligible = |idle: Duration, age: Duration| idle >= min_idle && age >= min_age;
    if given {
        // (length, device, key, eligible) of every device's wholly free
        // regions.
        let mut free: Vec<(usize, usize, u64, bool)> = Vec::new();
        for (device, shard) in at.shards.iter().enumerate() {
            for region in shard.regions().free_regions(eligible) {
                free.push((region.len, device, region.key, region.eligible));
            }
        }
        free.sort_unstable();
        let lens: Vec<usize> = free.iter().map(|f| f.0).collect();
        let chosen = crate::alloc::cover(&lens, left);
        for (device, shard) in at.shards.iter().enumerate() {
            let keys: Vec<u64> = chosen
                .iter()
                .map(|&k| free[k])
                .filter(|&(_, on, _, ok)| on == device && ok)
                .map(|f| f.2)
                .collect();
            if keys.is_empty() {
                continue;
            }
            for region in shard.regions().unlist_chosen(&keys, eligible) {
                release_region(with, device, region);
            }
        }
        return;
    }
    for (device, shard) in at.shards.iter().enumerate() {
        if left == 0 {
            break;
        }
        for region in shard.regions().unlist_to_cover(left, eligible) {
            left = left.saturating_sub(region.len());
            release_region(with, device, region);
        }
    }
}

/// The excess over `cap` that [`fit_regions_to_cap`] leaves in wholly free
/// regions: an eighth of a cap that `follows` the working set while idle
/// trimming is on (`idle_trim`), else none. Regions grown for what takes
/// asked cover an excess of a few MiB only by a whole region of GiB, which
/// the next peak of the working set (still rising while a workload draws
/// new sizes) misses and grows again; idle trimming still releases a
/// region left wholly free for its time, so the excess kept is bounded in
/// time. A cap given, or a pool that does not trim, keeps nothing past it.
pub(crate) fn cap_slack(follows: bool, idle_trim: Option<Duration>, cap: usize) -> usize {
    if follows && idle_trim.is_some() {
        cap / 8
    } else {
        0
    }
}

/// Releases every block of `blocks` (evicted or cleared: quiescent).
pub(crate) fn release_all(with: Releaser<'_>, blocks: Vec<Block>) {
    for block in blocks {
        release(with, block);
    }
}

#[cfg(all(test, not(pinpool_loom)))]
mod tests {
    use super::*;

    #[test]
    fn only_a_following_cap_that_trims_keeps_an_excess() {
        let trim = Some(Duration::from_secs(30));
        assert_eq!(cap_slack(true, trim, 80 << 20), 10 << 20);
        // Nothing else would release a wholly free region past the cap.
        assert_eq!(cap_slack(true, None, 80 << 20), 0);
        // A cap given is a bound.
        assert_eq!(cap_slack(false, trim, 80 << 20), 0);
        assert_eq!(cap_slack(false, None, 80 << 20), 0);
    }
}
