//! The take path: own cache, shard, borrow, steal, carve, a wait for its
//! own copies, miss (see the parent module).

use crate::alloc::Block;
use crate::buffer::PinnedBuffer;
use crate::cleaner::Returned;
use crate::error::Error;
use crate::size_class::SizeClass;
use crate::sync::{Arc, Ordering};
use crate::thread_cache::{Caches, Found, Own, ThreadCache};
use crate::trace::Source;
use crate::tune::{Tune, Tuning};
use std::time::{Duration, Instant};

use super::Shared;

/// The most idle buffers of smaller classes that one take gives back to
/// their regions to carve its own (see `Shared::carve`).
const RECLAIM_MAX: usize = 32;

/// The most holds of its slot by trims (see `HeldOut`) that a take which
/// found its slot empty waits for before it goes on to carve or miss.
const HOLDS_WAITED: usize = 4;

/// The shortest pause between two polls of a take's wait for its own
/// copy (see [`pause_before_poll`]).
const WAIT_POLL_MIN: Duration = Duration::from_micros(2);

/// Spins from `now` for a quarter of the time waited since `start` (at
/// least [`WAIT_POLL_MIN`], and not past `until`), the pause before a wait's
/// next poll (see `Shared::wait_briefly`); returns the time it stopped.
fn pause_before_poll(start: Instant, mut now: Instant, until: Instant) -> Instant {
    let next = (now + ((now - start) / 4).max(WAIT_POLL_MIN)).min(until);
    while now < next {
        for _ in 0..16 {
            std::hint::spin_loop();
        }
        now = Instant::now();
    }
    now
}

/// How long a take waiting for its own copies goes on while no buffer of
/// the pool is made ready (see `Shared::wait_for_own`): long enough that
/// a loaded machine's preemptions (a copy engine emulated on two cores
/// stood still for 20 ms at a time, and its loops missed) do not pass for
/// streams waiting on something else.
const STILL: Duration = Duration::from_millis(100);

impl Shared {
    /// The take path; see the module docs. `caches` is `this.caches`,
    /// reached from the handle without going through `this` (a take served
    /// by the calling thread's own lists reads nothing else of the pool).
    #[inline]
    pub(super) fn take(
        this: &Arc<Self>,
        caches: &Caches,
        device: usize,
        min_size: usize,
    ) -> Result<PinnedBuffer, Error> {
        let class = caches.classes.class_for(min_size)?;
        if device >= caches.devices() {
            return Err(Error::UnknownDevice {
                device,
                devices: caches.devices(),
            });
        }
        let (cache, owned) = caches.local();
        let found = if owned {
            cache.take(device, class)
        } else {
            None
        };
        let block = match found {
            Some(Found::Ready(block)) => {
                cache.count_hit(block.slot(), block.footprint());
                Some((block, Source::Ready))
            }
            Some(Found::Deferred(block, behind)) => this
                .reuse_own(cache, block, behind, device, class)
                .map(|b| (b, Source::Deferred)),
            // Nothing of the class in its lists: one another thread dropped,
            // waiting in the batch not yet full.
            None if owned => this
                .reuse_returned(cache, device, class)
                .map(|b| (b, Source::Deferred)),
            None => None,
        };
        if let Some((mut block, source)) = block {
            // The cache's own lists hold blocks of their slot's class only.
            let len = block.len();
            if let Some(ring) = cache.ring() {
                let named = (len == caches.classes.size(class)).then(|| class.index());
                cache.trace_take(ring, &mut block, true, min_size, len, named, source);
            }
            return Ok(PinnedBuffer::new(block, cache, true, len));
        }
        let (mut block, source) = Self::take_slow(this, cache, owned, device, class)?;
        // A borrowed block is longer than the class asked for: the buffer
        // shows the class's length.
        let len = this.classes().size(class);
        if let Some(ring) = cache.ring() {
            cache.trace_take(
                ring,
                &mut block,
                owned,
                min_size,
                len,
                Some(class.index()),
                source,
            );
        }
        Ok(PinnedBuffer::new(block, cache, source.is_hit(), len))
    }

