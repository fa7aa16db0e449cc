//! The cleaner's intake: everything a drop hands to the cleaner, held by
//! the thread caches directly, so that a drop's calls only go down (buffer,
//! thread cache, intake, lanes).
//!
//! A drop that its thread cache does not keep is [submitted](Intake::submit):
//! it becomes a [`Job`] on the *recycle* lane (already registered, or never
//! to be) or the *register* lane (a first registration), unless the lane's
//! backlog is full (registrations queued, bytes to zero, buffers queued to
//! recycle), in which case it is [shed](Intake::shed) on the spot, with no
//! driver call and no lock. A drop after the pool closed goes to the reaper
//! ([`late`](Intake::late)). Every path that takes a dropped buffer in
//! first notes the device synchronizes started before it
//! ([`note_drop`](Intake::note_drop)).
//!
//! Nothing here reaches back up to the caches: a job carries the inbox of
//! its buffer's cache ([`Inbox`]) and the pool's counters, and the drop's
//! flush ticket rides in the buffer's metadata.

use std::time::Instant;

use crate::alloc::Block;
use crate::reaper::{self, Message};
use crate::remote::Inbox;
use crate::stats::Counters;
use crate::sync::{AtomicUsize, HintCounter, Ordering};
use crate::tune::{Tune, Tuning};

use super::device_sync::DeviceSyncs;
use super::job::{Job, Returned};
use super::lanes::{Lane, Lanes};
use super::spent::Spent;

/// Where a dropped buffer comes from: the inbox of the cache it was taken
/// through, the pool's counters, the cap now, and whether the caller owns
/// that cache (so that a ticket closed here counts without a shared write).
#[derive(Clone, Copy)]
pub(crate) struct Origin<'a> {
    pub(crate) home: &'a Inbox,
    pub(crate) counters: &'a Counters,
    pub(crate) cap: usize,
    pub(crate) by_owner: bool,
}

/// See the module docs.
pub(crate) struct Intake {
    /// The work queue the cleaner's workers serve.
    pub(crate) lanes: Lanes<Job>,
    /// Whether the backend pins (a miss buffer needs registering).
    pub(crate) pins: bool,
    /// Whether buffers are carved from regions (see `alloc::region`): a
    /// miss buffer is then freed, and its demand met by a region.
    pub(crate) regions: bool,
    /// Per device, the footprint bytes of
    /// pageable buffers that takes missed to and that are not dropped yet:
    /// demand the regions did not meet. Relaxed: a hint for the size of
    /// the next region, which a racing miss or drop leaves a buffer off.
    misses_out: Box<[AtomicUsize]>,
    /// Per device, the bytes of regions wholly free for
    /// [`FOLD_IDLE_AFTER`](super::FOLD_IDLE_AFTER) or longer, as the last
    /// provisioning tick counted them: room a miss's growth may fold (see
    /// [`fits_folding`](Self::fits_folding)).
    idle_regions: Box<[AtomicUsize]>,
    /// Per device, the bytes of regions wholly free for
    /// [`Cleaner::elsewhere_after`](super::Cleaner::elsewhere_after) or
    /// longer, as the last provisioning tick counted them: room a miss's
    /// growth on another device may release (see
    /// [`fits_folding`](Self::fits_folding)).
    idle_elsewhere: Box<[AtomicUsize]>,
    /// The device synchronizes for pinned buffers dropped without events.
    pub(crate) syncs: DeviceSyncs,
    /// Registrations queued or running, and the most allowed.
    pub(crate) register_queued: AtomicUsize,
    register_backlog: usize,
    /// Dirty bytes queued for zeroing.
    pub(crate) zero_queued: AtomicUsize,
    /// Buffers queued for recycling (`Job::Clean`, not yet run): at most
    /// [`RECYCLE_BACKLOG`](crate::tune::Tuning::RECYCLE_BACKLOG) (give or take the drops racing at the bound).
    /// Buffers parked for their copies are not counted.
    pub(crate) recycle_queued: HintCounter,
    /// Fences of buffers freed by their droppers.
    pub(crate) spent: Spent,
}

impl std::fmt::Debug for Intake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intake")
            .field("lanes", &self.lanes)
            .field("pins", &self.pins)
            .finish_non_exhaustive()
    }
}

impl Intake {
    /// The intake of a cleaner of `width` workers for `devices` devices, on
    /// a backend that `pins` or not.
    pub(crate) fn new(width: usize, devices: usize, pins: bool, regions: bool) -> Self {
        Self {
            lanes: Lanes::new(),
            pins,
            regions: pins && regions,
            misses_out: (0..devices).map(|_| AtomicUsize::new(0)).collect(),
            idle_regions: (0..devices).map(|_| AtomicUsize::new(0)).collect(),
            idle_elsewhere: (0..devices).map(|_| AtomicUsize::new(0)).collect(),
            syncs: DeviceSyncs::new(devices),
            register_queued: AtomicUsize::new(0),
            register_backlog: Tune::REGISTER_BACKLOG + 16 * width,
            zero_queued: AtomicUsize::new(0),
            recycle_queued: HintCounter::new(0),
            spent: Spent::new(),
        }
    }

