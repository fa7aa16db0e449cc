//! A class's pooled buffers held out of its shard for a moment by a trim,
//! and the takes of that class that wait for them rather than miss.
//!
//! A trim goes through the pooled buffers one slot (a device's class) at a
//! time: it pops all of the slot's buffers from its shard's stack, sorts
//! them by idle time (with those it took out of the threads' caches, idle
//! ones that may go: the slot is held from when they came out), releases
//! the longest idle and pushes the rest back.
//! Meanwhile a take of that slot finds the stack empty. Without more, it
//! would carve or miss (pin, or stage from pageable memory) while the trim
//! was about to hand back the buffer it wanted, and the extra buffer would
//! stay pinned until a later trim found it idle.
//!
//! [`HeldOut`] tells such a take that a hold of its slot overlapped its
//! look at the stack: a sequence number per slot, odd while a hold of the
//! slot runs, moved at the hold's start and at its end. A take notes its
//! slot's number before it pops ([`HeldOut::mark`]); when the pop and its
//! other sources came up empty, [`HeldOut::waited`] says whether a hold of
//! the slot began or ended since, after waiting for one still running to
//! end (that one only, and for [`WAIT_MAX`] at most), and the take pops
//! again. A hold lasts as long as one slot's buffers take to sort (for a
//! slot whose buffers the trim took out of the threads' caches: from then,
//! through the rest of the lock-out, to its sort, which comes first).

use std::time::{Duration, Instant};

use crate::sync::{fence, AtomicU64, Condvar, Mutex, Ordering};

/// The longest a take waits for a hold of its slot to end (see
/// [`HeldOut::waited`]): a hold sorts one slot's buffers, about 16 ms for
/// 100,000 of them in a release build on two cores.
const WAIT_MAX: Duration = Duration::from_millis(100);

/// See the module docs.
#[derive(Debug)]
pub(crate) struct HeldOut {
    /// Per slot: odd while a hold of the slot runs; moved by two per hold.
    seqs: Box<[AtomicU64]>,
    /// With `ended`: where takes wait for a hold to end.
    lock: Mutex<()>,
    /// Notified at the end of every hold.
    ended: Condvar,
}

/// A slot's sequence number, as a take read it before it popped (see
/// [`HeldOut::mark`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mark {
    slot: usize,
    seq: u64,
}

/// A hold of a slot under way (see [`HeldOut::hold`]); ends when dropped.
pub(crate) struct Holding<'a> {
    held: &'a HeldOut,
    slot: usize,
}

impl HeldOut {
    /// No hold under way, for `slots` slots.
    pub(crate) fn new(slots: usize) -> Self {
        Self {
            seqs: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            lock: Mutex::new(()),
            ended: Condvar::new(),
        }
    }

    /// Begins a hold of `slot`: to be called before the first of its
    /// buffers leaves where takes look (its stack, or a cache's lists while
    /// the owner is locked out), and the result kept until the last one kept
    /// is pushed back, with nothing between that could take from the pool
    /// (a call into a tracing subscriber, say): a take of the slot on the
    /// holding thread would wait for its own hold. Holds of several slots
    /// may run at once (one trim's), never two of one slot.
    pub(crate) fn hold(&self, slot: usize) -> Holding<'_> {
        // Relaxed: the fence below orders it before the pops that follow.
        self.seqs[slot].fetch_add(1, Ordering::Relaxed);
        // Release: publishes the odd number to a take whose Acquire load of
        // the stack's head (`Stack::pop`, which reads the head the hold's
        // pops leave, or one of the later writes in its release sequence:
        // every write to a head is a compare-exchange) finds the stack
        // emptied by this hold; pairs with that load, or the Acquire fence
        // in `waited` after a Relaxed read of the hold's work, such as a
        // steal's read of a list's ready count that a buffer taken out of a
        // locked-out cache lowered. An owner whose lists lost a buffer sees
        // the number through the lock-out's end (its Acquire of the request
        // word, or the cache's lock). Without it the take could see the
        // empty stack and the number from before the hold, and miss.
        fence(Ordering::Release);
        Holding { held: self, slot }
    }

    /// `slot`'s sequence number before a take looks at its stack.
    #[inline]
    pub(crate) fn mark(&self, slot: usize) -> Mark {
        // Acquire: pairs with the Release increment that ends a hold (in
        // `Holding::drop`); a take that reads the number a hold left sees
        // the buffers it pushed back.
        let seq = self.seqs[slot].load(Ordering::Acquire);
        Mark { slot, seq }
    }

    /// Whether a hold of the mark's slot ran, or runs, since the mark: if
    /// so, after waiting for the one running now (if any) to end, so that
    /// the stack holds what it kept. `false`: no hold emptied the stack
    /// the take found empty, or the one running has run past
    /// [`WAIT_MAX`] since the take began to wait.
    pub(crate) fn waited(&self, mark: Mark) -> bool {
        let seq = &self.seqs[mark.slot];
        // Acquire: pairs with the Release fence in `hold` through the
        // take's Acquire load of the head it found empty (in `Stack::pop`),
        // or any Relaxed read of its that saw a hold's work.
        fence(Ordering::Acquire);
        // Acquire: as in `mark`, for a hold that ended since. With the
        // fence above it reads the number the hold that emptied the stack
        // left, or a later one (then the take waits, or pops again, for
        // nothing), never an earlier one.
        let now = seq.load(Ordering::Acquire);
        if now == mark.seq && now & 1 == 0 {
            return false;
        }
        if now & 1 == 1 {
            let started = Instant::now();
            let mut guard = self.lock.lock();
            // Acquire: as in `mark`. The end's increment comes before its
            // notification, which takes the lock: read under the lock, a
            // number still `now` means the notification is still to come.
            while seq.load(Ordering::Acquire) == now {
                if cfg!(pinpool_loom) {
                    guard = self.ended.wait(guard);
                    continue;
                }
                let Some(left) = WAIT_MAX.checked_sub(started.elapsed()) else {
                    // A hold this long (a sort of a great many buffers, or
                    // a trimming thread kept off the cores): the take goes
                    // on as if none had held the slot.
                    return false;
                };
                guard = self.ended.wait_timeout(&self.lock, guard, left);
            }
        }
        true
    }
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        // Release: publishes the buffers pushed back to a take whose `mark`
        // or `waited` reads the number (pairs with their Acquire loads).
        self.held.seqs[self.slot].fetch_add(1, Ordering::Release);
        // Under the lock: a take that read the odd number under it is
        // waiting by now, and is woken.
        drop(self.held.lock.lock());
        self.held.ended.notify_all();
    }
}