    /// The owner's reuse of its own oldest deferred buffer of (`device`,
    /// `class`). If its copies are still running, an idle buffer of the
    /// class that another thread dropped, waiting in the batch not yet full,
    /// serves the take instead (the own one goes back first in line);
    /// failing that, if more of the class are in flight behind it, the take
    /// waits for it a little (see [`SELF_WAIT`]) rather than miss.
    ///
    /// [`SELF_WAIT`]: crate::tune::Tuning::SELF_WAIT
    #[inline]
    fn reuse_own(
        &self,
        cache: &ThreadCache,
        mut block: Block,
        behind: usize,
        device: usize,
        class: SizeClass,
    ) -> Option<Block> {
        if matches!(block.fences_mut().poll(), Ok(false)) {
            if let Some(returned) = self.reuse_returned(cache, device, class) {
                cache.put_back(block);
                return Some(returned);
            }
            if behind < Tune::SELF_WAIT_BEHIND || !cache.may_wait(self.now_us()) {
                // Polled just now: `reuse` would poll again only to put it
                // back.
                cache.put_back(block);
                return None;
            }
            let waiting = cache.waiting();
            cache.count_own_wait(Self::wait_briefly(&mut block), false);
            let reused = self.reuse(cache, cache, block);
            if reused.is_none() {
                // The take goes on to `take_slow`, whose own wait adds its
                // time only, and which keeps the owner marked waiting
                // until it ends.
                cache.note_take_counted();
                waiting.go_on();
            }
            return reused;
        }
        self.reuse(cache, cache, block)
    }

    /// The owner's take when its lists have no buffer of the class it can
    /// hand out now (none, or its own still being copied from): an idle one
    /// another thread dropped, waiting in the batch not yet full (see
    /// [`ThreadCache::take_returned`]).
    #[cold]
    #[inline(never)]
    fn reuse_returned(
        &self,
        cache: &ThreadCache,
        device: usize,
        class: SizeClass,
    ) -> Option<Block> {
        let block = cache.take_returned(device, class)?;
        self.reuse(cache, cache, block)
    }

    /// A deferred buffer of `home` whose region drains (see
    /// `Regions::drain_excess`) is not reused: it goes to the cleaner,
    /// which gives it back to its region once its copies are done, so that
    /// the drain ends (a buffer its owner kept reusing from its own list
    /// held a drain until it was given up). `None`: the take goes on.
    #[cold]
    #[inline(never)]
    fn back_to_draining(&self, home: &ThreadCache, block: Block) -> Option<Block> {
        self.caches
            .intake
            .submit(home.origin(self.caches.cap(), false), block);
        None
    }

