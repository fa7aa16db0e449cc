//! The flush barrier: `flush` returns once every buffer dropped before the
//! call has been made ready again or released.
//!
//! This is the two-index counter scheme of sleepable RCU (SRCU; P. E.
//! McKenney, "Sleepable RCU", LWN 2006, and the Linux kernel's
//! `srcu_readers_active_idx_check`). A drop reads the flush epoch, and
//! counts itself in the epoch's parity in its home cache; the buffer's
//! completion (ready, or released) counts itself in the same parity of the
//! same cache. A flush waits for the *inactive* parity to balance, flips the
//! epoch, then waits for the *old active* parity to balance. Waiting on both
//! matters: a drop may read the epoch, stall while an earlier flush flips
//! and checks, and only then count itself, in a parity that flush had
//! already seen balanced; the next flush still waits for it, because it
//! checks both parities. Each wait is bounded: new drops count in the other
//! parity, so only the drops already under way can add to the one waited
//! on.
//!
//! A parity balances when, summed over all caches, completions equal
//! drops. The sums are read completions first, then drops (SRCU reads
//! unlocks before locks): a completion happens after its drop, so the
//! completions read can only fall short of the drops read, and equality
//! means that every drop counted, and so every drop that happened before
//! the flush, has completed.
//!
//! Counters only grow. Each cache has two sets, on separate cache lines:
//! one written only by the cache's owner (a load and a store, no
//! read-modify-write), and one that other threads update with `fetch_add`.

use crossbeam_utils::CachePadded;

use crate::sync::{fence, AtomicU64, AtomicUsize, Condvar, Mutex, Ordering};
use crate::tune::{Tune, Tuning};

/// A cache's flush counters written only by its owner.
#[derive(Debug, Default)]
pub(crate) struct OwnerCounts {
    drops: [AtomicU64; 2],
    done: [AtomicU64; 2],
}

/// A cache's flush counters that any thread may update.
#[derive(Debug, Default)]
pub(crate) struct SharedCounts {
    drops: [AtomicU64; 2],
    done: [AtomicU64; 2],
}

/// Adds one to a counter only one thread writes.
#[inline]
fn bump(counter: &AtomicU64, order: Ordering) {
    // Relaxed load: the caller is the counter's only writer.
    counter.store(counter.load(Ordering::Relaxed) + 1, order);
}

impl OwnerCounts {
    /// Counts a drop by the owner in `parity`.
    #[inline]
    pub(crate) fn dropped(&self, parity: usize) {
        // Relaxed: a flush that must see this drop happens after it, which
        // orders its reads; a racing flush may or may not see it.
        bump(&self.drops[parity], Ordering::Relaxed);
    }

    /// Counts a completion by the owner (no wake-up: flushes poll for
    /// these).
    #[inline]
    pub(crate) fn done(&self, parity: usize) {
        // Release pairs with the Acquire sum in `Flush::balanced`: what the
        // owner did to the buffer happens before the flush returns.
        bump(&self.done[parity], Ordering::Release);
    }

    /// Completions by the owner, both parities (an activity hint).
    pub(crate) fn completions(&self) -> u64 {
        // Relaxed: a hint, publishing nothing.
        self.done.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

impl SharedCounts {
    /// Counts a drop by a thread other than the owner in `parity`.
    #[inline]
    pub(crate) fn dropped(&self, parity: usize) {
        // Relaxed: as in `OwnerCounts::dropped`.
        self.drops[parity].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a completion by a thread other than the owner; the caller
    /// then calls [`Flush::notify`].
    #[inline]
    pub(crate) fn done(&self, parity: usize) {
        // Release: as in `OwnerCounts::done`.
        self.done[parity].fetch_add(1, Ordering::Release);
    }
}

/// One cache's counters, as the barrier sums them.
pub(crate) type Counts<'a> = (&'a OwnerCounts, &'a SharedCounts);

/// Drops minus completions over `counts` (both parities): buffers in flight.
pub(crate) fn in_flight<'a>(counts: impl Iterator<Item = Counts<'a>>) -> u64 {
    counts
        .map(|(o, s)| {
            let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
            let drops: u64 = (0..2).map(|p| load(&o.drops[p]) + load(&s.drops[p])).sum();
            let done: u64 = (0..2).map(|p| load(&o.done[p]) + load(&s.done[p])).sum();
            drops.saturating_sub(done)
        })
        .sum()
}

/// Drops counted in all caches, both parities (for the close-time count of
/// buffers still out, exact once drops have stopped, and an activity
/// hint).
pub(crate) fn drops<'a>(counts: impl Iterator<Item = Counts<'a>>) -> u64 {
    counts
        .map(|(o, s)| {
            (0..2)
                // Relaxed: a snapshot; the close reads it after its
                // barrier and wait for drops under way, which order them.
                .map(|p| o.drops[p].load(Ordering::Relaxed) + s.drops[p].load(Ordering::Relaxed))
                .sum::<u64>()
        })
        .sum()
}

/// The barrier's shared state.
#[derive(Debug)]
pub(crate) struct Flush {
    epoch: CachePadded<AtomicUsize>,
    /// Flushes run one at a time (the epoch flips in a known order).
    serial: Mutex<()>,
    /// Flushes waiting, under the lock the wake-ups take.
    waiters: Mutex<usize>,
    woken: Condvar,
    /// The same count, readable without the lock (see `notify`).
    flushing: AtomicUsize,
}

impl Flush {
    pub(crate) fn new() -> Self {
        Self {
            epoch: CachePadded::new(AtomicUsize::new(0)),
            serial: Mutex::new(()),
            waiters: Mutex::new(0),
            woken: Condvar::new(),
            flushing: AtomicUsize::new(0),
        }
    }

