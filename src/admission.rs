//! Admission under the cap: the pooled-bytes estimate, the cap, eviction.
//!
//! Pooled buffers (in the shards, in thread caches' ready lists and on
//! their remote lists) must not occupy more than the cap once the pool is
//! quiet. Admission keeps an *estimate* of the pooled footprint bytes that
//! never under-counts: it adds a buffer's footprint before the buffer
//! becomes visible, eviction and `clear` subtract after removing one, and
//! takes are subtracted late: each cache counts the pooled bytes it takes
//! (owner-written, no shared write on the fast path), and the slow path
//! *folds* those counts into the estimate under the admission lock. While
//! the estimate stays under the cap an admission is one `fetch_add`;
//! otherwise, under the lock (which takers never take), the counts are
//! folded and the largest classes evicted until the buffer fits; if it
//! still does not (bytes of racing admissions not placed yet cannot be
//! evicted), it is released.
//!
//! Lowering the cap races admissions on the fast path: an admission may
//! read the old cap, add to the estimate and place its buffer after the
//! lowering thread has evicted. So the fast path, after placing, issues a
//! SeqCst fence and reads the cap again, and `set_max_pooled_bytes` stores
//! the cap, issues a SeqCst fence, then evicts: either the admission sees
//! the new cap and enforces it itself, or the lowering thread's eviction
//! sees the placed buffer.
//!
//! The cap has one home, the caches' (`Caches::cap`), where drops read it
//! too; the pool's settings and statistics report it from there, so
//! setters racing each other leave one cap, the last stored.
//!
//! With no cap given, the cap *follows the working set*: the provisioning
//! tick hands [`Admission::follow`] the most bytes in use at once over its
//! window (the footprints of the buffers in use, as the cap counts them),
//! and the cap becomes a quarter more than that or a floor, whichever is
//! more, plus the bytes `reserve` asked for (until `clear`), at most the
//! pinned budget (where the backend pins). Following, reserving and giving
//! a cap all store under one lock (`follow`), so a cap given while a tick
//! follows is never overwritten by it.

use std::collections::HashMap;
use std::time::Instant;

use crossbeam_utils::CachePadded;

use crate::alloc::Block;
use crate::held_out::{HeldOut, Holding};
use crate::remote::Inbox;
use crate::shard::Shard;
use crate::size_class::SizeClass;
use crate::sync::{fence, AtomicU32, AtomicUsize, Mutex, MutexGuard, Ordering};
use crate::thread_cache::{Caches, LockedOut, ThreadCache};

/// Where pooled buffers live.
#[derive(Clone, Copy)]
pub(crate) struct Places<'a> {
    pub(crate) shards: &'a [Shard],
    pub(crate) caches: &'a Caches,
}

/// What an eviction holds from the first class that needs it to its end:
/// the buffers it took out of the caches' inboxes and has not evicted (put
/// back when it ends), the caches' owners locked out, and
/// `Caches::no_moves` (taken first, released last: the fields drop in
/// this order, after the inboxes' buffers are back).
#[derive(Default)]
struct Held<'a> {
    inboxes: Option<Vec<(&'a ThreadCache, Vec<Block>)>>,
    locked: Option<LockedOut<'a>>,
    moving: Option<MutexGuard<'a, ()>>,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        for (cache, blocks) in self.inboxes.take().into_iter().flatten() {
            for block in blocks {
                cache.inbox().ready.push(block);
            }
        }
    }
}

/// A slot's buffers as a trim sorts them: when each became ready, and the
/// buffer itself where the trim holds it (`None`: kept in a cache); and
/// the hold of the slot begun when the first came out of a cache.
#[derive(Default)]
struct Gathered<'a> {
    entries: Vec<(Option<Instant>, Option<Block>)>,
    holding: Option<Holding<'a>>,
}

/// The cap and the estimate; see the module docs.
#[derive(Debug)]
pub(crate) struct Admission {
    estimate: CachePadded<AtomicUsize>,
    /// Per cache (by address), the taken bytes already folded in.
    folded: Mutex<HashMap<usize, u64>>,
    peak: AtomicUsize,
    evictions: AtomicUsize,
    /// While the cap follows the working set, what it follows; `None` once
    /// a cap is given.
    follow: Mutex<Option<Follow>>,
    /// The generation of reservations: stamped on the blocks `reserve`
    /// asks for, and moved on by `clear`, which forgets every reservation
    /// made before it (a reserved buffer out at a clear, taken or in the
    /// cleaner, is an idle buffer like any other once back). Never 0 (a
    /// block's 0 means not reserved).
    reservations: AtomicU32,
    /// Per slot, a trim holding its buffers out of its stack, for the
    /// takes that would miss meanwhile.
    held_out: HeldOut,
}

