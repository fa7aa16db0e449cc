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
//! Each set keeps its own copy of the barrier's address, so that a drop
//! reads no line the other side writes.

use std::ptr::NonNull;

use crossbeam_utils::CachePadded;

use crate::counter::Counter;
use crate::sync::{fence, AtomicUsize, Condvar, Mutex, Ordering};
use crate::tune::{Tune, Tuning};

/// A cache's flush counters written only by its owner, with the barrier
/// its drops read.
#[derive(Debug)]
pub(crate) struct OwnerCounts {
    drops: [Counter; 2],
    done: [Counter; 2],
    flush: NonNull<Flush>,
}

/// A cache's flush counters that any thread may update, with the barrier
/// their drops read (a copy of the owner's: a drop by another thread
/// reading the owner's copy would pull the line the owner writes at every
/// take and drop to its core).
#[derive(Debug)]
pub(crate) struct SharedCounts {
    drops: [Counter; 2],
    done: [Counter; 2],
    flush: NonNull<Flush>,
}

impl OwnerCounts {
    /// Counts a drop by the owner in `parity`.
    #[inline]
    fn dropped(&self, parity: usize) {
        // Relaxed: a flush that must see this drop happens after it, which
        // orders its reads; a racing flush may or may not see it.
        self.drops[parity].bump(1);
    }

    /// Counts a completion by the owner (no wake-up: flushes poll for
    /// these).
    #[inline]
    fn done(&self, parity: usize) {
        // Release pairs with the Acquire sum in `Flush::balanced`: what the
        // owner did to the buffer happens before the flush returns.
        self.done[parity].bump_with(1, Ordering::Release);
    }

    /// Completions by the owner, both parities (an activity hint).
    pub(crate) fn completions(&self) -> u64 {
        // A hint, publishing nothing.
        self.done.iter().map(Counter::get).sum()
    }
}

impl SharedCounts {
    /// Counts a drop by a thread other than the owner in `parity`.
    #[inline]
    fn dropped(&self, parity: usize) {
        // Relaxed: as in `OwnerCounts::dropped`.
        self.drops[parity].add(1);
    }

    /// Counts a completion by a thread other than the owner; the caller
    /// then calls [`Flush::notify`].
    #[inline]
    fn done(&self, parity: usize) {
        // Release: as in `OwnerCounts::done`.
        self.done[parity].add_with(1, Ordering::Release);
    }
}

/// One cache's counters, as the barrier sums them.
pub(crate) type Counts<'a> = (&'a OwnerCounts, &'a SharedCounts);

/// One cache's flush books: its two sets of counters and the barrier they
/// count for. Tickets point here, so a buffer's completion needs only its
/// ticket.
#[derive(Debug)]
pub(crate) struct Books {
    owner: CachePadded<OwnerCounts>,
    shared: CachePadded<SharedCounts>,
}

// SAFETY: the counters are atomics; `flush` points to the barrier of the
// pool whose caches hold these books, which outlives them.
unsafe impl Send for Books {}
// SAFETY: as above.
unsafe impl Sync for Books {}

impl Books {
    /// Books counting for `flush`, which must outlive them.
    pub(crate) fn new(flush: NonNull<Flush>) -> Self {
        Self {
            owner: CachePadded::new(OwnerCounts {
                drops: Default::default(),
                done: Default::default(),
                flush,
            }),
            shared: CachePadded::new(SharedCounts {
                drops: Default::default(),
                done: Default::default(),
                flush,
            }),
        }
    }

    /// Points the books at `flush` (once their pool has its address).
    pub(crate) fn set_flush(&mut self, flush: NonNull<Flush>) {
        self.owner.flush = flush;
        self.shared.flush = flush;
    }

    /// The barrier, read through the copy on the caller's side.
    fn flush(&self, by_owner: bool) -> &Flush {
        let flush = if by_owner {
            self.owner.flush
        } else {
            self.shared.flush
        };
        // SAFETY: the barrier outlives the books (see `new`).
        unsafe { flush.as_ref() }
    }

    /// The books' counters, as the barrier sums them.
    pub(crate) fn counts(&self) -> Counts<'_> {
        (&self.owner, &self.shared)
    }

    /// Counts a drop in the parity of now and returns its ticket: the one
    /// place a drop is counted. `by_owner`: the caller owns these books
    /// (no read-modify-write); otherwise any thread may call.
    #[inline]
    pub(crate) fn open(&self, by_owner: bool) -> Ticket {
        let parity = self.flush(by_owner).parity();
        if by_owner {
            self.owner.dropped(parity);
        } else {
            self.shared.dropped(parity);
        }
        Ticket {
            books: NonNull::from(self),
            parity: parity as u8,
        }
    }
}

