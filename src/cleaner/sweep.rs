//! What worker 0 does between jobs: sweeps of the caches of threads that
//! went idle (their waiting buffers moved along, their ready ones to the
//! shards), which `flush` also runs at once over every cache, and the
//! provisioning tick (see [`Provisioner`](crate::provision::Provisioner)).

use crate::admission::Places;
use crate::alloc::Drained;
use crate::stats::Counters;
use crate::thread_cache::ThreadCache;
use crate::tune::{Tune, Tuning};
use std::time::{Duration, Instant};

use super::{
    cap_slack, cool, fit_regions_to_cap, release_all, release_region, release_regions,
    release_regions_over_budget, Cleaner, Env, FOLD_IDLE_AFTER,
};

/// The shortest time between two searches of the caches for buffers of
/// draining regions (see `Cleaner::pull_draining`): each locks their
/// owners out.
const PULL_EVERY_MIN: Duration = Duration::from_millis(100);

/// How long a region must have been wholly free before the provisioning
/// tick releases it for the cap (see `fit_regions_to_cap`).
const CAP_RELEASE_AFTER: std::time::Duration = std::time::Duration::from_millis(100);

impl Cleaner {
    /// Moves buffers waiting in `caches` for their owners to the cleaner:
    /// all of them (`flush`), or only those of caches whose owner has been
    /// idle since the last sweep, whose ready buffers (its lists' and its
    /// inbox's) also go to the shards
    /// (where any thread finds them without locking an owner out) and whose
    /// dropped buffers go there once clean.
    pub(crate) fn move_waiting(&self, at: Places<'_>, cap: usize, only_idle: bool) -> usize {
        let caches = at.caches;
        let mut sweep = self.sweep.lock();
        let candidates: Vec<&ThreadCache> = caches
            .iter()
            .filter(|c| {
                let activity = c.activity();
                let key = *c as *const ThreadCache as usize;
                let last = sweep.seen.insert(key, activity);
                if only_idle {
                    // The inbox's emptiness is a Relaxed read: a stale
                    // answer leaves its buffers to the next sweep, or looks
                    // at a cache that has nothing to move.
                    last == Some(activity)
                        && !c.is_waiting()
                        && (c.has_waiting() || c.has_ready() || !c.inbox().ready.is_empty())
                } else {
                    c.has_waiting()
                }
            })
            .collect();
        drop(sweep);
        let mut moved = 0;
        for cache in &candidates {
            for block in cache.take_returns() {
                self.intake
                    .submit_swept(cache.origin(cap, false), block, only_idle);
                moved += 1;
            }
        }
        // Ready buffers move to the shards (below) out of a snapshot's
        // sight. (Taken before the caches' locks, as a trim takes it.)
        let _moving = only_idle.then(|| caches.no_moves());
        let mut locked = caches.lock_out(candidates.into_iter());
        locked.each(|cache, lists| {
            for block in lists.take_deferred(cache) {
                self.intake
                    .submit_swept(cache.origin(cap, false), block, only_idle);
                moved += 1;
            }
            if only_idle {
                // The buffers the cleaner made ready for the owner since it
                // last took (its inbox) too: other threads' takes look in
                // an inbox only for their own class.
                let inbox = cache.inbox().ready.take_all();
                for block in lists.take_ready(cache).into_iter().chain(inbox) {
                    moved += 1;
                    if let Err(block) = at.shards[block.device()].push(block) {
                        // The shard's class is full (2^32 buffers): keep it.
                        lists.put_ready(cache, block);
                    }
                }
            }
        });
        moved
    }

    /// Turns idle sweeps off for good (`PoolBuilder::idle_sweeps`).
    #[cfg(feature = "testing")]
    pub(crate) fn stop_idle_sweeps(&self) {
        let mut sweep = self.sweep.lock();
        sweep.off = true;
        // Worker 0 then wakes as it does once sweeps find nothing.
        sweep.wait = Tune::SWEEP_MAX;
    }

    /// Worker 0, idle: sweeps caches whose owners went idle, backing off
    /// while sweeps find nothing.
    pub(super) fn sweep_if_due(&self, env: Env<'_>) {
        {
            let sweep = self.sweep.lock();
            if sweep.off || Instant::now() < sweep.due {
                return;
            }
        }
        let moved = self.move_waiting(env.places, env.places.caches.cap(), true);
        let mut sweep = self.sweep.lock();
        sweep.wait = if moved > 0 {
            Tune::SWEEP_MIN
        } else {
            (sweep.wait * 2).min(Tune::SWEEP_MAX)
        };
        sweep.due = Instant::now() + sweep.wait;
    }
}

