//! Sizes, counts and delays, in one place: loom models shrink them so that
//! a model's executions stay short (a few size classes of a few bytes,
//! two-byte cleaning chunks).

use std::time::Duration;

/// The cleaner splits zeroing (and pre-faulting) above this many bytes into
/// jobs of this size that any worker may run: a multiple of the 2 MiB huge
/// page, small enough that a 16 MiB buffer is cleaned by several workers.
#[cfg(not(pinpool_loom))]
pub(crate) const CHUNK: usize = 4 << 20;
#[cfg(pinpool_loom)]
pub(crate) const CHUNK: usize = 2;

/// Buffers shorter than a slab are carved from slabs (see `alloc`); each
/// occupies its length rounded up to this many bytes, so one slab holds at
/// most `slab / SLAB_GRANULE` of them: 16 on 4 KiB pages.
#[cfg(not(pinpool_loom))]
pub(crate) const SLAB_GRANULE: usize = 256;
#[cfg(pinpool_loom)]
pub(crate) const SLAB_GRANULE: usize = 2;

/// The bytes of one slab: `None` for one page. Loom models carve 4-byte
/// slabs into two buffers, and only of the 1- and 2-byte classes, so the
/// models of other paths keep one mapping per buffer.
#[cfg(not(pinpool_loom))]
pub(crate) const SLAB_BYTES: Option<usize> = None;
#[cfg(pinpool_loom)]
pub(crate) const SLAB_BYTES: Option<usize> = Some(4);

/// The largest size class is `1 << MAX_SHIFT` bytes.
#[cfg(not(pinpool_loom))]
pub(crate) const MAX_SHIFT: u32 = 40;
#[cfg(pinpool_loom)]
pub(crate) const MAX_SHIFT: u32 = 3;

/// Slots in a lock-free stack's first page (`1 << FIRST_PAGE_SHIFT`).
#[cfg(not(pinpool_loom))]
pub(crate) const STACK_FIRST_PAGE_SHIFT: u32 = 5;
#[cfg(pinpool_loom)]
pub(crate) const STACK_FIRST_PAGE_SHIFT: u32 = 0;

/// A dropped buffer whose dirty prefix is at most this long is cleaned by
/// the thread that takes it next (its owner, usually) rather than by the
/// cleaner: zeroing it costs less than a trip through a queue.
pub(crate) const SELF_CLEAN_BYTES: usize = 64 << 10;

/// At most this many dropped buffers wait in one thread cache for their
/// owner; more go to the cleaner.
#[cfg(not(pinpool_loom))]
pub(crate) const MAX_DEFERRED: usize = 64;
#[cfg(pinpool_loom)]
pub(crate) const MAX_DEFERRED: usize = 2;

/// How long a take waits for its own oldest dropped buffer of the class to
/// be released by its copy, when at least [`SELF_WAIT_BEHIND`] more of the
/// class are in flight behind it, before it looks elsewhere and, at worst,
/// allocates a pageable buffer. A thread so keeps a few buffers of a class
/// in circulation (one more than a hand-written double-buffered loop) and,
/// once its copies queue up behind each other, waits for them as such a
/// loop does instead of deepening the queue with more buffers.
#[cfg(not(pinpool_loom))]
pub(crate) const SELF_WAIT: Duration = Duration::from_millis(20);
/// Loom has no clock: no waiting (a model's control flow must not depend
/// on time).
#[cfg(pinpool_loom)]
pub(crate) const SELF_WAIT: Duration = Duration::ZERO;

/// See [`SELF_WAIT`].
pub(crate) const SELF_WAIT_BEHIND: usize = 2;

/// A thread locks other threads' caches out to steal from them at most this
/// often (it interrupts every running thread of the process); misses in
/// between allocate.
#[cfg(not(pinpool_loom))]
pub(crate) const STEAL_EVERY: Duration = Duration::from_millis(1);
/// Loom: every miss may steal (no clock, see `SELF_WAIT`).
#[cfg(pinpool_loom)]
pub(crate) const STEAL_EVERY: Duration = Duration::ZERO;

/// How often an idle worker re-polls buffers whose copies were still
/// running.
pub(crate) const POLL: Duration = Duration::from_micros(100);

/// Whether worker 0 sweeps idle caches. Loom models have no clock, and a
/// sweep on a timer would make them non-deterministic; `flush` moves
/// waiting buffers along in both builds.
pub(crate) const SWEEPS: bool = cfg!(not(pinpool_loom));

/// How long an idle cleaner waits before sweeping buffers left by idle
/// threads, at first; the wait doubles while sweeps find nothing, up to
/// [`SWEEP_MAX`].
pub(crate) const SWEEP_MIN: Duration = Duration::from_millis(1);

/// See [`SWEEP_MIN`].
pub(crate) const SWEEP_MAX: Duration = Duration::from_millis(100);

/// How long `flush` waits between checks when nothing has woken it
/// (completions by owners do not notify).
pub(crate) const FLUSH_POLL: Duration = Duration::from_millis(1);

/// Registrations queued or running, at most: `REGISTER_BACKLOG + 16 per
/// worker`. Beyond it a pool-miss buffer is freed rather than registered.
pub(crate) const REGISTER_BACKLOG: usize = 64;

/// Buffers queued for the cleaner to recycle, at most. Beyond it a dropped
/// buffer is shed (`Cleaner::shed`: a pageable one freed, a pinned one
/// released in bulk), so that drops outrunning the cleaner keep its queue,
/// and the wait of a flush behind it, bounded: a few milliseconds of work
/// for the workers (a small buffer costs them about a microsecond).
pub(crate) const RECYCLE_BACKLOG: usize = 4096;

/// Dirty bytes queued for the cleaner to zero, at most: half the cap,
/// within `[ZERO_BACKLOG_MIN, ZERO_BACKLOG]`. Beyond it a dropped buffer is
/// freed rather than queued, so dropping faster than the cleaner can zero
/// cannot grow the queue (and the memory it holds) without bound.
#[cfg(not(pinpool_loom))]
pub(crate) const ZERO_BACKLOG: usize = 2 << 30;
#[cfg(pinpool_loom)]
pub(crate) const ZERO_BACKLOG: usize = 64;

/// See [`ZERO_BACKLOG`].
#[cfg(not(pinpool_loom))]
pub(crate) const ZERO_BACKLOG_MIN: usize = 64 << 20;
#[cfg(pinpool_loom)]
pub(crate) const ZERO_BACKLOG_MIN: usize = 64;
