//! What travels through the cleaner: a dropped buffer with where it came
//! from ([`Returned`]), the jobs on the lanes ([`Job`]), and a large
//! buffer's zeroing split into chunks ([`Chunked`]).

use std::ptr::NonNull;

use crate::alloc::Block;
use crate::remote::Inbox;
use crate::stats::Counters;
use crate::sync::track::Contents;
use crate::sync::{Arc, AtomicUsize, Mutex};

/// A dropped buffer on its way through the cleaner, with the inbox of the
/// cache it was taken through (where it may go back once ready) and the
/// pool's counters. If a job panics while holding one, its `Drop`
/// frees the buffer if it is known to be quiescent and unregistered, leaks
/// it otherwise, and counts the completion: nothing is lost and no flush
/// hangs.
#[derive(Debug)]
pub(crate) struct Returned {
    block: Option<Block>,
    /// The inbox of the cache the buffer was taken through.
    pub(crate) home: NonNull<Inbox>,
    counters: NonNull<Counters>,
    /// Freed once quiescent rather than recycled.
    pub(crate) release: bool,
    /// Its copies are known to have finished.
    pub(crate) quiet: bool,
    /// Goes to its device's shard, not back to its home cache (whose owner
    /// went idle).
    pub(crate) to_shard: bool,
    /// Parked, since the time it holds, until another worker's growth of
    /// its set of regions ends and the set's demand has settled (for
    /// [`GROWTH_SETTLE_MAX`](crate::tune::Tuning::GROWTH_SETTLE_MAX) at
    /// most): a miss whose replacement comes from what a growth lists (see
    /// `Cleaner::carve_for`).
    pub(crate) growth: Option<std::time::Instant>,
}

// SAFETY: a returned buffer owns its block; `home` and `counters` point
// into the pool's caches, which outlive every job (jobs are drained before
// a pool goes, and a closed pool's caches stay until its reaper is done).
unsafe impl Send for Returned {}

impl Returned {
    pub(crate) fn new(block: Block, home: &Inbox, counters: &Counters) -> Self {
        Self {
            block: Some(block),
            home: NonNull::from(home),
            counters: NonNull::from(counters),
            release: false,
            quiet: false,
            to_shard: false,
            growth: None,
        }
    }

    pub(crate) fn block(&self) -> &Block {
        self.block.as_ref().expect("held until finished")
    }

    pub(crate) fn block_mut(&mut self) -> &mut Block {
        self.block.as_mut().expect("held until finished")
    }

    fn counters(&self) -> &Counters {
        // SAFETY: see the `Send` impl.
        unsafe { self.counters.as_ref() }
    }

    /// Takes the block out to hold it while it is being worked on
    /// (`None` once taken).
    pub(crate) fn take_block(&mut self) -> Option<Block> {
        self.block.take()
    }

    /// Puts `block` in the place of the block held, which it returns.
    pub(crate) fn replace_block(&mut self, block: Block) -> Block {
        self.block.replace(block).expect("held until finished")
    }

    /// Takes the block out, completing nothing yet.
    pub(crate) fn into_block(mut self) -> Block {
        self.block.take().expect("held until finished")
    }
}

impl Drop for Returned {
    fn drop(&mut self) {
        let Some(mut block) = self.block.take() else {
            return;
        };
        let counters = self.counters();
        let ticket = block.take_ticket();
        if self.quiet && !block.is_pinned() {
            tracing::error!("pinpool: a cleaner job failed part-way; freeing its buffer");
            // Its spare events are destroyed (the pool's are out of reach).
            block.fences_mut().abandon();
            Counters::add(&counters.released, 1);
            drop(block);
        } else {
            tracing::error!(
                bytes = block.footprint(),
                "pinpool: a cleaner job failed part-way; leaking its buffer"
            );
            block.fences_mut().abandon();
            let leaked = block.leak();
            Counters::add(&counters.leaked_bytes, leaked as u64);
        }
        if let Some(ticket) = ticket {
            ticket.close(false);
        }
    }
}

/// What the cleaner receives.
pub(crate) enum Job {
    /// A dropped buffer to clean and recycle.
    Clean(Returned),
    /// A dropped pool-miss buffer to register on its first cycle.
    Register(Returned),
    /// Collect the caches' release lists: pinned buffers shed past the
    /// backlog, to free once their copies are done (see `Intake::shed`).
    Bulk,
    /// Collect the fences of buffers their droppers freed (see [`Spent`](super::spent::Spent)).
    Spent,
    /// Chunk `index` of a large buffer's zeroing / pre-faulting.
    Chunk(Arc<Chunked>, usize),
}

/// A large buffer being zeroed / pre-faulted by several workers.
pub(crate) struct Chunked {
    pub(crate) returned: Mutex<Option<Returned>>,
    pub(crate) contents: Contents,
    pub(crate) base: usize,
    pub(crate) dirty: usize,
    pub(crate) end: usize,
    /// Chunks not yet done; the worker that takes it to zero finishes.
    pub(crate) remaining: AtomicUsize,
}
