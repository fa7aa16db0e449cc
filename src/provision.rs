//! Pinned memory spent well over time: provisioning ahead of demand and
//! trimming what sits idle.
//!
//! The cleaner's worker 0 ticks this every few milliseconds while the pool
//! is in use. Each tick reads, per slot (device and class), the buffers in
//! use (takes minus drops, summed over the thread caches) and keeps a
//! *high-water mark*: the most in use at once, remembered until that many
//! have not been in use for a whole window (the idle-trim time, or 30 s).
//!
//! - **Provisioning** (on by default): when the cleaner has nothing in
//!   flight, a slot whose buffers in use plus ready fall short of its mark
//!   (after evictions, trims, or registrations skipped under load) gets the
//!   difference pinned in the background, within the cap (never evicting
//!   for it).
//! - **Idle trim**: ready buffers that became ready longer than the idle-trim
//!   time ago go back to the OS, largest first, except those
//!   [`Pool::reserve`](crate::Pool::reserve) pinned and, with provisioning
//!   on, the ones the mark still needs.
//!   Once a workload ends and the window passes, the marks fall to zero and
//!   pinned memory falls to what was reserved.
//! - **The cap that follows the working set** (with no cap given): each
//!   tick also keeps the most bytes in use at once over the window, per
//!   eighth of it, which the cleaner hands to
//!   [`Admission::follow`](crate::admission::Admission::follow); the
//!   bytes in use that takes which found no memory saw between two ticks
//!   count too (a burst of misses that a tick's sample misses).
//! - **Draining regions** (a pool that carves from regions, idle trimming
//!   on): each tick also keeps, per device, the most bytes its regions'
//!   buffers had in use, or had carved, at once over the window (sampled
//!   at the ticks, and counted at each miss and carve in between), and
//!   the largest block carved from them (or held at a tick), which
//!   the cleaner hands to `Regions::drain_excess`: regions that hold far more than
//!   that, but that a few carves keep from ever being wholly free (or
//!   idle for the idle-trim time), are drained and given back.

use std::time::{Duration, Instant};

use crate::admission::{Admission, Places};
use crate::alloc::{Block, Demand};
use crate::size_class::SizeClass;
use crate::sync::{AtomicBool, AtomicU64, Mutex, Ordering};

/// How often a tick does its work, at most.
const TICK: Duration = Duration::from_millis(10);

/// The rate of takes of a slot, a second, that makes it hot (see
/// `Provisioner::hot`), as a staging loop takes its one size; a slower
/// loop carves each take from its region and gives it back at each drop
/// (two locks on the slow path). A prover's segments, which draw sizes
/// over many classes, take each a few times a tick: their buffers kept
/// idle in their classes held up to a third of what their regions held
/// (at 4 takes a tick, on a small prover-like workload on the fault
/// backend, 4 threads of buffers up to 1 MiB: peak pinned 1.36 times the
/// bytes held at once, against 1.12 at 16 a tick, medians of twenty runs;
/// counted over [`HOT_WINDOW`] instead of one tick, 1.16 against 1.10 in
/// twenty runs each of one batch, the worst run 1.28 against 1.36: see
/// BENCHMARKS.md).
const HOT_RATE: u64 = 1_600;

/// The time a slot's rate of takes is counted over, at least (see
/// [`HOT_RATE`]): a burst of takes of one class (a prover's segment
/// taking twenty buffers of a size at once, a few times a window) is not a
/// loop. Counted over one tick (10 ms), such a burst made its class hot
/// for that tick, and for most ticks where ticks ran late: its idle
/// buffers then stayed in the class, and in the demand that draining
/// weighs.
const HOT_WINDOW: Duration = Duration::from_millis(50);

/// The window of a high-water mark when idle trimming is off.
const DEFAULT_WINDOW: Duration = Duration::from_secs(30);

/// A slot's high-water mark.
#[derive(Debug, Clone, Copy)]
struct Mark {
    peak: u64,
    /// When the slot last had `peak` in use.
    at: Instant,
}

