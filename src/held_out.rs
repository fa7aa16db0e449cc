//! Pooled buffers held out of the shards for a moment, and the takes that
//! wait for them rather than miss.
//!
//! A trim gathers every pooled buffer (the shards' stacks drained, the
//! caches' lists emptied), sorts each class's by idle time, releases the
//! longest idle and pushes the rest back to the shards; a `clear` gathers
//! them all and pushes back those reserved in the generation it begins.
//! Meanwhile a take of a class whose buffers are held finds its shard
//! empty. Without more, it would carve or miss: pin, or stage from pageable
//! memory, while the trim was about to hand the buffer it wanted back, and
//! the extra buffer would stay pinned until a later trim found it idle.
//!
//! [`HeldOut`] tells such a take that a hold overlapped its look at the
//! shard: a sequence number, odd while a hold runs, moved at its start and
//! its end, and a lock held for the hold's length. A take notes the number
//! before it pops ([`HeldOut::mark`]); when the pop and its other sources
//! came up empty, [`HeldOut::waited`] says whether a hold began or ended
//! since, after waiting for one still running to end, and the take pops
//! again.

use crate::sync::{fence, AtomicU64, Mutex, MutexGuard, Ordering};

/// See the module docs.
#[derive(Debug)]
pub(crate) struct HeldOut {
    /// Odd while a hold runs; moved by two per hold.
    seq: AtomicU64,
    /// Held for the length of a hold: takes wait on it.
    lock: Mutex<()>,
}

/// The sequence number a take read before it popped (see [`HeldOut::mark`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mark(u64);

/// A hold under way (see [`HeldOut::hold`]); ends when dropped.
pub(crate) struct Holding<'a> {
    held: &'a HeldOut,
    _lock: MutexGuard<'a, ()>,
}

impl HeldOut {
    /// No hold under way.
    pub(crate) fn new() -> Self {
        Self {
            seq: AtomicU64::new(0),
            lock: Mutex::new(()),
        }
    }

    /// Begins a hold: to be called before the first buffer is taken out of
    /// a shard, and the result kept until the last one kept is pushed back.
    /// Holds run one at a time (a second waits for the first to end).
    pub(crate) fn hold(&self) -> Holding<'_> {
        let lock = self.lock.lock();
        // Relaxed: the fence below orders it before the pops that follow.
        self.seq.fetch_add(1, Ordering::Relaxed);
        // Release: publishes the odd number to a take whose Acquire load of
        // a stack's head (`Stack::pop`, which reads the head the hold's
        // pops leave, or one of the later writes in its release sequence:
        // every write to a head is a compare-exchange) finds the shard
        // emptied by this hold; pairs with that load, or the Acquire fence
        // in `waited`. Without it the take could see the empty shard and
        // the number from before the hold, and miss.
        fence(Ordering::Release);
        Holding {
            held: self,
            _lock: lock,
        }
    }

    /// The sequence number before a take looks at its shard.
    #[inline]
    pub(crate) fn mark(&self) -> Mark {
        // Acquire: pairs with the Release increment that ends a hold (in
        // `Holding::drop`); a take that reads the number a hold left sees
        // the buffers it pushed back.
        Mark(self.seq.load(Ordering::Acquire))
    }

    /// Whether a hold ran, or runs, since `mark`: if so, after waiting for
    /// one running to end, so that the shard holds what it kept. `false`:
    /// no hold emptied the shard the take found empty.
    pub(crate) fn waited(&self, mark: Mark) -> bool {
        // Acquire: pairs with the Release fence in `hold` through any read
        // of the take's that saw a hold's work: the head it found empty (an
        // Acquire load already, in `Stack::pop`), or an inbox's count that
        // an eviction's take zeroed, read Relaxed by a steal.
        fence(Ordering::Acquire);
        // Relaxed: ordered by the fence, it reads the number the hold that
        // emptied what the take found empty left, or a later one (then the
        // take waits or pops again for nothing), never an earlier one.
        let now = self.seq.load(Ordering::Relaxed);
        if now == mark.0 && now & 1 == 0 {
            return false;
        }
        drop(self.lock.lock());
        true
    }
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        // Release: publishes the buffers pushed back to a take whose `mark`
        // reads the number (pairs with its Acquire load). The lock is let
        // go after this, so a take that waited for it pops them too.
        self.held.seq.fetch_add(1, Ordering::Release);
    }
}