impl Cleaner {
    /// While a region of any device drains, and at most every quarter of
    /// the idle-trim time (100 ms at least), takes the deferred buffers
    /// carved from draining regions out of the threads' caches (those
    /// other threads dropped into a cache included), where their owners
    /// would keep them, and a drain would wait for them until it is given
    /// up, if the owners took other sizes from then on: to the cleaner,
    /// which gives them back to their region once their copies are done and
    /// they are clean. (A take that would reuse one sends it there itself:
    /// see `Shared::take`'s `back_to_draining`. Buffers of region memory,
    /// carved or of a slab carved from one, are never ready in a cache's
    /// lists: the cleaner pools them in their shard.)
    /// Reserved ones stay, as they stay pooled while their region drains.
    /// Owners of caches holding deferred buffers are locked out meanwhile,
    /// busy ones too: at most four times a drain.
    fn pull_draining(&self, env: Env<'_>, idle_trim: Duration) {
        let at = env.places;
        if !at.shards.iter().any(|shard| shard.regions().draining()) {
            return;
        }
        {
            let every = (idle_trim / 4).max(PULL_EVERY_MIN);
            let mut sweep = self.sweep.lock();
            if sweep.pulled.is_some_and(|t| t.elapsed() < every) {
                return;
            }
            sweep.pulled = Some(Instant::now());
        }
        let caches = at.caches;
        let cap = caches.cap();
        // Relaxed hints: a cache whose buffers arrive after the look is
        // searched at the next pull.
        let candidates: Vec<&ThreadCache> = caches.iter().filter(|c| c.has_waiting()).collect();
        if candidates.is_empty() {
            return;
        }
        let mut locked = caches.lock_out(candidates.into_iter());
        locked.each(|cache, lists| {
            lists.collect_returns(cache);
            let picked = lists.take_deferred_picked(cache, |b| {
                // The generation read per buffer, as `cool` reads it.
                b.region_drains_hint() && !b.is_reserved_in(env.admission.reservations())
            });
            for block in picked {
                self.intake
                    .submit_swept(cache.origin(cap, false), block, false);
            }
        });
    }

    /// Brings the pinned bytes back within a budget lowered while buffers
    /// were out. A buffer dropped through the cleaner past the budget is
    /// released there (see `Cleaner::finish`), but one that comes back by
    /// another path (reused through its owner's cache and then swept to
    /// the shards, or given back to its region by a class gone cold, or by
    /// the cap's evictions) does not check the budget: past it, the idle
    /// buffers are evicted here, and the regions left wholly free go, at
    /// the next tick after they came back.
    fn fit_budget(&self, env: Env<'_>) {
        let counters = env.counters();
        // Relaxed reads, a snapshot: a stale excess evicts idle buffers
        // that fit (they are carved or pinned again at the next takes), a
        // stale fit leaves the excess to the next tick.
        let over = counters.pinned().saturating_sub(counters.max_pinned());
        if over == 0 {
            return;
        }
        let evicted = env
            .admission
            .shrink_by(env.places, usize::try_from(over).unwrap_or(usize::MAX));
        release_all(env.releaser(), evicted);
        release_regions_over_budget(env.releaser(), env.places.shards);
    }