    /// Notes a take of `device` that missed to a pageable buffer of
    /// `footprint` bytes; returns the bytes of such misses out now on the
    /// device, its own included.
    pub(crate) fn note_miss(&self, device: usize, footprint: usize) -> usize {
        // Relaxed: see `misses_out`.
        self.misses_out[device].fetch_add(footprint, Ordering::Relaxed) + footprint
    }

    /// Notes `bytes` of regions of `device` wholly free long enough to be
    /// folded, and `released` of them free long enough to be released for
    /// another device's growth (see [`fits_folding`](Self::fits_folding)).
    pub(crate) fn note_idle_regions(&self, device: usize, bytes: usize, released: usize) {
        // Relaxed: hints, see `fits_folding`.
        self.idle_regions[device].store(bytes, Ordering::Relaxed);
        self.idle_elsewhere[device].store(released, Ordering::Relaxed);
    }

    /// Whether a miss of `footprint` bytes on `device` may be pinned under
    /// the budget when its growth folds the device's idle regions in
    /// (pinned already: see `Cleaner::grow_with`) and releases other
    /// devices' regions idle for long for the room, pinning only what
    /// they leave of it. A hint as of the last provisioning tick: wrong
    /// either way by what was carved from, or freed in, the regions since
    /// (and high by another device's regions the growth may not release:
    /// see `Cleaner::release_idle_elsewhere`), which costs a miss kept for
    /// a growth the budget then refuses (its memory freed there), or one
    /// freed that a growth could have pinned (as without regions); the
    /// growth itself is admitted exactly.
    fn fits_folding(&self, counters: &Counters, device: usize, footprint: usize) -> bool {
        // Relaxed: hints, as above.
        let mut idle = self.idle_regions[device].load(Ordering::Relaxed);
        for (other, released) in self.idle_elsewhere.iter().enumerate() {
            if other != device {
                idle = idle.saturating_add(released.load(Ordering::Relaxed));
            }
        }
        counters.fits_pinned(footprint.saturating_sub(idle) as u64)
    }

    /// The bytes of misses out now on `device` (of buffers its regions
    /// carve).
    pub(crate) fn misses_out(&self, device: usize) -> usize {
        // Relaxed: see `misses_out`.
        self.misses_out[device].load(Ordering::Relaxed)
    }