/// The most bytes in use at once over the last window, kept per eighth of
/// it: a larger use counts until it is seven to eight eighths of the
/// window past, then falls away with its eighth.
#[derive(Debug)]
struct RecentPeak {
    eighths: [u64; 8],
    /// The newest eighth, and when it began.
    newest: usize,
    began: Instant,
}

impl RecentPeak {
    fn new(now: Instant) -> Self {
        Self {
            eighths: [0; 8],
            newest: 0,
            began: now,
        }
    }

    /// Notes `bytes` in use at `now`.
    fn note(&mut self, now: Instant, bytes: u64, window: Duration) {
        let eighth = (window / 8).max(Duration::from_millis(1));
        let past = now.saturating_duration_since(self.began);
        if past >= eighth {
            let steps = past.as_nanos() / eighth.as_nanos();
            for _ in 0..steps.min(8) {
                self.newest = (self.newest + 1) % 8;
                self.eighths[self.newest] = 0;
            }
            self.began = if steps >= 8 {
                now
            } else {
                // `steps` < 8: fits a u32.
                self.began + eighth * steps as u32
            };
        }
        self.eighths[self.newest] = self.eighths[self.newest].max(bytes);
    }

    fn peak(&self) -> u64 {
        self.eighths.iter().copied().max().unwrap_or(0)
    }
}

#[derive(Debug)]
struct State {
    marks: Vec<Option<Mark>>,
    /// The footprint bytes in use at most over the window (all slots).
    recent: RecentPeak,
    /// Per device, the bytes of carved classes in use, or carved from its
    /// regions, at most over the window, and the largest block carved
    /// from them or held at a tick (see `note_demand`).
    demand: Vec<(RecentPeak, RecentPeak)>,
    /// Per slot, the takes counted at recent ticks, oldest first: those
    /// less than [`HOT_WINDOW`] old, and the newest older one (the base
    /// that `mark_hot` counts from).
    takes: std::collections::VecDeque<(Instant, Vec<u64>)>,
    last: Instant,
    last_trim: Instant,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Provisioner {
    state: Mutex<State>,
    /// Per slot, whether it is *hot*: taken at [`HOT_RATE`] or more over
    /// the last [`HOT_WINDOW`] or longer, as of the last tick. A clean
    /// carved buffer of a hot slot goes back to
    /// its class for same-size reuse; of any other, to its region (see
    /// `alloc::region`).
    hot: Box<[AtomicBool]>,
    /// The most footprint bytes in use at once that a take found since
    /// the last tick took it (a miss, or a carve while misses are out:
    /// see [`note_found`](Self::note_found)).
    found: AtomicU64,
    provision: bool,
    idle_trim: Option<Duration>,
    /// When a growth last released another device's regions for its room
    /// (see [`move_room`](Self::move_room)); held while one does.
    room_moved: Mutex<Option<Instant>>,
}

/// What a tick found to do.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Fresh buffers to pin and pool (for the cleaner).
    pub(crate) provision: Vec<Block>,
    /// Idle buffers to release.
    pub(crate) trimmed: Vec<Block>,
    /// The tick ran (it runs at most every 10 ms): the hot slots are new.
    pub(crate) ticked: bool,
    /// The most footprint bytes in use at once over the window, as
    /// sampled by the ticks and as misses found them in between (when
    /// `ticked`).
    pub(crate) recent_in_use: u64,
    /// Per device, the most bytes its regions' classes had in use at once
    /// over the window and a seventh more, as sampled by the ticks and
    /// counted at each miss, or had carved from its regions, as counted at
    /// each carve (when `ticked` on a pool that carves; else empty), and
    /// the largest block carved from them, or held at a tick, over the
    /// window: what draining
    /// compares the regions with.
    pub(crate) recent_demand: Vec<Demand>,
}

impl Provisioner {
    pub(crate) fn new(
        slots: usize,
        devices: usize,
        provision: bool,
        idle_trim: Option<Duration>,
    ) -> Self {
        Self {
            hot: (0..slots).map(|_| AtomicBool::new(false)).collect(),
            state: Mutex::new(State {
                marks: vec![None; slots],
                recent: RecentPeak::new(Instant::now()),
                demand: (0..devices)
                    .map(|_| {
                        (
                            RecentPeak::new(Instant::now()),
                            RecentPeak::new(Instant::now()),
                        )
                    })
                    .collect(),
                takes: std::collections::VecDeque::new(),
                last: Instant::now(),
                last_trim: Instant::now(),
            }),
            found: AtomicU64::new(0),
            provision,
            idle_trim,
            room_moved: Mutex::new(None),
        }
    }

