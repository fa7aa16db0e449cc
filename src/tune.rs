//! The sizes, counts and delays the pool is built with, in one place.
//!
//! [`Tuning`] declares each of them; [`Production`] holds the values of a
//! real pool, and [`Small`] those of the loom build: a few size classes of
//! a few bytes, two-byte cleaning chunks, two-byte slabs' granules and no
//! waiting, so that a model's executions stay short. [`Tune`] is the tuning
//! of the build (`Small` under `cfg(pinpool_loom)`), and code names its
//! values as `Tune::CHUNK`: the loom models run the production code at
//! small sizes, as sharded-slab's tests run its code under a small
//! `cfg::Config`. Both tunings are checked against the same rules in every
//! build ([`check`]).

use std::time::Duration;

/// The sizes, counts and delays the pool is built with; see the module
/// docs.
pub(crate) trait Tuning {
    /// The cleaner splits zeroing (and pre-faulting) above this many bytes
    /// into jobs of this size that any worker may run: a multiple of the
    /// 2 MiB huge page, small enough that a 16 MiB buffer is cleaned by
    /// several workers.
    const CHUNK: usize;

    /// Buffers shorter than a slab are carved from slabs (see `alloc`);
    /// each occupies its length rounded up to this many bytes, so one slab
    /// holds at most `slab / SLAB_GRANULE` of them (16 on 4 KiB pages).
    const SLAB_GRANULE: usize;

    /// The bytes of one slab: `None` for one page. The small tuning carves
    /// 4-byte slabs into two buffers, and only of the 1- and 2-byte
    /// classes, so the models of other paths keep one mapping per buffer.
    const SLAB_BYTES: Option<usize>;

    /// The largest size class is `1 << MAX_SHIFT` bytes.
    const MAX_SHIFT: u32;

    /// Slots in a lock-free stack's first page (`1 << FIRST_PAGE_SHIFT`).
    const STACK_FIRST_PAGE_SHIFT: u32;

    /// A dropped buffer whose dirty prefix is at most this long is cleaned
    /// by the thread that takes it next (its owner, usually) rather than by
    /// the cleaner: zeroing it costs less than a trip through a queue.
    const SELF_CLEAN_BYTES: usize;

    /// At most this many dropped buffers wait in one thread cache for
    /// their owner; more go to the cleaner.
    const MAX_DEFERRED: usize;

    /// Buffers per batch of a cache's returns (what threads other than
    /// its owner drop into it): the lines they share with the owner move
    /// once per batch.
    const RETURNS_BATCH: usize;

    /// How long a take waits for its own oldest dropped buffer of the
    /// class to be released by its copy, when at least
    /// [`SELF_WAIT_BEHIND`](Self::SELF_WAIT_BEHIND) more of the class are
    /// in flight behind it, before it looks elsewhere and, at worst,
    /// allocates a pageable buffer. A thread so keeps a few buffers of a
    /// class in circulation (one more than a hand-written double-buffered
    /// loop) and, once its copies queue up behind each other, waits for
    /// them as such a loop does instead of deepening the queue with more
    /// buffers. Zero in the small tuning: loom has no clock, and a model's
    /// control flow must not depend on time.
    const SELF_WAIT: Duration;

    /// See [`SELF_WAIT`](Self::SELF_WAIT).
    const SELF_WAIT_BEHIND: usize;

    /// How long at most a take that finds nothing anywhere else waits for
    /// one of the buffers of its cache's deferred list of the class to be
    /// released by its copies, while the pool's other copies keep ending,
    /// before it allocates a pageable buffer (see `Shared::wait_for_own`).
    /// Zero in the small tuning (see [`SELF_WAIT`](Self::SELF_WAIT)).
    const MISS_WAIT: Duration;

    /// A thread locks other threads' caches out to steal from them at most
    /// this often (it interrupts every running thread of the process);
    /// misses in between allocate. Zero in the small tuning: every miss
    /// may steal (no clock, see [`SELF_WAIT`](Self::SELF_WAIT)).
    const STEAL_EVERY: Duration;

    /// How often an idle worker, or the reaper, re-polls buffers whose
    /// copies were still running.
    const POLL: Duration;

    /// Whether worker 0 sweeps idle caches. The loom models have no clock,
    /// and a sweep on a timer would make them non-deterministic; `flush`
    /// moves waiting buffers along in both tunings.
    const SWEEPS: bool;