    /// The owner's last resort before a miss: one of its own dropped
    /// buffers of (`device`, `class`) whose copies have ended, waiting for
    /// them if two or more are in flight, for as long as the pool's other
    /// copies keep ending (some buffer made ready within the last
    /// [`STILL`]), up to [`MISS_WAIT`].
    ///
    /// A thread whose copies queue up behind each other while the pool has
    /// nothing else to give, and while others' copies end, is running
    /// ahead of a busy copy engine that serves its stream late (one engine
    /// shared by many streams can leave some of them unserved for hundreds
    /// of milliseconds): a pageable buffer would queue one more copy behind
    /// the same engine, and its returned miss would wait for a growth of
    /// the regions whose registration waits for that engine too. The wait
    /// still counts as demand, as a miss does: a pipeline whose copies take
    /// long would run further ahead with more memory, and the regions grow
    /// for it, once; its next takes carve instead of waiting.
    ///
    /// Where no copy of the pool ends at all, its streams wait on something
    /// else (a kernel, an event): the take misses, and its thread's takes
    /// do not wait for their own copies for the next [`STILL`] (a burst of
    /// takes behind a long kernel would wait in vain at each); after a
    /// wait of the whole [`MISS_WAIT`] that ends in a miss, for as long
    /// again. `None` as well if it has fewer than two in flight (one slow
    /// copy is not a queue: the take misses at once, as it did).
    ///
    /// Once a millisecond the wait looks at the shard again (a buffer made
    /// ready meanwhile serves the take) and polls every deferred buffer of
    /// the class, not only the oldest few; every [`SELF_WAIT`] it tries a
    /// steal (a ready buffer in another thread's cache).
    ///
    /// [`SELF_WAIT`]: crate::tune::Tuning::SELF_WAIT
    /// [`MISS_WAIT`]: crate::tune::Tuning::MISS_WAIT
    #[cold]
    #[inline(never)]
    fn wait_for_own(
        &self,
        cache: &ThreadCache,
        device: usize,
        class: SizeClass,
        counted: bool,
    ) -> Option<(Block, Source)> {
        let may_wait = cache.may_wait(self.now_us());
        let _waiting = cache.waiting();
        // Counts the wait, however the take ends, once it has begun.
        let mut counted = CountedWait {
            cache,
            start: Instant::now(),
            waited: false,
            again: counted,
        };
        // Buffers made ready so far: re-zeroed by their owners, and by the
        // cleaner (each after its copies ended). Relaxed counters, read
        // once a millisecond: a stale sum sees progress a poll late (the
        // wait ends up to a millisecond later than `STILL`) or, the
        // counters only growing, never sees progress that did not happen.
        let ready = || {
            self.caches.iter().map(ThreadCache::cleaned).sum::<u64>()
                + self.counters().recycled.load(Ordering::Relaxed)
        };
        let start = counted.start;
        let (mut seen, mut moved) = (ready(), start);
        let (mut looked, mut stolen) = (start, start);
        let mut polls = 4;
        let mut noted = false;
        loop {
            match cache.take_done(device, class, polls) {
                Own::Ready(block) => {
                    cache.count_hit(block.slot(), block.footprint());
                    return Some((block, Source::Ready));
                }
                Own::Done(block) => {
                    return self
                        .reuse(cache, cache, block)
                        .map(|b| (b, Source::Deferred))
                }
                // (Once waiting, one left in flight is still waited for: a
                // thief may hold the other a moment before handing it back.)
                Own::None => return None,
                Own::Running(0..=1) if !noted => return None,
                Own::Running(_) if !may_wait => return None,
                Own::Running(_) => {}
            }
            polls = 4;
            if !noted {
                // The demand a miss would have noted (see `take_slow`).
                noted = true;
                counted.waited = true;
                self.note_short(device, class);
            }
            let now = Instant::now();
            if now - start >= Tune::MISS_WAIT {
                // Copies elsewhere ended all along, its own not: its
                // stream waits on something else too. Its takes then do
                // not wait for as long as this one did (at most half its
                // time goes to waits that end in a miss).
                cache.no_waits_for(self.now_us() + (now - start).as_micros() as u64);
                return None;
            }
            // Spinning with growing pauses for the first millisecond (a
            // quarter of the time waited so far, as in `wait_briefly`),
            // then sleeping between polls: a thread that waits long leaves
            // the cores to the cleaner and the driver.
            let spin_until = start + Duration::from_millis(1);
            if now < spin_until {
                pause_before_poll(start, now, spin_until);
                continue;
            }
            if now - looked >= Duration::from_millis(1) {
                looked = now;
                if let Some(block) = self.shards[device].pop(class) {
                    cache.count_hit(block.slot(), block.footprint());
                    return Some((block, Source::Shard));
                }
                // Other threads' caches less often: a steal locks their
                // owners out.
                if now - stolen >= Tune::SELF_WAIT {
                    stolen = now;
                    if let Some(block) = self.steal(cache, true, device, class) {
                        return Some((block, Source::Stolen));
                    }
                }
                polls = usize::MAX;
                let now_ready = ready();
                if now_ready != seen {
                    (seen, moved) = (now_ready, now);
                } else if now - moved >= STILL {
                    cache.no_waits_for(self.now_us() + STILL.as_micros() as u64);
                    return None;
                }
            }
            std::thread::sleep(Tune::POLL);
        }
    }