    /// Notes the footprint bytes in use now (`in_use`: buffers per slot,
    /// [`in_use_now`]), over every device and class, for a take on the
    /// slow path that found no memory (a miss, or a carve while misses
    /// are out), its own buffer counted: the cap that follows the working
    /// set counts them at the next tick, so that a burst of takes that
    /// miss between two ticks counts whole (the ticks' samples miss it,
    /// and run seldom while the cleaner is busy).
    pub(crate) fn note_found(&self, at: Places<'_>, in_use: &[u64]) {
        let classes = &at.caches.classes;
        let count = classes.count();
        let bytes: u64 = in_use
            .iter()
            .enumerate()
            .map(|(slot, &n)| n * classes.footprint(SizeClass::at(slot % count)) as u64)
            .sum();
        // Relaxed: a figure for the next tick; one racing its swap counts
        // in that tick or the next.
        self.found.fetch_max(bytes, Ordering::Relaxed);
    }

    /// Whether `slot` is hot (see the field).
    pub(crate) fn is_hot(&self, slot: usize) -> bool {
        // Relaxed: see `tick`.
        self.hot[slot].load(Ordering::Relaxed)
    }

    /// Marks each slot hot or not from its takes over the last
    /// [`HOT_WINDOW`] or longer (only a pool that carves from regions
    /// asks): counted from the newest tick at least that old, over the time
    /// since (measured: a tick run late counts the takes of a longer time
    /// over that longer time), and over [`HOT_WINDOW`] while no tick is
    /// that old.
    fn mark_hot(&self, at: Places<'_>, state: &mut State, now: Instant) {
        let slots = self.hot.len();
        // Snapshots older than a newer one at least HOT_WINDOW old are
        // past the base: dropped (the last one's vector reused).
        let mut takes = Vec::new();
        while state.takes.len() >= 2
            && now.saturating_duration_since(state.takes[1].0) >= HOT_WINDOW
        {
            takes = state.takes.pop_front().map(|(_, t)| t).unwrap_or_default();
        }
        takes.clear();
        takes.resize(slots, 0);
        for cache in at.caches.iter() {
            for (slot, n) in takes.iter_mut().enumerate() {
                let (hits, misses) = cache.hits_misses(slot);
                *n += hits + misses;
            }
        }
        let (since, base) = match state.takes.front() {
            Some((at, base)) => (now.saturating_duration_since(*at), Some(base)),
            None => (Duration::ZERO, None),
        };
        // Takes at HOT_RATE over `over`, in whole microseconds.
        let over = since.max(HOT_WINDOW).as_micros() as u64;
        for (slot, &n) in takes.iter().enumerate() {
            let taken = n.saturating_sub(base.map_or(0, |b| b[slot]));
            let hot = taken.saturating_mul(1_000_000) >= HOT_RATE.saturating_mul(over);
            // Relaxed: a hint for where a clean buffer goes; a stale one
            // sends a buffer to its class or its region for one tick.
            self.hot[slot].store(hot, Ordering::Relaxed);
        }
        state.takes.push_back((now, takes));
    }