/// What a cap that follows the working set follows.
#[derive(Debug)]
struct Follow {
    /// The least the cap may be (the pinned budget, where the backend
    /// pins, lowers it further).
    floor: usize,
    /// Bytes `reserve` asked for since the last `clear`.
    reserved: usize,
    /// The most footprint bytes in use at once over the provisioning
    /// window, as the last tick saw it.
    recent_in_use: u64,
}

impl Follow {
    /// The cap under a pinned `budget`: a quarter more than the recent
    /// bytes in use or the floor, whichever is more, plus the reserved
    /// bytes (which the bytes in use may count again once taken: the cap
    /// errs high), the budget bounding it all.
    fn cap(&self, budget: u64) -> usize {
        let budget = usize::try_from(budget).unwrap_or(usize::MAX);
        let in_use = self.recent_in_use.saturating_add(self.recent_in_use / 4);
        usize::try_from(in_use)
            .unwrap_or(usize::MAX)
            .max(self.floor)
            .saturating_add(self.reserved)
            .min(budget)
    }
}

impl Admission {
    /// `follow`: `Some(floor)` if the cap follows the working set, never
    /// below `floor`; `None` if a cap is given. `slots`: the pool's slots
    /// (devices times classes).
    pub(crate) fn new(follow: Option<usize>, slots: usize) -> Self {
        let follow = follow.map(|floor| Follow {
            floor,
            reserved: 0,
            recent_in_use: 0,
        });
        Self {
            estimate: CachePadded::new(AtomicUsize::new(0)),
            folded: Mutex::new(HashMap::new()),
            peak: AtomicUsize::new(0),
            evictions: AtomicUsize::new(0),
            follow: Mutex::new(follow),
            reservations: AtomicU32::new(1),
            held_out: HeldOut::new(slots),
        }
    }

    /// The generation of reservations now (see `reservations`). Relaxed:
    /// it orders nothing (a reader that decides by it, a trim or the
    /// cleaner, sees a clear's move a little late, and keeps a forgotten
    /// reservation's buffer until its next look); a reserve racing a clear
    /// may stamp the generation the clear ends, and its buffers are then
    /// idle ones like any other (a reservation the clear forgets; see
    /// [`reserved`](Self::reserved) for the cap), or the next one. Readers
    /// that walk many buffers read it per buffer, not once before the
    /// walk: a read from before a clear took a reservation made after it
    /// for a forgotten one (see `clear`).
    pub(crate) fn reservations(&self) -> u32 {
        self.reservations.load(Ordering::Relaxed)
    }

    /// What tells a take that a trim held its slot's pooled buffers out of
    /// its stack (see [`HeldOut`]).
    #[inline]
    pub(crate) fn held_out(&self) -> &HeldOut {
        &self.held_out
    }

    /// The cap in force and whether it follows the working set, read
    /// together.
    pub(crate) fn cap_and_follows(&self, at: Places<'_>) -> (usize, bool) {
        let follow = self.follow.lock();
        (at.caches.cap(), follow.is_some())
    }

    /// While the cap follows the working set, sets it for
    /// `recent_in_use` footprint bytes in use at most over the recent
    /// window, under the pinned budget (see [`Follow::cap`]): raised at
    /// once, lowered evicting down to it. Returns the evicted buffers to
    /// release.
    pub(crate) fn follow(&self, at: Places<'_>, recent_in_use: u64) -> Vec<Block> {
        let mut follow = self.follow.lock();
        let Some(follow) = follow.as_mut() else {
            return Vec::new();
        };
        follow.recent_in_use = recent_in_use;
        // The budget read under the lock: a setter that changed it then
        // follows again after us (`refollow`).
        self.move_cap(at, follow.cap(Self::budget(at)))
    }

    /// The pinned budget that bounds a following cap: none where the
    /// backend pins nothing (the host backend).
    fn budget(at: Places<'_>) -> u64 {
        if at.caches.intake.pins {
            at.caches.counters.max_pinned()
        } else {
            u64::MAX
        }
    }