    /// Runs a provisioning tick (see [`Provisioner`](crate::provision::Provisioner)): releases what it
    /// trimmed, moves a cap that follows the working set, and pins what it
    /// provisions. `force` trims now (`Pool::trim`).
    pub(crate) fn provision(&self, env: Env<'_>, force: bool) {
        let quiet = crate::flush::in_flight(env.places.caches.counts()) == 0;
        let plan = env
            .provisioner
            .tick(env.places, env.admission, quiet, force);
        // Counted in `trimmed_bytes` already (by `Admission::trim`).
        if let (Some(tracer), false) = (&env.places.caches.trace, plan.trimmed.is_empty()) {
            let trimmed: u64 = plan.trimmed.iter().map(|b| b.footprint() as u64).sum();
            tracer.event(
                crate::trace::TRIM,
                0,
                0,
                0,
                trimmed,
                plan.trimmed.len() as u64,
            );
        }
        release_all(env.releaser(), plan.trimmed);
        if plan.ticked {
            // Nothing while a cap is given.
            let evicted = env.admission.follow(env.places, plan.recent_in_use);
            release_all(env.releaser(), evicted);
        }
        if let Some(idle_trim) = env.provisioner.idle_trim() {
            // Regions wholly free for the idle-trim time go back too.
            release_regions(
                env.releaser(),
                env.places.shards,
                |_, idle| force || idle >= idle_trim,
                false,
            );
            // And regions that hold far more than the window's demand, but
            // that a few carves keep from being wholly free (or idle for
            // the idle-trim time), drain. Those
            // drained and wholly free went with `release_regions` above;
            // those not drained within the idle-trim time are carved from
            // again here.
            for (device, &demand) in plan.recent_demand.iter().enumerate() {
                let shard = &env.places.shards[device];
                for region in shard.regions().settle_drains(idle_trim) {
                    release_region(env.releaser(), device, region);
                }
                let Some(drained) = shard.regions().drain_excess(demand, idle_trim) else {
                    continue;
                };
                Counters::add(&env.counters().regions_drained, 1);
                if let Drained::Free(region) = drained {
                    release_region(env.releaser(), device, region);
                }
            }
        }
        if self.intake.regions && plan.ticked {
            let places = env.places;
            places
                .caches
                .note_draining(places.shards.iter().any(|s| s.regions().draining()));
            cool(env.releaser(), env.admission, env.places, env.provisioner);
            if let Some(idle_trim) = env.provisioner.idle_trim() {
                self.pull_draining(env, idle_trim);
            }
        }
        if plan.ticked {
            self.fit_budget(env);
        }
        if self.intake.regions {
            // A following cap keeps regions younger than an eighth of its
            // window, and, while idle trimming is on, an excess of an
            // eighth of itself (see `fit_regions_to_cap`).
            let (_, follows) = env.admission.cap_and_follows(env.places);
            let idle_trim = env.provisioner.idle_trim();
            let min_age = if follows {
                env.provisioner.window() / 8
            } else {
                Duration::ZERO
            };
            fit_regions_to_cap(
                env.releaser(),
                env.admission,
                env.places,
                CAP_RELEASE_AFTER,
                min_age,
                !follows,
                |cap| cap_slack(follows, idle_trim, cap),
            );
            if plan.ticked {
                // What a miss's growth may fold, or release on another
                // device, of what the cap left (see `Intake::fits_folding`).
                let elsewhere = Self::elsewhere_after(env);
                for (device, shard) in env.places.shards.iter().enumerate() {
                    let idle = shard.regions().idle_bytes(FOLD_IDLE_AFTER);
                    let released = shard.regions().idle_bytes(elsewhere);
                    self.intake.note_idle_regions(device, idle, released);
                }
            }
        }
        // Regions that fell short of what takes wanted at once grow by the
        // difference, here as well as when a miss comes back (which a full
        // backlog may have freed on the way). What a growth adds free
        // passes the cap's room only while misses are out (their buffers
        // come back as demand the regions then meet), and only if the
        // regions need it (demand past what they hold, or a buffer no
        // extent holds): growth ahead of demand past the room would be
        // released by the cap, and grown again at the next tick. A growth
        // that fails is not retried at every tick by itself: the next
        // miss, or demand held past the regions, asks for it again.
        // The room is counted only when some regions fall short (it locks
        // the admission's folded counts and every region's extents).
        let room_now = || {
            let free: usize = env
                .places
                .shards
                .iter()
                .map(|s| s.free_extent_bytes())
                .sum();
            env.places
                .caches
                .cap()
                .saturating_sub(env.admission.pooled_bytes(env.places) + free)
        };
        let mut room: Option<usize> = None;
        for (device, shard) in env.places.shards.iter().enumerate() {
            let regions = shard.regions();
            let peek = regions.shortfall();
            if peek.want == 0 {
                continue;
            }
            // Taken again under the lock (below): another worker may have
            // grown them. One that is growing them now keeps the lock for
            // milliseconds: this worker leaves them to it (the next tick
            // looks again) and goes on recycling.
            let Some(_growing) = regions.try_growing() else {
                continue;
            };
            // Demand still rising (a burst of takes under way): grown once
            // it settles, for the whole burst.
            if regions.rising() {
                continue;
            }
            // A merge adds no bytes: neither the cap's room nor the pinned
            // budget holds it back (a miss it is for may have been freed on
            // its way back, the budget having no room for its own bytes).
            if peek.merge > 0 {
                let short = regions.take_shortfall();
                if Self::merge(env, device, regions, short) {
                    continue;
                }
                regions.unmet_merge(short);
            }
            // Relaxed: see `Intake::misses_out`; a stale 0 holds a growth
            // for misses back until they return (`carve_for`).
            let missed = self.intake.misses_out(device);
            let left = *room.get_or_insert_with(room_now);
            if peek.want > left && (missed == 0 || peek.need == 0) {
                continue;
            }
            // A shortfall the pinned budget cannot meet even in part, with
            // misses out: left to them. Taken here and refused, it would be
            // gone when they come back, and they would be freed rather than
            // grow the regions by what the budget allows for themselves
            // (see `Cleaner::carve_for`). Relaxed reads, a hint: a stale
            // one tries a growth the admission refuses, as before.
            if missed > 0
                && !env
                    .counters()
                    .fits_pinned(regions.fit_len(peek.least()) as u64)
            {
                continue;
            }
            let short = regions.take_shortfall();
            // At least what the demand passes the regions by, or a missed
            // buffer no extent holds, when the budget or a failed
            // registration makes the growth smaller (the shortfall is taken:
            // the misses coming back find nothing left to grow for); growth
            // ahead of demand all or nothing.
            if short.want > 0
                && Self::grow(
                    env,
                    device,
                    regions,
                    short.want,
                    (short.least(), short.whole),
                    None,
                )
            {
                room = Some(left.saturating_sub(short.want));
            }
        }
        if plan.provision.is_empty() {
            return;
        }
        let orphan = &env
            .places
            .caches
            .iter()
            .last()
            .expect("the orphan cache is last");
        let cap = env.places.caches.cap();
        for mut block in plan.provision {
            orphan.open_ahead(&mut block);
            self.intake.submit_ahead(orphan.origin(cap, false), block);
        }
    }
}