    /// Notes the demand of a take of (`device`, `class`) that found
    /// nothing and waits for its own copies, as a miss notes it (see
    /// `take_slow`), the take's own buffer included: for the cap that
    /// follows the working set, and for the regions' growth.
    fn note_short(&self, device: usize, class: SizeClass) {
        let classes = self.classes();
        let slab = classes.per_slab(class) > 1;
        let len = if slab {
            crate::alloc::slab_len(classes)
        } else {
            classes.footprint(class)
        };
        let mut in_use = crate::provision::in_use_now(self.places());
        in_use[classes.slot(device, class)] += 1;
        self.provisioner.note_found(self.places(), &in_use);
        if self.caches.carves() {
            let demand = crate::provision::demand_from(self.places(), device, &in_use);
            self.shards[device].regions().note_miss(demand, len);
        }
    }

    /// Microseconds since the pool was built (the clock of the steal rate
    /// limit and of [`ThreadCache::may_wait`]).
    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// Polls `block`'s fences with growing pauses, for at most
    /// [`SELF_WAIT`]; how long it waited. The pause before each poll is a
    /// quarter of the time waited so far (at least [`WAIT_POLL_MIN`]), so
    /// the take sees its copy end at most a quarter (or that minimum) late:
    /// a copy queued behind a few dozen others on a shared copy engine ends
    /// within tens of microseconds, and a pause that doubled each time saw
    /// it up to twice as late. The pauses still grow, so a wait of the
    /// whole 20 ms polls about 40 times: many threads waiting do not hammer
    /// the driver.
    ///
    /// [`SELF_WAIT`]: crate::tune::Tuning::SELF_WAIT
    #[cold]
    fn wait_briefly(block: &mut Block) -> Duration {
        let start = Instant::now();
        let deadline = start + Tune::SELF_WAIT;
        let mut now = start;
        while now < deadline {
            now = pause_before_poll(start, now, deadline);
            if !matches!(block.fences_mut().poll(), Ok(false)) {
                break;
            }
        }
        now - start
    }

    /// Re-zeroes a deferred buffer of `home` for `taker` if its fences have
    /// completed; otherwise hands it back (to `home` if the taker owns it,
    /// else to the cleaner).
    #[inline]
    fn reuse(&self, taker: &ThreadCache, home: &ThreadCache, mut block: Block) -> Option<Block> {
        // Every reuse of a deferred buffer ends here (one still copying is
        // put back first, and comes here once done). The hint is read
        // through the cache: the line its drops read, not the pool's.
        if taker.caches().draining() && block.region_drains_hint() {
            return self.back_to_draining(home, block);
        }
        let owner = std::ptr::eq(taker, home);
        match block.fences_mut().poll() {
            Ok(true) => {
                block.zero_dirty();
                block
                    .take_ticket()
                    .expect("a deferred block was dropped")
                    .close(owner);
                taker.count_cleaned();
                taker.count_hit(block.slot(), 0);
                Some(block)
            }
            Ok(false) if owner => {
                home.put_back(block);
                None
            }
            Ok(false) => {
                self.caches
                    .intake
                    .submit(home.origin(self.caches.cap(), false), block);
                None
            }
            Err(e) => {
                Returned::new(block, home.inbox(), self.counters()).fail_now(self.env(), &e);
                None
            }
        }
    }