    /// While the cap follows the working set, sets it again for the
    /// budget now (`set_max_pinned_bytes`). Returns the evicted buffers.
    pub(crate) fn refollow(&self, at: Places<'_>) -> Vec<Block> {
        let follow = self.follow.lock();
        let Some(follow) = follow.as_ref() else {
            return Vec::new();
        };
        self.move_cap(at, follow.cap(Self::budget(at)))
    }

    /// Whether `bytes` that `reserve` asks for fit: under a given cap, if
    /// they are at most the cap (`Err(cap)` if not); while the cap
    /// follows the working set, always.
    pub(crate) fn reserve_fits(&self, at: Places<'_>, bytes: usize) -> Result<(), usize> {
        let follow = self.follow.lock();
        let cap = at.caches.cap();
        if follow.is_none() && bytes > cap {
            return Err(cap);
        }
        Ok(())
    }

    /// While the cap follows the working set, `bytes` more reserved in
    /// the generation of reservations `generation`: the cap rises by them
    /// (it holds every byte reserved since the last `clear` on top of what
    /// it follows), under the pinned budget; not if a clear has forgotten
    /// that generation since (its buffers are idle ones like any other).
    pub(crate) fn reserved(&self, at: Places<'_>, bytes: usize, generation: u32) {
        let mut follow = self.follow.lock();
        // Under the lock `clear` moves the generation on under: either the
        // clear comes first (and this adds nothing), or it zeroes what this
        // adds.
        if self.reservations() != generation {
            return;
        }
        if let Some(follow) = follow.as_mut() {
            follow.reserved = follow.reserved.saturating_add(bytes);
            let cap = follow.cap(Self::budget(at));
            // Raising evicts nothing (see `move_cap`).
            let evicted = self.move_cap(at, cap.max(at.caches.cap()));
            debug_assert!(evicted.is_empty());
        }
    }

    /// Moves the cap to `cap`: raised at once, lowered evicting down to
    /// it. The caller holds `follow`. Returns the evicted buffers.
    fn move_cap(&self, at: Places<'_>, cap: usize) -> Vec<Block> {
        let now = at.caches.cap();
        if cap > now {
            // Raising needs no fence and evicts nothing: an admission that
            // reads the old, lower cap evicts or releases more than the new
            // one needs, and never leaves more pooled than it allows.
            at.caches.set_cap(cap);
            Vec::new()
        } else if cap < now {
            self.set_cap(at, cap)
        } else {
            Vec::new()
        }
    }

    /// Gives the cap: it stops following the working set, and is `bytes`
    /// from now on (see [`set_cap`](Self::set_cap)).
    pub(crate) fn give_cap(&self, at: Places<'_>, bytes: usize) -> Vec<Block> {
        let mut follow = self.follow.lock();
        *follow = None;
        self.set_cap(at, bytes)
    }

    /// Puts a ready `block` back, in `home`'s cache (the cache it was taken
    /// through) if given and it has room, else in its device's shard,
    /// keeping the pooled bytes under the cap. Returns the buffers to
    /// release: evicted ones, and `block` itself if it does not fit.
    pub(crate) fn admit(
        &self,
        at: Places<'_>,
        mut block: Block,
        home: Option<&Inbox>,
    ) -> Vec<Block> {
        // Idle from now on: idle trimming measures from here.
        block.meta_mut().ready_since = Some(Instant::now());
        let footprint = block.footprint();
        let cap = at.caches.cap();
        // Relaxed: the estimate guards a count, not data; its RMWs are
        // totally ordered among themselves, which is all the cap needs.
        if self.estimate.fetch_add(footprint, Ordering::Relaxed) + footprint <= cap {
            if let Err(block) = Self::place(at, block, home) {
                self.estimate.fetch_sub(footprint, Ordering::Relaxed);
                return vec![block];
            }
            // Pairs with the fence in `set_cap`; see the module docs.
            fence(Ordering::SeqCst);
            if at.caches.cap() < cap {
                return self.enforce(at);
            }
            return Vec::new();
        }
        self.estimate.fetch_sub(footprint, Ordering::Relaxed);
        let mut folded = self.folded.lock();
        self.fold(at, &mut folded);
        let cap = at.caches.cap();
        if footprint > cap {
            return vec![block];
        }
        let mut out = self.evict_to_fit(at, footprint, cap);
        // Eviction cannot reach bytes that a racing fast-path admission has
        // added but not placed yet: if those still leave no room, this
        // buffer is released rather than pooled over the cap. The check is
        // the RMW itself, so it is ordered with every racing fast path.
        if self.estimate.fetch_add(footprint, Ordering::Relaxed) + footprint > cap {
            self.estimate.fetch_sub(footprint, Ordering::Relaxed);
            out.push(block);
        } else if let Err(block) = Self::place(at, block, home) {
            self.estimate.fetch_sub(footprint, Ordering::Relaxed);
            out.push(block);
        }
        self.note_peak(at, &folded);
        out
    }