    /// The key a closed pool's late buffers are filed under with the
    /// reaper: this intake's address, stable while the pool's state lives.
    pub(crate) fn key(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// A buffer dropped after the pool closed: to the reaper, which frees
    /// it once its copies are done.
    pub(crate) fn late(&self, mut block: Block) {
        self.note_drop(&mut block);
        reaper::send(Message::Late {
            pool: self.key(),
            block,
        });
    }

    /// Takes a dropped buffer that its cache does not keep. Never blocks:
    /// atomics and a channel send only (it runs inside the dropping
    /// thread's active window, where taking a lock could deadlock with a
    /// thief).
    pub(crate) fn submit(&self, from: Origin<'_>, block: Block) {
        self.submit_to(from, block, false, false);
    }

    /// Takes a fresh buffer to pin and pool ahead of demand (`reserve`, or
    /// provisioning), its ticket opened in the orphan cache: it goes to its
    /// shard. One that `reserve` asked for (`meta.reserved`) is registered
    /// whatever the registration backlog; a provisioned one yields to it.
    /// Neither counts against the recycling backlog: both are fresh and
    /// clean, as many as the caller asked for.
    pub(crate) fn submit_ahead(&self, from: Origin<'_>, block: Block) {
        self.submit_to(from, block, true, true);
    }

    /// Takes a buffer a sweep moved out of a cache whose owner waited: as
    /// [`submit`](Self::submit), and to its device's shard once ready if
    /// `to_shard` (the owner went idle).
    pub(crate) fn submit_swept(&self, from: Origin<'_>, block: Block, to_shard: bool) {
        self.submit_to(from, block, to_shard, false);
    }

    /// As [`submit`](Self::submit); the buffer goes to its shard once ready
    /// if `to_shard`, and is pinned ahead of demand if `ahead`.
    fn submit_to(&self, from: Origin<'_>, mut block: Block, to_shard: bool, ahead: bool) {
        let register = self.pins && !block.is_pinned();
        if self.regions && register && !ahead && !block.in_slab() {
            // A miss back: no longer demand the regions fall short of.
            let out = &self.misses_out[block.device()];
            // Relaxed: see `misses_out`; stops at 0 rather than wrap.
            let _ = out.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(block.footprint()))
            });
        }
        self.note_drop(&mut block);
        let meta = block.meta_mut();
        meta.dropped_at = Some(Instant::now());
        let reserved = meta.reserved != 0;
        let mut returned = Returned::new(block, from.home, from.counters);
        returned.to_shard = to_shard;
        if register {
            // Relaxed: a bound on a queue length, publishing nothing; a
            // racing read lets a few drops past it or sheds a few below it.
            let backed_up = self.register_queued.load(Ordering::Relaxed) >= self.register_backlog;
            let footprint = returned.block().footprint() as u64;
            let fits = if self.regions {
                let device = returned.block().device();
                self.fits_folding(from.counters, device, footprint as usize)
            } else {
                from.counters.fits_pinned(footprint)
            };
            if !reserved && (backed_up || !fits) {
                // Registrations are backed up, or the pinned budget is
                // spent: free this miss buffer rather than let misses breed
                // an ever longer queue, or pin past the budget. With
                // regions, the bytes of the device's regions wholly free
                // for `FOLD_IDLE_AFTER` or longer count as room: the growth
                // this miss makes may fold them into its region, pinning
                // only the rest (see `Cleaner::grow_with`).
                Counters::add(&from.counters.registrations_skipped, 1);
                self.shed(&from, returned);
            } else {
                self.register_queued.fetch_add(1, Ordering::Relaxed);
                self.lanes.push(Lane::Register, Job::Register(returned));
            }
            return;
        }
        let dirty = returned.block().dirty();
        // Relaxed: bounds, as above. What is pinned ahead of demand is
        // queued whatever the backlog.
        let limit = (from.cap / 2).clamp(Tune::ZERO_BACKLOG_MIN, Tune::ZERO_BACKLOG);
        // The buffers queued to recycle. Parked ones (waiting for their
        // copies or a device synchronize) are not counted: they hold no
        // queue, only the memory a copy pipeline of the caller's keeps in
        // flight, and shedding them would cost the pinned memory of every
        // copy past the bound.
        let queued = self.recycle_queued.load(Ordering::Relaxed);
        let full = self.zero_queued.load(Ordering::Relaxed) + dirty > limit
            || queued >= Tune::RECYCLE_BACKLOG;
        if full && !ahead {
            Counters::add(&from.counters.zeroing_skipped, 1);
            self.shed(&from, returned);
            return;
        }
        self.zero_queued.fetch_add(dirty, Ordering::Relaxed);
        self.recycle_queued.fetch_add(1, Ordering::Relaxed);
        self.lanes.push(Lane::Recycle, Job::Clean(returned));
    }

    /// Takes a dropped buffer that a full backlog (registrations, bytes to
    /// zero, or buffers to recycle) has no room for, so that dropping
    /// faster than the cleaner works grows no queue (and no flush's wait)
    /// without bound, while the dropping thread still never blocks, calls
    /// the backend or takes a lock:
    ///
    /// - a pageable buffer is freed here (nothing of CUDA to undo, and no
    ///   copy can still read it: copies from pageable memory are staged
    ///   before they return); its fences and spare events, which only the
    ///   driver destroys and the event pool's lock takes back, go to the
    ///   cleaner ([`Spent`]);
    /// - a pinned one needs the driver to be unregistered: it goes on its
    ///   home cache's release list (in its [`Inbox`]), which the cleaner frees in bulk once
    ///   the buffers' copies are done.
    ///
    /// Either list queues one collecting job when a push finds it empty,
    /// so the queue gains at most one job per collection.
    fn shed(&self, from: &Origin<'_>, returned: Returned) {
        let mut block = returned.into_block();
        if block.is_pinned() {
            if from.home.released.push(block) {
                self.lanes.push(Lane::Recycle, Job::Bulk);
            }
            return;
        }
        let fences = std::mem::take(block.fences_mut());
        let ticket = block.take_ticket();
        Counters::add(&from.counters.released, 1);
        drop(block);
        if let Some(ticket) = ticket {
            ticket.close(from.by_owner);
        }
        if !fences.is_bare() && self.spent.push(fences) {
            self.lanes.push(Lane::Recycle, Job::Spent);
        }
    }

    /// Notes, on a dropped pinned buffer without recorded events, the
    /// device synchronizes started so far: one numbered above the note
    /// covers the copies that may still read it. Every path that takes a
    /// dropped buffer in (the cleaner's, a closed pool's) notes it before
    /// anything can release it.
    pub(crate) fn note_drop(&self, block: &mut Block) {
        if block.is_pinned() && block.fences_mut().is_empty() {
            let note = self.syncs.started(block.device());
            block.meta_mut().sync_gen = note;
        }
    }
}