    /// The take past the calling thread's own lists (`owned`: whether the
    /// thread owns `cache`, as [`Caches::local`] found).
    #[cold]
    fn take_slow(
        this: &Arc<Self>,
        cache: &ThreadCache,
        owned: bool,
        device: usize,
        class: SizeClass,
    ) -> Result<(Block, Source), Error> {
        Self::start_cleaner(this);
        // Whether `reuse_own` counted this take's wait already (only an
        // owner's take waits).
        let counted = owned && cache.take_counted();
        // The owner stays marked waiting, as `reuse_own` left it, until this
        // take ends.
        let _waiting = counted.then(|| cache.still_waiting());
        // Before the look at the shard: a trim that holds the slot's
        // buffers out of its stack from here on makes the take wait for
        // them below, rather than miss.
        let slot = this.classes().slot(device, class);
        let mark = this.admission.held_out().mark(slot);
        if let Some(block) = this.shards[device].pop(class) {
            cache.count_hit(block.slot(), block.footprint());
            return Ok((block, Source::Shard));
        }
        // With regions, a class of whole pages is served by splitting (see
        // `carve`), not by lending a larger buffer whole.
        let splits = this.caches.carves() && this.classes().per_slab(class) == 1;
        if let Some(block) = (!splits)
            .then(|| this.borrow(cache, owned, device, class))
            .flatten()
        {
            // Counted in the class served, so taken bytes stay exact.
            cache.count_hit(block.slot(), block.footprint());
            cache.count_borrowed();
            return Ok((block, Source::Borrowed));
        }
        if let Some(block) = this.steal(cache, owned, device, class) {
            return Ok((block, Source::Stolen));
        }
        // What a trim kept of the slot is back in its stack once the hold
        // ends; a trim that held the slot again before the take looked (a
        // loop of `Pool::trim`) is waited for too, a few times at most.
        // (A borrow is not tried again: a trim holding the larger classes
        // it looked at can still make it miss.)
        let mut mark = mark;
        for _ in 0..HOLDS_WAITED {
            if !this.admission.held_out().waited(mark) {
                break;
            }
            mark = this.admission.held_out().mark(slot);
            if let Some(block) = this.shards[device].pop(class) {
                cache.count_hit(block.slot(), block.footprint());
                return Ok((block, Source::Shard));
            }
        }
        if this.caches.carves() {
            if let Some(block) = this.carve(cache, owned, device, class) {
                return Ok((block, Source::Carved));
            }
        }
        if owned {
            if let Some(found) = this.wait_for_own(cache, device, class, counted) {
                return Ok(found);
            }
        }
        let block = Block::allocate(this.classes(), class, device, this.shards[device].node())?;
        cache.count_miss(block.slot());
        // What is in use now, this buffer included: for the cap that
        // follows the working set, and for the regions' demand below.
        let in_use = crate::provision::in_use_now(this.places());
        this.provisioner.note_found(this.places(), &in_use);
        let mut set = None;
        if this.caches.carves() {
            let regions = this.shards[device].regions();
            let demand = crate::provision::demand_from(this.places(), device, &in_use);
            if block.in_slab() {
                // A page for a slab: too little to count among the misses
                // out (see `Intake::misses_out`), but the regions make
                // room for it.
                regions.note_miss(demand, block.carve_len(this.classes()));
            } else {
                let footprint = block.footprint();
                let out = this.caches.intake.note_miss(device, footprint);
                regions.note_miss(demand, footprint);
                set = Some((regions, out));
            }
        }
        // What the regions held when the take found nothing: their figures
        // take their locks, so only when traced.
        let held = set
            .filter(|_| tracing::enabled!(tracing::Level::TRACE))
            .map(|(regions, out)| (regions.figures(), out));
        tracing::trace!(
            bytes = block.len(),
            device,
            misses_out = held.map(|(_, out)| out),
            region_bytes = held.map(|(f, _)| f.bytes),
            free = held.map(|(f, _)| f.free),
            largest_free = held.map(|(f, _)| f.largest_free),
            "pinpool: pool miss, allocated a pageable buffer"
        );
        Ok((block, Source::Miss))
    }