    /// Tells each device's regions what is in use of their buffers now
    /// (`in_use`: buffers per slot), so that they can grow ahead of demand
    /// (see `Regions::note_in_use`), and keeps it in the device's window
    /// (`demand`), with the largest block carved or held, whose peaks it
    /// returns.
    fn note_demand(
        at: Places<'_>,
        in_use: &[u64],
        demand: &mut [(RecentPeak, RecentPeak)],
        now: Instant,
        window: Duration,
    ) -> Vec<Demand> {
        let intake = &at.caches.intake;
        let mut peaks = Vec::with_capacity(at.shards.len());
        for ((device, shard), (recent, largest)) in at.shards.iter().enumerate().zip(demand) {
            let bytes = carved_demand(at, device, |slot| in_use[slot]);
            let regions = shard.regions();
            regions.note_in_use(bytes, intake.misses_out(device));
            // What was carved at once since the last tick counts too, and
            // what misses found in use: draining asks what the regions
            // held (idle buffers and buffers in the cleaner included), and
            // the ticks alone miss a demand held between them (and run
            // seldom while the cleaner is busy). Kept a whole window at
            // least (a peak counts for seven to eight eighths of the window
            // its eighths divide): a demand that comes back within every
            // window drains nothing.
            let kept = window * 8 / 7;
            let between = regions.take_out_peak().max(regions.take_demand_peak());
            recent.note(now, bytes.max(between) as u64, kept);
            // The largest block carved, and the largest held now (in use,
            // or idle in its class): one reused from its class's stack
            // over the whole window, or held longer, is carved in none.
            let held = largest_held(at, device, |slot| in_use[slot]);
            let carved = regions.take_largest_carve();
            largest.note(now, carved.max(held) as u64, kept);
            let peak = |p: &RecentPeak| usize::try_from(p.peak()).unwrap_or(usize::MAX);
            peaks.push(Demand {
                bytes: peak(recent),
                largest: peak(largest),
            });
        }
        peaks
    }

    /// The idle-trim time, if idle trimming is on.
    pub(crate) fn idle_trim(&self) -> Option<Duration> {
        self.idle_trim
    }

    /// Runs `release` (a growth's release of other devices' regions for
    /// its room under the pinned budget, which says whether it released
    /// any), unless another device's growth runs one now, with how long a
    /// region must have been wholly free to go: `least`, or, within four
    /// [`window`](Self::window)s (idle-trim times) of the last release
    /// that freed any, a whole window; notes when it did. So two devices
    /// taking larger buffers in turn under a budget that holds one of
    /// their regions, each at most a window apart, keep the region on one
    /// device between such moves, rather than releasing it, missing and
    /// registering it again at every take (at one move per idle-trim
    /// time, takes 840 ms apart under a 1 s idle trim still moved it at
    /// about every other take); and a device whose region moved gets room
    /// back a window after the other stopped taking (when idle trimming
    /// is on, the trim releases such a region then too).
    pub(crate) fn move_room(&self, least: Duration, release: impl FnOnce(Duration) -> bool) {
        let Some(mut moved) = self.room_moved.try_lock() else {
            return;
        };
        let now = Instant::now();
        let every = self.window().saturating_mul(4);
        let recent = moved.is_some_and(|at| now.saturating_duration_since(at) < every);
        let idle = if recent {
            self.window().max(least)
        } else {
            least
        };
        if release(idle) {
            *moved = Some(now);
        }
    }

    /// The window of the high-water marks: the idle-trim time, or 30 s
    /// when idle trimming is off.
    pub(crate) fn window(&self) -> Duration {
        self.idle_trim.unwrap_or(DEFAULT_WINDOW)
    }