    /// How long an idle cleaner waits before sweeping buffers left by idle
    /// threads, at first; the wait doubles while sweeps find nothing, up to
    /// [`SWEEP_MAX`](Self::SWEEP_MAX).
    const SWEEP_MIN: Duration;

    /// See [`SWEEP_MIN`](Self::SWEEP_MIN).
    const SWEEP_MAX: Duration;
    /// How long a set of regions' demand must have stopped rising before
    /// the provisioning sweep, or a returned miss, grows it (see
    /// `Regions::rising` and `Cleaner::carve_for`).
    const GROWTH_SETTLE: Duration;
    /// The longest a run of rises (each within
    /// [`GROWTH_SETTLE`](Self::GROWTH_SETTLE) of the last) holds the
    /// sweep's growth back, and the longest a returned miss waits for its
    /// set's demand to settle, however it rises, counted from when it was
    /// first parked (for that or for another worker's growth, which it
    /// waits out whatever the time).
    const GROWTH_SETTLE_MAX: Duration;

    /// How long `flush` waits between checks when nothing has woken it
    /// (completions by owners do not notify).
    const FLUSH_POLL: Duration;

    /// Registrations queued or running, at most: `REGISTER_BACKLOG + 16 per
    /// worker`. Beyond it a pool-miss buffer is freed rather than
    /// registered.
    const REGISTER_BACKLOG: usize;

    /// Buffers queued for the cleaner to recycle, at most (those parked
    /// for their copies are not counted: they hold no queue). Beyond it a
    /// dropped buffer is shed (`Intake::shed`: a pageable one freed, a
    /// pinned one released in bulk), so that drops outrunning the cleaner
    /// keep its queue, and the wait of a flush behind it, bounded: a few
    /// milliseconds of work for the workers (a small buffer costs them
    /// about a microsecond).
    const RECYCLE_BACKLOG: usize;

    /// Dirty bytes queued for the cleaner to zero, at most: half the cap,
    /// within `[ZERO_BACKLOG_MIN, ZERO_BACKLOG]`. Beyond it a dropped
    /// buffer is freed rather than queued, so dropping faster than the
    /// cleaner can zero cannot grow the queue (and the memory it holds)
    /// without bound.
    const ZERO_BACKLOG: usize;

    /// See [`ZERO_BACKLOG`](Self::ZERO_BACKLOG).
    const ZERO_BACKLOG_MIN: usize;

    /// The smallest region the cleaner registers: a miss, with the misses
    /// queued behind it, gets a region of at least this many bytes, so a
    /// workload of small buffers pins them a region at a time.
    const REGION_MIN: usize;

    /// The largest region the pool registers, regions folded into a growth
    /// included (a buffer larger than this alone gets a region of its own
    /// size): well below the 512 GiB that one registration may not reach
    /// on recent drivers.
    const REGION_MAX: usize;

    /// Buffers shorter than this are carved from the top of the free
    /// extent that fits them best, longer ones from its bottom: the short
    /// ones gather at one end of the free space they take from, and do not
    /// split the runs large buffers need whole (on the full-scale workload,
    /// emulated at half scale: steady byte hits 99.8% against 99.06%, peak
    /// pinned 1.27 against 1.34 times the peak in use, medians of twelve
    /// runs).
    const TOP_CARVE_BELOW: usize;
}

/// The tuning of a real pool.
#[derive(Debug)]
pub(crate) enum Production {}

/// The tuning of the loom build: sizes a model can explore, no waiting;
/// what loom need not shrink is [`Production`]'s.
#[derive(Debug)]
pub(crate) enum Small {}

/// The tuning this build runs with.
#[cfg(not(pinpool_loom))]
pub(crate) type Tune = Production;

/// The tuning this build runs with.
#[cfg(pinpool_loom)]
pub(crate) type Tune = Small;