    /// A block of `class` carved from the device's regions: from a free
    /// extent if one holds it, else from the space of an idle buffer of the
    /// next larger class that has one ready, or of idle buffers of smaller
    /// classes, given back to their region for it (so that memory moves
    /// from a class not in demand to one that is). Only classes that are
    /// not hot give their idle buffers up: a hot class keeps them for its
    /// own next takes (see `Provisioner::is_hot`). A sub-page class carves
    /// a page for a slab: the take gets its head, its shard the rest.
    #[cold]
    fn carve(
        &self,
        taker: &ThreadCache,
        owned: bool,
        device: usize,
        class: SizeClass,
    ) -> Option<Block> {
        let classes = self.classes();
        let slab = classes.per_slab(class) > 1;
        let shard = &self.shards[device];
        let footprint = if slab {
            crate::alloc::slab_len(classes)
        } else {
            classes.footprint(class)
        };
        let regions = shard.regions();
        let carve = || {
            let at = regions.carve(footprint)?;
            let block = if slab {
                let mut head = Block::carved_slab(classes, class, device, at);
                for sibling in head.carve() {
                    let evicted = self.admission.admit(self.places(), sibling, None);
                    crate::cleaner::release_all(self.releaser(), evicted);
                }
                head
            } else {
                Block::carved(classes, class, device, at)
            };
            // Not from the pooled buffers' estimate: free extents are not
            // in it.
            taker.count_hit(block.slot(), 0);
            taker.count_carved();
            // (A stale 0 from a racing miss skips the notes: that miss
            // noted the demand itself.)
            if self.caches.intake.misses_out(device) > 0 {
                // Misses of the device are still out: the regions hold less
                // than is wanted now, this take included, and must grow by
                // the difference once the misses come back (else the same
                // demand misses again, the space grown for the misses
                // having gone to this take). The cap that follows the
                // working set counts it too.
                let in_use = crate::provision::in_use_now(self.places());
                regions.note_miss(
                    crate::provision::demand_from(self.places(), device, &in_use),
                    0,
                );
                self.provisioner.note_found(self.places(), &in_use);
            }
            Some(block)
        };
        if let Some(block) = carve() {
            return Some(block);
        }
        // Classes carved from the regions (not from slabs): only their
        // space can serve this take; and not hot (a hot class's idle
        // buffers are its next takes').
        let donor = |c: SizeClass| {
            classes.per_slab(c) == 1 && !self.provisioner.is_hot(classes.slot(device, c))
        };
        let larger = || {
            (class.index() + 1..classes.count())
                .map(SizeClass::at)
                .filter(|&c| donor(c))
        };
        let idle = owned
            .then(|| taker.borrow_ready(device, larger()))
            .flatten()
            .or_else(|| larger().find_map(|larger| shard.pop(larger)));
        if let Some(idle) = idle {
            return self.give_up_idle(idle).then(carve).flatten();
        }
        // Idle buffers of smaller classes carved, given back until
        // their space, with its free neighbours, holds this one.
        let mut given = 0;
        for smaller in (0..class.index())
            .rev()
            .map(SizeClass::at)
            .filter(|&c| donor(c))
        {
            while given < RECLAIM_MAX {
                let Some(idle) = shard.pop(smaller) else {
                    break;
                };
                if !self.give_up_idle(idle) {
                    break;
                }
                given += 1;
                if let Some(block) = carve() {
                    return Some(block);
                }
            }
        }
        None
    }

    /// Takes `idle`, a pooled buffer the caller removed from its lists or
    /// its shard, out of the pool's estimate and gives it back to its
    /// region; one that is not region memory or was pinned on request for
    /// its class is admitted again instead (false).
    fn give_up_idle(&self, idle: Block) -> bool {
        self.admission.removed(idle.footprint());
        if !idle.is_carved() || idle.is_reserved_in(self.admission.reservations()) {
            let evicted = self.admission.admit(self.places(), idle, None);
            crate::cleaner::release_all(self.releaser(), evicted);
            return false;
        }
        crate::cleaner::give_back(self.releaser(), idle);
        true
    }