    /// One tick: updates the marks and plans provisioning (if `quiet`: the
    /// cleaner has nothing in flight) and idle trimming. `force` trims now,
    /// whatever the buffers' idle time (`Pool::trim`).
    pub(crate) fn tick(
        &self,
        at: Places<'_>,
        admission: &Admission,
        quiet: bool,
        force: bool,
    ) -> Plan {
        let now = Instant::now();
        let mut state = self.state.lock();
        if !force && now.duration_since(state.last) < TICK {
            return Plan::default();
        }
        state.last = now;
        let window = self.window();
        let classes = &at.caches.classes;
        let count = classes.count();
        let in_use = in_use_now(at);
        // In use at the lengths handed out (the statistics), and at their
        // footprints: the cap counts those (a class just above a page
        // occupies two), so the cap that follows the working set follows
        // them too.
        let (in_use_bytes, in_use_footprint) =
            in_use
                .iter()
                .enumerate()
                .fold((0u64, 0u64), |(len, foot), (slot, &n)| {
                    let class = SizeClass::at(slot % count);
                    (
                        len + n * classes.size(class) as u64,
                        foot + n * classes.footprint(class) as u64,
                    )
                });
        at.caches.counters.note_in_use(in_use_bytes);
        // Relaxed: see `note_found`.
        let found = self.found.swap(0, Ordering::Relaxed);
        state.recent.note(now, in_use_footprint.max(found), window);
        let recent_demand = if at.caches.carves() {
            self.mark_hot(at, &mut state, now);
            Self::note_demand(at, &in_use, &mut state.demand, now, window)
        } else {
            Vec::new()
        };
        for (mark, &now_in_use) in state.marks.iter_mut().zip(&in_use) {
            match mark {
                Some(m) if now_in_use >= m.peak => {
                    *m = Mark {
                        peak: now_in_use,
                        at: now,
                    }
                }
                Some(m) if now.duration_since(m.at) > window => {
                    *m = Mark {
                        peak: now_in_use,
                        at: now,
                    }
                }
                Some(_) => {}
                None if now_in_use > 0 => {
                    *mark = Some(Mark {
                        peak: now_in_use,
                        at: now,
                    })
                }
                None => {}
            }
        }
        let marks = state.marks.clone();
        // With provisioning off, nothing is kept for recent demand.
        let keep = |slot: usize| {
            if !self.provision {
                return 0;
            }
            marks[slot].map_or(0, |m| m.peak.saturating_sub(in_use[slot])) as usize
        };
        let mut plan = Plan {
            ticked: true,
            recent_in_use: state.recent.peak(),
            recent_demand,
            ..Plan::default()
        };
        // Trimming locks every owner out: a quarter of the idle time apart
        // (at least a second), or now when forced.
        let idle = if force {
            Some(Duration::ZERO)
        } else {
            self.idle_trim
        };
        if let Some(idle) = idle {
            let due = force
                || now.duration_since(state.last_trim) >= (idle / 4).max(Duration::from_secs(1));
            if let (true, Some(cutoff)) = (due, now.checked_sub(idle)) {
                state.last_trim = now;
                plan.trimmed = admission.trim(at, cutoff, &keep);
            }
        }
        if self.provision && quiet && !force {
            let counters = &at.caches.counters;
            let budget = counters.max_pinned().saturating_sub(counters.pinned());
            let mut room = at
                .caches
                .cap()
                .saturating_sub(admission.pooled_bytes(at))
                .min(usize::try_from(budget).unwrap_or(usize::MAX));
            for slot in (0..marks.len()).rev() {
                let Some(mark) = marks[slot] else {
                    continue;
                };
                let (device, class) = (slot / count, SizeClass::at(slot % count));
                if at.caches.carves() {
                    // Regions meet every class's demand (they grow by it;
                    // a sub-page class's takes carve pages for slabs).
                    continue;
                }
                let ready: u64 = at.shards[device].len(class) as u64
                    + at.caches
                        .iter()
                        .map(|c| u64::from(c.ready_in(slot)))
                        .sum::<u64>();
                let mut short = mark.peak.saturating_sub(in_use[slot] + ready);
                let footprint = classes.footprint(class);
                // A sub-page class's block is the head of a slab, which its
                // registration carves into up to `per_slab` buffers.
                let per_slab = classes.per_slab(class) as u64;
                while short > 0 {
                    let buffers = short.min(per_slab) as usize;
                    if footprint * buffers > room {
                        break;
                    }
                    let node = at.shards[device].node();
                    match Block::allocate_for(classes, class, device, node, buffers) {
                        Ok(mut block) => {
                            block.meta_mut().dirty = 0;
                            room -= footprint * buffers;
                            short -= buffers as u64;
                            plan.provision.push(block);
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "pinpool: provisioning could not map a buffer");
                            break;
                        }
                    }
                }
            }
            if !plan.provision.is_empty() {
                tracing::debug!(
                    buffers = plan.provision.len(),
                    "pinpool: provisioning ahead of demand"
                );
            }
        }
        plan
    }
}

/// The demand on `device`'s regions, given the buffers in use per slot
/// (taken and not dropped, misses included): their footprint bytes (a
/// sub-page class's buffers come from slabs, pages carved from the regions
/// too).
fn carved_demand(at: Places<'_>, device: usize, in_use: impl Fn(usize) -> u64) -> usize {
    let classes = &at.caches.classes;
    classes
        .all()
        .map(|class| in_use(classes.slot(device, class)) as usize * classes.footprint(class))
        .sum()
}