/// A counted drop, carried in its buffer's metadata until the buffer is
/// ready again, released or leaked, and then closed: [`close`] and
/// [`close_quietly`] take it by value, so a ticket closes at most once.
/// One dropped unclosed is a bug: debug builds and the loom models panic,
/// and release builds close it then (as a thread other than the owner), so
/// that no flush waits for it forever.
///
/// [`close`]: Ticket::close
/// [`close_quietly`]: Ticket::close_quietly
#[derive(Debug)]
#[must_use = "a ticket is closed when its buffer is ready, released or leaked"]
pub(crate) struct Ticket {
    books: NonNull<Books>,
    parity: u8,
}

// SAFETY: the books are `Sync` and outlive every buffer counted in them:
// a pool's caches are freed only after every buffer is back or leaked.
unsafe impl Send for Ticket {}
// SAFETY: as above.
unsafe impl Sync for Ticket {}

impl Ticket {
    fn books(&self) -> &Books {
        // SAFETY: see the `Send` impl.
        unsafe { self.books.as_ref() }
    }

    /// Counts the buffer's completion (ready again, or released) in the
    /// books its drop was counted in: the one place a completion is
    /// counted. `by_owner`: the caller owns the books (no shared write, no
    /// wake-up: flushes poll for these); otherwise waiting flushes are
    /// woken.
    #[inline]
    pub(crate) fn close(self, by_owner: bool) {
        let books = self.books();
        let parity = usize::from(self.parity);
        if by_owner {
            books.owner.done(parity);
        } else {
            books.shared.done(parity);
            books.flush(false).notify();
        }
        std::mem::forget(self);
    }

    /// As [`close`](Self::close) by a thread other than the owner, without
    /// waking flushes: the caller closes a batch and then calls
    /// [`Flush::notify`] once, so that a flush waiting on a large batch is
    /// not woken by every buffer of it.
    pub(crate) fn close_quietly(self) {
        self.books().shared.done(usize::from(self.parity));
        std::mem::forget(self);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // Loom models run in release builds: they check this too, so a
        // path that forgets its ticket fails every model that reaches it.
        if cfg!(any(debug_assertions, pinpool_loom)) {
            assert!(
                std::thread::panicking(),
                "a flush ticket was dropped without being closed"
            );
        }
        let books = self.books();
        books.shared.done(usize::from(self.parity));
        books.flush(false).notify();
    }
}

/// Drops minus completions over `counts` (both parities): buffers in flight.
pub(crate) fn in_flight<'a>(counts: impl Iterator<Item = Counts<'a>>) -> u64 {
    counts
        .map(|(o, s)| {
            let drops: u64 = (0..2).map(|p| o.drops[p].get() + s.drops[p].get()).sum();
            let done: u64 = (0..2).map(|p| o.done[p].get() + s.done[p].get()).sum();
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
                .map(|p| o.drops[p].get() + s.drops[p].get())
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
                o.done[parity].get_with(Ordering::Acquire)
                    + s.done[parity].get_with(Ordering::Acquire)
            })
            .sum();
        let drops: u64 = counts
            .iter()
            .map(|(o, s)| o.drops[parity].get() + s.drops[parity].get())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn books(flush: &Flush) -> Box<Books> {
        Box::new(Books::new(NonNull::from(flush)))
    }

    #[test]
    fn a_ticket_closed_by_another_thread_balances_the_owners_drop() {
        let flush = Flush::new();
        let books = books(&flush);
        let ticket = books.open(true);
        assert_eq!(in_flight(std::iter::once(books.counts())), 1);
        std::thread::scope(|s| {
            s.spawn(|| ticket.close(false));
        });
        assert_eq!(in_flight(std::iter::once(books.counts())), 0);
        // The flush returns: both parities balance.
        flush.wait(|| std::iter::once(books.counts()), || {});
    }

    #[test]
    fn tickets_of_either_parity_close_in_their_own() {
        let flush = Flush::new();
        let books = books(&flush);
        let first = books.open(false);
        // A flush with the first drop still open would wait; flip by hand
        // through a flush of an empty set of books instead.
        flush.wait(std::iter::empty, || {});
        let second = books.open(true);
        assert_ne!(first.parity, second.parity);
        assert_eq!(in_flight(std::iter::once(books.counts())), 2);
        second.close(true);
        first.close_quietly();
        assert_eq!(in_flight(std::iter::once(books.counts())), 0);
        flush.wait(|| std::iter::once(books.counts()), || {});
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "dropped without being closed")]
    fn a_ticket_dropped_unclosed_is_caught() {
        let flush = Flush::new();
        let books = books(&flush);
        drop(books.open(true));
    }
}