    /// An idle ready buffer of a larger class within the borrowing slack:
    /// from the taker's own lists, then the shard. It keeps its class, and
    /// goes back to it when dropped.
    fn borrow(
        &self,
        taker: &ThreadCache,
        owned: bool,
        device: usize,
        class: SizeClass,
    ) -> Option<Block> {
        let slack = self.borrow_slack;
        if slack == 0 {
            return None;
        }
        let classes = self.classes();
        if owned {
            if let Some(block) = taker.borrow_ready(device, classes.borrowable(class, slack)) {
                return Some(block);
            }
        }
        classes
            .borrowable(class, slack)
            .find_map(|larger| self.shards[device].pop(larger))
    }

    /// Takes a buffer of (`device`, `class`) from another thread's cache:
    /// its remote list, then (locking its owner out) its ready and deferred
    /// lists. A deferred buffer whose copies still run (polled once the
    /// owners are let go) goes back to its owner.
    #[cold]
    fn steal(
        &self,
        taker: &ThreadCache,
        owned: bool,
        device: usize,
        class: SizeClass,
    ) -> Option<Block> {
        let classes = self.classes();
        let slot = classes.slot(device, class);
        let others = || self.caches.iter().filter(move |c| !std::ptr::eq(*c, taker));
        if owned {
            if let Some(block) = taker.adopt_remote_lists(device, class) {
                taker.count_hit(block.slot(), block.footprint());
                return Some(block);
            }
        }
        // Locking owners out interrupts every running thread: at most once
        // per `STEAL_EVERY` per thread. Idle caches are swept to the shards
        // by the cleaner meanwhile (unless a test turned idle sweeps off).
        let now = self.epoch.elapsed().as_micros() as u64;
        if !taker.may_steal(now, Tune::STEAL_EVERY.as_micros() as u64) {
            return None;
        }
        let candidates = others().filter(|c| c.ready_in(slot) > 0 || c.has_waiting());
        let mut locked = self.caches.lock_out(candidates);
        let mut ready = None;
        let mut deferred = None;
        locked.each(|cache, lists| {
            // Buffers other threads dropped into the cache wait in its
            // batches until its owner collects them, which a busy owner
            // whose own classes never run out does not.
            lists.collect_returns(cache);
            if ready.is_none() {
                ready = lists.steal_ready(cache, device, class);
            }
            if ready.is_none() && deferred.is_none() {
                deferred = lists
                    .steal_deferred(cache, device, class)
                    .map(|b| (b, std::ptr::from_ref(cache)));
            }
        });
        drop(locked);
        if let Some(block) = ready {
            taker.count_hit(block.slot(), block.footprint());
            if let Some((mut deferred, home)) = deferred {
                // SAFETY: caches live as long as the pool.
                let home = unsafe { &*home };
                if matches!(deferred.fences_mut().poll(), Ok(false)) {
                    // Still being copied from: back to its owner (below).
                    home.hand_back(deferred);
                } else {
                    self.caches
                        .intake
                        .submit(home.origin(self.caches.cap(), false), deferred);
                }
            }
            return Some(block);
        }
        let (mut block, home) = deferred?;
        // SAFETY: caches live as long as the pool.
        let home = unsafe { &*home };
        if matches!(block.fences_mut().poll(), Ok(false)) {
            // Still being copied from: back to its owner, whose own takes
            // wait for it (in the cleaner it would wait for the same copy,
            // while its owner, finding its lists short, looked for more).
            home.hand_back(block);
            return None;
        }
        self.reuse(taker, home, block)
    }
}

/// Counts a wait of [`Shared::wait_for_own`] in its cache when it ends, if
/// the take waited (it may return at its first look): its time only if
/// `again` (the take's wait in `reuse_own` counted the take).
struct CountedWait<'a> {
    cache: &'a ThreadCache,
    start: Instant,
    waited: bool,
    again: bool,
}

impl Drop for CountedWait<'_> {
    fn drop(&mut self) {
        if self.waited {
            self.cache.count_own_wait(self.start.elapsed(), self.again);
        }
    }
}