    /// Offers `block` to `home`, else its shard; hands it back if both are
    /// full.
    fn place(at: Places<'_>, block: Block, home: Option<&Inbox>) -> Result<(), Block> {
        match home {
            Some(home) if home.has_room(block.footprint()) => {
                home.ready.push(block);
                Ok(())
            }
            _ => at.shards[block.device()].push(block),
        }
    }

    /// Subtracts every cache's unfolded takes from the estimate.
    fn fold(&self, at: Places<'_>, folded: &mut HashMap<usize, u64>) {
        for cache in at.caches.iter() {
            let taken = cache.taken_bytes();
            let seen = folded
                .entry(cache as *const ThreadCache as usize)
                .or_insert(0);
            let delta = taken.saturating_sub(*seen);
            *seen = taken;
            self.estimate.fetch_sub(delta as usize, Ordering::Relaxed);
        }
    }

    /// Takes `bytes` out of the estimate, for pooled buffers the caller
    /// removed from a shard itself (after removing them: the estimate never
    /// under-counts).
    pub(crate) fn removed(&self, bytes: usize) {
        // Relaxed: as every change to the estimate.
        self.estimate.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Pooled footprint bytes (exact once the pool is quiet).
    pub(crate) fn pooled_bytes(&self, at: Places<'_>) -> usize {
        self.pooled_with(at, &self.folded.lock())
    }

    fn pooled_with(&self, at: Places<'_>, folded: &HashMap<usize, u64>) -> usize {
        let unfolded: u64 = at
            .caches
            .iter()
            .map(|c| {
                let seen = folded
                    .get(&(c as *const ThreadCache as usize))
                    .copied()
                    .unwrap_or(0);
                c.taken_bytes().saturating_sub(seen)
            })
            .sum();
        // Relaxed: a snapshot.
        self.estimate
            .load(Ordering::Relaxed)
            .saturating_sub(unfolded as usize)
    }

    /// Records the pooled bytes now as a peak candidate.
    fn note_peak(&self, at: Places<'_>, folded: &HashMap<usize, u64>) {
        let now = self.pooled_with(at, folded);
        // Relaxed: a statistic.
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    /// The most pooled bytes seen (at admissions past the cap's fast path,
    /// evictions and snapshots).
    pub(crate) fn peak(&self, at: Places<'_>) -> usize {
        self.note_peak(at, &self.folded.lock());
        self.peak.load(Ordering::Relaxed)
    }

    /// Restarts the peak from the pooled bytes now.
    pub(crate) fn reset_peak(&self, at: Places<'_>) {
        // Relaxed: a statistic.
        self.peak.store(self.pooled_bytes(at), Ordering::Relaxed);
    }

    /// Buffers evicted so far.
    pub(crate) fn evictions(&self) -> usize {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Sets the cap and evicts down to it at once, largest first. Returns
    /// the evicted buffers to release. The caller holds `follow`.
    fn set_cap(&self, at: Places<'_>, bytes: usize) -> Vec<Block> {
        at.caches.set_cap(bytes);
        // Pairs with the fence in `admit`; see the module docs.
        fence(Ordering::SeqCst);
        self.enforce(at)
    }

    /// Evicts at least `bytes` of pooled buffers (or every one), largest
    /// first, for the pinned budget. Returns them to release.
    pub(crate) fn shrink_by(&self, at: Places<'_>, bytes: usize) -> Vec<Block> {
        let mut folded = self.folded.lock();
        self.fold(at, &mut folded);
        // Relaxed: see `admit`; under the lock, with the takes folded.
        let target = self.estimate.load(Ordering::Relaxed).saturating_sub(bytes);
        self.evict_to_fit(at, 0, target)
    }

    /// Evicts until the pooled bytes fit the cap.
    fn enforce(&self, at: Places<'_>) -> Vec<Block> {
        let mut folded = self.folded.lock();
        self.fold(at, &mut folded);
        let out = self.evict_to_fit(at, 0, at.caches.cap());
        self.note_peak(at, &folded);
        out
    }

    /// Removes pooled buffers, largest class first, until `incoming` more
    /// bytes fit under `cap`. The caller holds the lock and has folded.
    fn evict_to_fit(&self, at: Places<'_>, incoming: usize, cap: usize) -> Vec<Block> {
        let mut evicted = Vec::new();
        let over = |this: &Self| this.estimate.load(Ordering::Relaxed) + incoming > cap;
        let classes = &at.caches.classes;
        // The caches are locked out once, at the first class whose shards
        // and inboxes leave the pool over the cap, and stay locked out to
        // the last class looked at: a lock-out costs a process-wide
        // barrier, and a cap below what is pooled in use would otherwise
        // pay one per class at every admission.
        let mut held = Held::default();
        for class in classes.all().rev() {
            if !over(self) {
                break;
            }
            self.evict_class(at, class, &mut evicted, &mut held, &over);
        }
        drop(held);
        if !evicted.is_empty() {
            let bytes: usize = evicted.iter().map(Block::footprint).sum();
            self.evictions.fetch_add(evicted.len(), Ordering::Relaxed);
            tracing::debug!(
                buffers = evicted.len(),
                bytes,
                cap,
                "pinpool: evicted pooled buffers to respect the cap"
            );
            if let Some(tracer) = &at.caches.trace {
                tracer.event(
                    crate::trace::EVICT,
                    0,
                    0,
                    0,
                    bytes as u64,
                    evicted.len() as u64,
                );
            }
        }
        evicted
    }

    /// Evicts buffers of `class` while `over`: shards first, then remote
    /// lists, then thread caches' ready lists (locking their owners out,
    /// into `held`, unless an earlier class did).
    fn evict_class<'a>(
        &self,
        at: Places<'a>,
        class: SizeClass,
        evicted: &mut Vec<Block>,
        held: &mut Held<'a>,
        over: &impl Fn(&Self) -> bool,
    ) {
        let take = |block: Block, evicted: &mut Vec<Block>| {
            self.estimate
                .fetch_sub(block.footprint(), Ordering::Relaxed);
            evicted.push(block);
        };
        for shard in at.shards {
            while over(self) && shard.len(class) > 0 {
                match shard.pop(class) {
                    Some(block) => take(block, evicted),
                    None => break,
                }
            }
        }
        if !over(self) {
            return;
        }
        // Every cache, not only those whose counts show the class: the
        // counts are hints that a racing collection can leave low, and
        // eviction must see every pooled buffer (see the module docs). The
        // inboxes are emptied once, at the first class that needs them,
        // and what is not evicted goes back when the eviction ends (see
        // `Held`), out of a snapshot's sight until then. Only one thread
        // evicts at a time (the admission lock); a steal that swaps a list
        // meanwhile adopts it inside its owner's operation, which the
        // lock-out below waits for.
        let inboxes = held.inboxes.get_or_insert_with(|| {
            held.moving.get_or_insert_with(|| at.caches.no_moves());
            at.caches
                .iter()
                .filter(|cache| !cache.inbox().ready.is_empty())
                .map(|cache| (cache, cache.inbox().ready.take_all().collect()))
                .collect()
        });
        for (_, blocks) in inboxes.iter_mut() {
            // Lazy: each buffer is looked at after the previous one's
            // eviction is counted.
            for block in blocks.extract_if(.., |b| b.class() == class && over(self)) {
                take(block, evicted);
            }
            if !over(self) {
                return;
            }
        }
        // The lock order is `moving`, then the caches' locks, as a sweep's
        // and a trim's.
        held.moving.get_or_insert_with(|| at.caches.no_moves());
        let locked = held
            .locked
            .get_or_insert_with(|| at.caches.lock_out(at.caches.iter()));
        locked.each(|cache, lists| {
            for device in 0..at.shards.len() {
                while over(self) {
                    match lists.steal_ready(cache, device, class) {
                        Some(block) => take(block, evicted),
                        None => break,
                    }
                }
            }
        });
        // A sweep may have moved buffers from a cache's lists to a shard
        // after the shards were looked at; with every cache locked, no more
        // can move.
        for shard in at.shards {
            while over(self) {
                match shard.pop(class) {
                    Some(block) => take(block, evicted),
                    None => break,
                }
            }
        }
    }

    /// Takes out, for the caller to release, pooled buffers that became
    /// ready at or before `cutoff` (a forced trim passes now: every one),
    /// in descending slot order (the last device's largest class first),
    /// except reserved ones and
    /// the `keep(slot)` most recent of each slot, and counts them in
    /// `trimmed_bytes`; buffers carved from a region that drains go
    /// however recently ready (reserved ones excepted).
    pub(crate) fn trim(
        &self,
        at: Places<'_>,
        cutoff: Instant,
        keep: &dyn Fn(usize) -> usize,
    ) -> Vec<Block> {
        let _folded = self.folded.lock();
        // Out of a snapshot's sight until every kept buffer is back.
        let _moving = at.caches.no_moves();
        let classes = &at.caches.classes;
        let count = classes.count();
        // Buffers carved from a region that drains go back to it, however
        // recently ready (see `Regions::drain_excess`).
        let draining: Vec<bool> = at.shards.iter().map(|s| s.regions().draining()).collect();
        let drains = |block: &Block| {
            draining[block.device()] && block.is_region_memory() && !block.region_listed()
        };
        let idle = |block: &Block| block.ready_since().is_some_and(|t| t <= cutoff);
        // The generation read per buffer (see `clear`).
        let reserved = |block: &Block| block.is_reserved_in(self.reservations());
        // Whether a buffer may be released (else it is kept, whatever the
        // `keep`).
        let may_go = |block: &Block| !reserved(block) && (idle(block) || drains(block));
        let mut slots: Vec<Gathered<'_>> = (0..at.caches.slots())
            .map(|_| Gathered::default())
            .collect();
        // The caches' ready buffers (inboxes and lists) that may go come
        // out, their slot held (see `HeldOut`) from before the first leaves
        // and while their owners are locked out, before any take can look;
        // those that stay are counted where they stand among their slot's
        // kept ones. Those in the lists stay put (a steal reads a list's
        // counts without locking its owner out: they never drop for a
        // buffer that stays, nor before its slot is held for one that
        // goes); those in an inbox are taken and pushed back: takes reach
        // an inbox's buffers only inside their own windows, which the
        // lock-out keeps them out of (a steal's Relaxed look at a cache's
        // counts, which add in its inbox's, may see them low meanwhile;
        // but a steal takes from the lists only, whose own count holds).
        // (Under the admission lock and with every owner locked out, as
        // `clear` does, nothing moves meanwhile but takes and admissions.)
        let mut locked = at.caches.lock_out(at.caches.iter());
        locked.each(|cache, lists| {
            // Whether `block` goes: if so, its slot is held from now on.
            let mut pick = |block: &Block| {
                let slot = classes.slot(block.device(), block.class());
                let gathered = &mut slots[slot];
                let goes = may_go(block);
                if goes {
                    gathered
                        .holding
                        .get_or_insert_with(|| self.held_out.hold(slot));
                } else {
                    gathered.entries.push((block.ready_since(), None));
                }
                goes
            };
            let inbox = &cache.inbox().ready;
            let mut going = Vec::new();
            if !inbox.is_empty() {
                for block in inbox.take_all().collect::<Vec<_>>() {
                    if pick(&block) {
                        going.push(block);
                    } else {
                        inbox.push(block);
                    }
                }
            }
            going.extend(lists.take_ready_picked(cache, &mut pick));
            for block in going {
                let slot = classes.slot(block.device(), block.class());
                slots[slot].entries.push((block.ready_since(), Some(block)));
            }
        });
        drop(locked);
        // Then each slot's buffers in its stack, one slot at a time: a take
        // of the slot meanwhile waits for the hold to end rather than miss,
        // and nothing in it calls out (no tracing) while it holds them. The
        // slots held already go first (their takes have waited since the
        // lock-out); what goes is handed out in descending slot order, as
        // before.
        let mut going: Vec<Vec<Block>> = (0..slots.len()).map(|_| Vec::new()).collect();
        let mut order: Vec<usize> = (0..slots.len()).rev().collect();
        // Stable: descending within the held and within the others.
        order.sort_by_key(|&slot| slots[slot].holding.is_none());
        for slot in order {
            let (device, class) = (slot / count, SizeClass::at(slot % count));
            let shard = &at.shards[device];
            let gathered = &mut slots[slot];
            if shard.len(class) == 0 && gathered.holding.is_none() {
                // A count that may lag a push under way: such a buffer was
                // just made ready (the sweeps, which move buffers long
                // ready, wait for `moving`), and would be kept.
                continue;
            }
            let holding = gathered
                .holding
                .take()
                .unwrap_or_else(|| self.held_out.hold(slot));
            let entries = &mut gathered.entries;
            entries.extend(
                std::iter::from_fn(|| shard.pop(class)).map(|b| (b.ready_since(), Some(b))),
            );
            // Most recently ready last: keep those, release the longest
            // idle. Every pooled buffer went through `admit`, which noted
            // when it became ready.
            entries.sort_by_key(|(ready, _)| *ready);
            let mut keep = keep(slot);
            let out = &mut going[slot];
            while let Some((_, block)) = entries.pop() {
                let Some(block) = block else {
                    // Kept where it stands, in a cache.
                    keep = keep.saturating_sub(1);
                    continue;
                };
                if reserved(&block) || (!idle(&block) || keep > 0) && !drains(&block) {
                    keep = keep.saturating_sub(1);
                    if let Err(block) = shard.push(block) {
                        // The shard's class is full (2^32 buffers).
                        out.push(block);
                    }
                } else {
                    out.push(block);
                }
            }
            drop(holding);
        }
        let out: Vec<Block> = going.into_iter().rev().flatten().collect();
        let bytes: usize = out.iter().map(Block::footprint).sum();
        self.estimate.fetch_sub(bytes, Ordering::Relaxed);
        // Counted before a snapshot can look again: one that sees the
        // buffers gone sees them trimmed.
        crate::stats::Counters::add(&at.caches.counters.trimmed_bytes, bytes as u64);
        if !out.is_empty() {
            tracing::debug!(buffers = out.len(), bytes, "pinpool: trimmed idle buffers");
        }
        out
    }

    /// Takes every pooled buffer out (shards, caches' ready and remote
    /// ready buffers) for the caller to release, but those reserved in the
    /// generation it begins (by a `reserve` that raced it).
    pub(crate) fn clear(&self, at: Places<'_>) -> Vec<Block> {
        // Reserved buffers go too: a cap that follows the working set no
        // longer holds room for them (the next tick lowers it).
        let mut follow = self.follow.lock();
        if let Some(follow) = follow.as_mut() {
            follow.reserved = 0;
        }
        // So do those out now, once back (skipping 0, which no reservation
        // bears). Moved on under the lock: two clears never store the same
        // next generation, and `reserved` sees it moved or adds before the
        // zeroing above. Relaxed: see `reservations`.
        let next = self.reservations().wrapping_add(1).max(1);
        self.reservations.store(next, Ordering::Relaxed);
        drop(follow);
        let _folded = self.folded.lock();
        // Out of a snapshot's sight until the kept buffers (below) are back.
        let _moving = at.caches.no_moves();
        let mut out = Vec::new();
        for shard in at.shards {
            out.extend(shard.drain());
        }
        for cache in at.caches.iter() {
            out.extend(cache.inbox().ready.take_all());
        }
        let mut locked = at.caches.lock_out(at.caches.iter());
        locked.each(|cache, lists| out.extend(lists.take_ready(cache)));
        // As in `evict_class`: what a sweep moved to a shard meanwhile.
        for shard in at.shards {
            out.extend(shard.drain());
        }
        drop(locked);
        // A `reserve` that read the new generation (it raced this clear,
        // after the store above) keeps its buffers: the cleaner may have
        // pooled some already, which the clear must not take while the rest
        // stay reserved, with the cap holding room for all of them. Read
        // per buffer, it sees any later clear too (a buffer stamped with a
        // generation was pooled after that generation's store).
        let (kept, mut out): (Vec<Block>, Vec<Block>) = out
            .into_iter()
            .partition(|block| block.is_reserved_in(self.reservations()));
        for block in kept {
            if let Err(block) = at.shards[block.device()].push(block) {
                // The shard's class is full (2^32 buffers): released.
                out.push(block);
            }
        }
        let bytes: usize = out.iter().map(Block::footprint).sum();
        self.estimate.fetch_sub(bytes, Ordering::Relaxed);
        out
    }
}
