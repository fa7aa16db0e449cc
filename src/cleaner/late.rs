//! A closed pool's late buffers: the reaper asks the cleaner where each
//! stands, and a device synchronize a pinned one needs runs off the
//! reaper's thread, one per device at a time.

use crate::alloc::Block;
use crate::error::Error;
use crate::stats::Counters;
use crate::sync::Ordering;

use super::{Cleaner, Env};

/// Where a closed pool's late buffer stands; see [`Cleaner::settle_late`].
#[derive(Debug)]
pub(crate) enum Late {
    /// Its copies have finished: retire it.
    Settled,
    /// Not yet: look again later.
    Waiting,
    /// It needs a synchronize of this device above this note: run it with
    /// [`Cleaner::run_late_sync`], then look again.
    NeedsSync(usize, u64),
}

impl Cleaner {
    /// Where a closed pool's late buffer stands; the reaper, the only
    /// caller, never blocks here: a device synchronize the buffer needs is
    /// [`Late::NeedsSync`], for the caller to run off the reaper's thread
    /// ([`run_late_sync`](Self::run_late_sync)), one per device at a time.
    pub(crate) fn settle_late(&self, block: &mut Block) -> Result<Late, Error> {
        if !block.fences_mut().is_empty() {
            return Ok(match block.fences_mut().poll()? {
                true => Late::Settled,
                false => Late::Waiting,
            });
        }
        if !block.is_pinned() {
            return Ok(Late::Settled);
        }
        let (device, note) = (block.device(), block.meta_mut().sync_gen);
        if self.intake.syncs.settled(device, note) {
            return Ok(Late::Settled);
        }
        let late = &self.late_syncs[device];
        // Acquire pairs with the Release store in `run_late_sync`: seeing
        // the last synchronize over means seeing its failure, if any,
        // recorded below.
        if late.running.swap(true, Ordering::Acquire) {
            return Ok(Late::Waiting);
        }
        if let Some(e) = late.failed.lock().take() {
            // The synchronize this buffer may have waited for failed: its
            // copies are not known to have finished. Later buffers get a
            // new one. Release: as in `run_late_sync`.
            late.running.store(false, Ordering::Release);
            return Err(e);
        }
        Ok(Late::NeedsSync(device, note))
    }

    /// Runs the device synchronize that [`settle_late`](Self::settle_late)
    /// asked for (blocking the calling thread).
    pub(crate) fn run_late_sync(&self, env: Env<'_>, device: usize, note: u64) {
        let late = &self.late_syncs[device];
        match self.intake.syncs.wait(env.backend, device, note) {
            Ok(synced) => {
                if synced {
                    Counters::add(&env.counters().device_syncs, 1);
                }
                // A synchronize above the note completed: an older failure
                // no longer says anything about the buffers waiting now.
                *late.failed.lock() = None;
            }
            Err(e) => *late.failed.lock() = Some(e),
        }
        // Release: see `settle_late`.
        late.running.store(false, Ordering::Release);
    }
}