    /// The parity a drop counts itself in now.
    #[inline]
    pub(crate) fn parity(&self) -> usize {
        // Relaxed: see the module docs; a drop racing a flip may read
        // either parity, and the flush after it waits for both.
        self.epoch.load(Ordering::Relaxed) & 1
    }

    /// Blocks until every drop counted before the call has completed.
    /// `counts` lists every cache's counters; `hurry` is called while a
    /// parity is still out of balance, to move buffers along (buffers
    /// waiting in caches for their owners, or a cleaner that is not
    /// running).
    pub(crate) fn wait<'a, I>(&self, counts: impl Fn() -> I, mut hurry: impl FnMut())
    where
        I: Iterator<Item = Counts<'a>>,
    {
        let _serial = self.serial.lock();
        // Relaxed: flips happen under `serial`, so this is the latest.
        let epoch = self.epoch.load(Ordering::Relaxed);
        self.drain(1 - (epoch & 1), &counts, &mut hurry);
        self.epoch.store(epoch.wrapping_add(1), Ordering::Relaxed);
        self.drain(epoch & 1, &counts, &mut hurry);
    }

    fn drain<'a, I>(&self, parity: usize, counts: &impl Fn() -> I, hurry: &mut impl FnMut())
    where
        I: Iterator<Item = Counts<'a>>,
    {
        let mut hurried: Option<std::time::Instant> = None;
        while !Self::balanced(parity, counts()) {
            // Moving buffers along locks every owner out (a heavy barrier):
            // at most once per `FLUSH_POLL`, however many completions wake
            // this flush meanwhile (under loom, which has no clock: on
            // every wake-up).
            let due =
                cfg!(pinpool_loom) || hurried.is_none_or(|at| at.elapsed() >= Tune::FLUSH_POLL);
            if due {
                hurry();
                if !cfg!(pinpool_loom) {
                    hurried = Some(std::time::Instant::now());
                }
            }
            let mut waiters = self.waiters.lock();
            *waiters += 1;
            self.flushing.fetch_add(1, Ordering::Relaxed);
            // Pairs with the fence in `notify`: either that load sees this
            // flush, or the check below sees the completion.
            fence(Ordering::SeqCst);
            if !Self::balanced(parity, counts()) {
                // Completions by owners do not notify: poll for them.
                waiters = self
                    .woken
                    .wait_timeout(&self.waiters, waiters, Tune::FLUSH_POLL);
            }
            *waiters -= 1;
            self.flushing.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Whether completions equal drops in `parity`, summed over `counts`.
    fn balanced<'a>(parity: usize, counts: impl Iterator<Item = Counts<'a>>) -> bool {
        let counts: Vec<Counts<'a>> = counts.collect();
        // Acquire pairs with the Release of each completion: the buffer's
        // state is visible once the flush returns, and the drops read next
        // include every drop whose completion was read here.
        let done: u64 = counts
            .iter()
            .map(|(o, s)| {
                o.done[parity].load(Ordering::Acquire) + s.done[parity].load(Ordering::Acquire)
            })
            .sum();
        let drops: u64 = counts
            .iter()
            .map(|(o, s)| {
                o.drops[parity].load(Ordering::Relaxed) + s.drops[parity].load(Ordering::Relaxed)
            })
            .sum();
        done == drops
    }

    /// Wakes flushes after a completion counted in [`SharedCounts`].
    ///
    /// The completion's increment, this SeqCst fence and the load of
    /// `flushing` pair with a flush's increment of `flushing`, its fence and
    /// its check: either this load sees the flush (and takes the lock the
    /// flush checks under before notifying, so the wake-up cannot fall
    /// between its check and its wait), or the flush's check sees the
    /// completion. With no flush in progress this costs no shared write.
    pub(crate) fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.flushing.load(Ordering::Relaxed) > 0 && *self.waiters.lock() > 0 {
            self.woken.notify_all();
        }
    }
}
