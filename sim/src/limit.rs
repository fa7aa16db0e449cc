//! The workload's speed limit, **wrong on purpose**: the ideal strategy's
//! lists ([`Prepared`]: every buffer each prover needs, prepared and
//! page-locked on a GPU before the run), with none of the work that makes
//! reuse correct. A give-back pushes the buffer straight back, dirty, and
//! a take pops it again without re-zeroing it and without waiting for the
//! copy that may still be reading it. No real strategy may do either: the
//! contract hands out all-zero buffers, and writing a buffer while a DMA
//! reads it corrupts the copy. What is left is only the workload's own
//! work (writing, copying, its CPU gaps), so no strategy can run faster.

use std::sync::Arc;

use cudarc::driver::CudaContext;

use crate::demand::Demand;
use crate::ideal::{IdealBuffer, Prepared};

/// The limit strategy's buffers.
#[derive(Debug)]
pub struct LimitPool {
    lists: Prepared,
}

impl LimitPool {
    /// Bytes the pool for `demand` holds (as many as the ideal
    /// strategy's).
    pub fn bytes_needed(demand: &dyn Demand) -> u64 {
        Prepared::bytes_needed(demand)
    }

    /// Prepares every buffer of `demand` ([`Prepared::new`]).
    pub fn new(demand: &dyn Demand, gpu: Option<&[Arc<CudaContext>]>) -> Self {
        Self {
            lists: Prepared::new(demand, gpu),
        }
    }

    /// A buffer of at least `size` bytes (its fine class's length) for
    /// `prover`, as it was last given back: neither re-zeroed nor waited
    /// for ([`Prepared::pop`]).
    pub fn take(&self, prover: usize, size: usize) -> IdealBuffer {
        self.lists.pop(prover, size)
    }

    /// Gives `buf` back to `prover`'s list as it is, whatever was written
    /// and whatever copy may still read it.
    pub fn give_back(&self, prover: usize, buf: IdealBuffer) {
        self.lists.push(prover, buf);
    }

    /// Bytes page-locked (all the pool's, on a GPU).
    pub fn pinned_bytes(&self) -> u64 {
        self.lists.pinned_bytes()
    }

    /// `cuMemHostAlloc` calls made, all before the run: one per buffer on
    /// a GPU, none without.
    pub fn registrations(&self) -> u64 {
        self.lists.registrations()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Workload;

    #[test]
    fn hands_buffers_out_again_as_they_were_given_back() {
        let workload = Workload {
            devices: 1,
            provers_per_device: 1,
            segments: 1,
            arenas: 1,
            staging: 0,
            scale: 1e-4,
            gap_ms: (0.0, 0.0),
            seed: 2,
        };
        let pool = LimitPool::new(&workload, None);
        assert_eq!(pool.pinned_bytes(), 0);
        assert_eq!(pool.registrations(), 0);
        let size = workload.plan(0)[0].buffers[0].size;
        let mut buf = pool.take(0, size);
        assert!(buf.len() >= size);
        // Prepared zeroed, like the ideal strategy's.
        assert!(buf.iter().all(|&b| b == 0));
        let at = buf.as_ptr();
        buf[..size].fill(0xA5);
        pool.give_back(0, buf);
        // The same memory, still dirty: never re-zeroed. A give-back takes
        // no stream and records nothing, so a take has nothing to wait for.
        let buf = pool.take(0, size);
        assert_eq!(buf.as_ptr(), at);
        assert!(buf[..size].iter().all(|&b| b == 0xA5));
    }
}
