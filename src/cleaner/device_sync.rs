//! The fallback for pinned buffers dropped without recorded events: a
//! synchronize of the buffer's device (its primary context) that started
//! after the drop.
//!
//! Synchronizes are numbered. A drop notes the number of synchronizes
//! *started* so far; the buffer may be reused once a synchronize numbered
//! higher has *completed*, since that one started after the drop. One
//! synchronize therefore covers every buffer dropped before it started, so
//! a burst of event-less buffers costs one. Both the note and the numbering
//! are SeqCst, so a synchronize that the note did not count started after
//! the copies the dropping thread had enqueued. Copies issued outside the
//! device's primary context are not covered: record events for those.

use crate::backend::Backend;
use crate::error::Error;
use crate::sync::{AtomicU64, Mutex, Ordering};

#[derive(Debug)]
struct Device {
    started: AtomicU64,
    /// The highest-numbered synchronize that has completed.
    done: Mutex<u64>,
}

/// Synchronize numbering per device; see the module docs.
#[derive(Debug)]
pub(crate) struct DeviceSyncs {
    devices: Box<[Device]>,
}

impl DeviceSyncs {
    pub(crate) fn new(devices: usize) -> Self {
        Self {
            devices: (0..devices)
                .map(|_| Device {
                    started: AtomicU64::new(0),
                    done: Mutex::new(0),
                })
                .collect(),
        }
    }

    /// The note a drop takes: synchronizes of `device` started so far.
    #[inline]
    pub(crate) fn started(&self, device: usize) -> u64 {
        // SeqCst: see the module docs.
        self.devices[device].started.load(Ordering::SeqCst)
    }

    /// Returns once a synchronize of `device` numbered above `note` has
    /// completed, running one if none has. True if this call synchronized.
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
        // SeqCst: see the module docs. Synchronizes run one at a time per
        // device (under `done`), so numbers complete in order.
        let number = entry.started.fetch_add(1, Ordering::SeqCst) + 1;
        backend.synchronize(device)?;
        *done = number;
        Ok(true)
    }
}
