//! Buffers whose fences had not completed when a worker got them wait here
//! and are re-polled by idle workers, so one slow event holds up nothing
//! else; so do returned misses waiting for a growth of their regions, or
//! for the regions' demand to settle (see `Cleaner::carve_for`).

use super::job::Returned;
use crate::sync::{AtomicUsize, Mutex, Ordering};

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Parking {
    parked: Mutex<Vec<Returned>>,
    /// The same count, readable without the lock.
    len: AtomicUsize,
}

impl Parking {
    pub(crate) fn new() -> Self {
        Self {
            parked: Mutex::new(Vec::new()),
            len: AtomicUsize::new(0),
        }
    }

    /// Buffers parked. Relaxed: a hint for how long idle workers wait; a
    /// stale zero only delays the next poll to the next job, or to the
    /// parking worker's own next poll.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    pub(crate) fn park(&self, returned: Returned) {
        let mut parked = self.parked.lock();
        parked.push(returned);
        self.len.store(parked.len(), Ordering::Relaxed);
    }

    /// Takes the buffers whose wait `check` says is over (`Some(outcome)`),
    /// unless another worker is polling already.
    pub(crate) fn poll<O>(
        &self,
        mut check: impl FnMut(&mut Returned) -> Option<O>,
    ) -> Vec<(Returned, O)> {
        if self.len() == 0 {
            return Vec::new();
        }
        let Some(mut parked) = self.parked.try_lock() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut i = 0;
        while i < parked.len() {
            match check(&mut parked[i]) {
                Some(outcome) => out.push((parked.swap_remove(i), outcome)),
                None => i += 1,
            }
        }
        self.len.store(parked.len(), Ordering::Relaxed);
        out
    }

    /// Takes every parked buffer.
    pub(crate) fn take_all(&self) -> Vec<Returned> {
        let mut parked = self.parked.lock();
        self.len.store(0, Ordering::Relaxed);
        std::mem::take(&mut *parked)
    }
}
