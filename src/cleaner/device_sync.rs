//! The fallback for pinned buffers dropped without recorded events: a
//! synchronize of the buffer's device (its primary context) that started
//! after the drop.
//!
//! Synchronizes are numbered. A drop notes the number of synchronizes
//! *started* so far; the buffer may be reused once a synchronize numbered
//! higher has *completed*, since that one started after the drop. One
//! synchronize therefore covers every buffer dropped before it started, so
//! a burst of event-less buffers costs one. The copies a dropping thread
//! enqueued are driver calls, not atomics of ours, so the store-buffering
//! pattern needs a SeqCst fence on each side: the drop fences after its
//! copies and before reading the count, the synchronize after taking its
//! number and before calling the driver. Either the note counts that
//! synchronize, or the synchronize sees the copies enqueued. Copies issued
//! outside the device's primary context are not covered: record events for
//! those.

use crate::backend::Backend;
use crate::error::Error;
use crate::sync::{fence, AtomicU64, Mutex, Ordering};

#[derive(Debug)]
struct Device {
    started: AtomicU64,
    /// The highest-numbered synchronize that has completed; held while one
    /// runs, so synchronizes of a device run one at a time.
    done: Mutex<u64>,
    /// A copy of `done`, readable without waiting for a running one.
    completed: AtomicU64,
}

/// Synchronize numbering per device; see the module docs.
#[derive(Debug)]
pub(crate) struct DeviceSyncs {
    devices: Box<[Device]>,
}

/// What [`DeviceSyncs::try_sync`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Synced {
    /// A synchronize above the note had already completed.
    Already,
    /// This call ran one.
    Ran,
    /// Another thread is running one; ask again later (without blocking).
    Busy,
}

impl DeviceSyncs {
    pub(crate) fn new(devices: usize) -> Self {
        Self {
            devices: (0..devices)
                .map(|_| Device {
                    started: AtomicU64::new(0),
                    done: Mutex::new(0),
                    completed: AtomicU64::new(0),
                })
                .collect(),
        }
    }

    /// The note a drop takes: synchronizes of `device` started so far.
    #[inline]
    pub(crate) fn started(&self, device: usize) -> u64 {
        // See the module docs: the fence orders the caller's copies before
        // the read.
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fence above.
        self.devices[device].started.load(Ordering::Relaxed)
    }

    /// Whether a synchronize of `device` numbered above `note` has
    /// completed. Never blocks.
    #[inline]
    pub(crate) fn settled(&self, device: usize, note: u64) -> bool {
        // Acquire pairs with the Release store in `run`: seeing the number
        // means the synchronize returned before this thread goes on to
        // unregister or reuse the buffer. A stale value only says "not
        // yet", and the buffer waits.
        self.devices[device].completed.load(Ordering::Acquire) > note
    }

    /// Runs a synchronize of `device` unless one numbered above `note` has
    /// completed or another thread is running one (then returns at once:
    /// one slow synchronize holds up one worker, not every worker that
    /// holds an event-less buffer of the device).
    pub(crate) fn try_sync(
        &self,
        backend: &dyn Backend,
        device: usize,
        note: u64,
    ) -> Result<Synced, Error> {
        if self.settled(device, note) {
            return Ok(Synced::Already);
        }
        let entry = &self.devices[device];
        let Some(mut done) = entry.done.try_lock() else {
            return Ok(Synced::Busy);
        };
        if *done > note {
            return Ok(Synced::Already);
        }
        Self::run(backend, device, entry, &mut done)?;
        Ok(Synced::Ran)
    }

    /// Returns once a synchronize of `device` numbered above `note` has
    /// completed, running one if none has (waiting for a running one
    /// first). True if this call synchronized.
    pub(crate) fn wait(
        &self,
        backend: &dyn Backend,
        device: usize,
        note: u64,
    ) -> Result<bool, Error> {
        let entry = &self.devices[device];
        let mut done = entry.done.lock();
        if *done > note {
            return Ok(false);
        }
        Self::run(backend, device, entry, &mut done)?;
        Ok(true)
    }

    fn run(
        backend: &dyn Backend,
        device: usize,
        entry: &Device,
        done: &mut u64,
    ) -> Result<(), Error> {
        // Relaxed, then the fence: see the module docs. Synchronizes run
        // one at a time per device (under `done`), so numbers complete in
        // order.
        let number = entry.started.fetch_add(1, Ordering::Relaxed) + 1;
        fence(Ordering::SeqCst);
        backend.synchronize(device)?;
        *done = number;
        // Release: see `settled`.
        entry.completed.store(number, Ordering::Release);
        Ok(())
    }
}