/// The footprint of the largest class carved from `device`'s regions with a
/// buffer in use (`in_use` of its slot) or idle in its shard or a thread
/// cache; 0 if none. Relaxed counts, as in [`in_use_now`]: a stale one
/// misses a block that just arrived (the next tick counts it, if it is
/// still held; a carve counted it already), or counts one that just went,
/// which keeps a region from draining one window longer.
fn largest_held(at: Places<'_>, device: usize, in_use: impl Fn(usize) -> u64) -> usize {
    let classes = &at.caches.classes;
    // Largest first: the first class held is the answer.
    classes
        .all()
        .rev()
        .filter(|&c| classes.per_slab(c) == 1)
        .find(|&class| {
            let slot = classes.slot(device, class);
            in_use(slot) > 0
                || at.shards[device].len(class) > 0
                || at.caches.iter().any(|c| c.ready_in(slot) > 0)
        })
        .map_or(0, |class| classes.footprint(class))
}

/// The demand on `device`'s regions, as the provisioning tick counts it
/// (see [`Provisioner::tick`]), from `in_use` ([`in_use_now`]), for a take
/// that found no memory (the slow path).
pub(crate) fn demand_from(at: Places<'_>, device: usize, in_use: &[u64]) -> usize {
    carved_demand(at, device, |slot| in_use[slot])
}

/// The buffers in use now per slot, summed over the thread caches in one
/// pass (each pass walks every thread's slot): for a take that found no
/// memory, whose own buffer is counted once it is. Relaxed counts read
/// while other threads take and drop: a little off either way, which the
/// next tick or miss corrects.
pub(crate) fn in_use_now(at: Places<'_>) -> Vec<u64> {
    let mut in_use = vec![0u64; at.caches.slots()];
    for cache in at.caches.iter() {
        for (slot, n) in in_use.iter_mut().enumerate() {
            *n += cache.in_use(slot);
        }
    }
    in_use
}

#[cfg(all(test, not(pinpool_loom)))]
mod tests {
    use super::*;

    /// Room moves between devices with the least idle time given until one
    /// frees regions; then, for four idle-trim times (the 30 s window when
    /// idle trimming is off), only regions idle a whole window move: a
    /// device whose region moved gets it back 30 s after the other device
    /// stopped, not 120 s.
    #[test]
    fn room_moves_again_after_a_move_only_from_regions_idle_a_whole_window() {
        let provisioner = Provisioner::new(1, 2, false, None);
        let least = Duration::from_millis(7500);
        let asked = |released: bool| {
            let mut idle = None;
            provisioner.move_room(least, |at| {
                idle = Some(at);
                released
            });
            idle
        };
        assert_eq!(asked(false), Some(least), "nothing released: no move");
        assert_eq!(asked(true), Some(least));
        assert_eq!(asked(true), Some(DEFAULT_WINDOW), "after a move");
        let held = provisioner.room_moved.lock();
        assert_eq!(
            asked(true),
            None,
            "while another device's growth moves room"
        );
        drop(held);
    }

    #[test]
    fn a_recent_peak_falls_with_its_eighth_a_window_later() {
        let window = Duration::from_millis(800);
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut peak = RecentPeak::new(start);
        peak.note(at(0), 100, window);
        peak.note(at(50), 300, window);
        peak.note(at(150), 200, window);
        assert_eq!(peak.peak(), 300);
        // The eighth of 0-100 ms holds 300 until 800 ms.
        peak.note(at(790), 10, window);
        assert_eq!(peak.peak(), 300);
        peak.note(at(810), 10, window);
        assert_eq!(peak.peak(), 200, "the 100-200 ms eighth still counts");
        peak.note(at(910), 10, window);
        assert_eq!(peak.peak(), 10);
        // A gap longer than the window clears every eighth.
        peak.note(at(910), 500, window);
        peak.note(at(5000), 1, window);
        assert_eq!(peak.peak(), 1);
    }
}