impl Tuning for Production {
    const CHUNK: usize = 4 << 20;
    const SLAB_GRANULE: usize = 256;
    const SLAB_BYTES: Option<usize> = None;
    const MAX_SHIFT: u32 = 40;
    const STACK_FIRST_PAGE_SHIFT: u32 = 5;
    const SELF_CLEAN_BYTES: usize = 64 << 10;
    const MAX_DEFERRED: usize = 64;
    const RETURNS_BATCH: usize = 32;
    const SELF_WAIT: Duration = Duration::from_millis(20);
    const SELF_WAIT_BEHIND: usize = 2;
    const MISS_WAIT: Duration = Duration::from_secs(1);
    const STEAL_EVERY: Duration = Duration::from_millis(1);
    const POLL: Duration = Duration::from_micros(100);
    const SWEEPS: bool = true;
    const SWEEP_MIN: Duration = Duration::from_millis(1);
    const SWEEP_MAX: Duration = Duration::from_millis(100);
    const GROWTH_SETTLE: Duration = Duration::from_millis(2);
    const GROWTH_SETTLE_MAX: Duration = Duration::from_millis(20);
    const FLUSH_POLL: Duration = Duration::from_millis(1);
    const REGISTER_BACKLOG: usize = 64;
    const RECYCLE_BACKLOG: usize = 4096;
    const ZERO_BACKLOG: usize = 2 << 30;
    const ZERO_BACKLOG_MIN: usize = 64 << 20;
    const REGION_MIN: usize = 2 << 20;
    const REGION_MAX: usize = 256 << 30;
    const TOP_CARVE_BELOW: usize = 64 << 20;
}

impl Tuning for Small {
    const CHUNK: usize = 2;
    const SLAB_GRANULE: usize = 2;
    const SLAB_BYTES: Option<usize> = Some(4);
    const MAX_SHIFT: u32 = 3;
    const STACK_FIRST_PAGE_SHIFT: u32 = 0;
    const SELF_CLEAN_BYTES: usize = Production::SELF_CLEAN_BYTES;
    const MAX_DEFERRED: usize = 2;
    // Two: a model's two drops fill a batch, or one stays open.
    const RETURNS_BATCH: usize = 2;
    const SELF_WAIT: Duration = Duration::ZERO;
    const SELF_WAIT_BEHIND: usize = Production::SELF_WAIT_BEHIND;
    const MISS_WAIT: Duration = Duration::ZERO;
    const STEAL_EVERY: Duration = Duration::ZERO;
    const POLL: Duration = Production::POLL;
    const SWEEPS: bool = false;
    const SWEEP_MIN: Duration = Production::SWEEP_MIN;
    const SWEEP_MAX: Duration = Production::SWEEP_MAX;
    // No waiting on time under the models: what the clock says must not
    // change which interleavings a model explores.
    const GROWTH_SETTLE: Duration = Duration::ZERO;
    const GROWTH_SETTLE_MAX: Duration = Duration::ZERO;
    const FLUSH_POLL: Duration = Production::FLUSH_POLL;
    const REGISTER_BACKLOG: usize = Production::REGISTER_BACKLOG;
    const RECYCLE_BACKLOG: usize = Production::RECYCLE_BACKLOG;
    const ZERO_BACKLOG: usize = 64;
    const ZERO_BACKLOG_MIN: usize = 64;
    const REGION_MIN: usize = 8;
    // No bound the models reach: a region is what its growth wants.
    const REGION_MAX: usize = 1 << 30;
    // Every model buffer from the bottom, as before this existed.
    const TOP_CARVE_BELOW: usize = 0;
}

/// Fails the build if `T` breaks a rule the code relies on: chunks and
/// granules are not empty (they divide lengths), a slab holds whole
/// granules, the largest class and the stack's first page fit their
/// shifts, and each range is not reversed (`clamp` panics on one).
const fn check<T: Tuning>() {
    assert!(T::CHUNK > 0 && T::SLAB_GRANULE > 0 && T::RETURNS_BATCH > 0);
    if let Some(slab) = T::SLAB_BYTES {
        assert!(slab > 0 && slab % T::SLAB_GRANULE == 0);
    }
    assert!(T::MAX_SHIFT < usize::BITS && T::STACK_FIRST_PAGE_SHIFT < 32);
    assert!(T::ZERO_BACKLOG_MIN <= T::ZERO_BACKLOG);
    assert!(T::SWEEP_MIN.as_nanos() <= T::SWEEP_MAX.as_nanos());
    assert!(T::REGION_MIN <= T::REGION_MAX);
}

const _: () = check::<Production>();
const _: () = check::<Small>();
