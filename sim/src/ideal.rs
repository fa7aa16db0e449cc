//! The workload's upper bound: before the run, each prover gets a private
//! free list per length it will ask for, holding exactly the most buffers
//! of that length it ever holds at once, allocated, pre-faulted
//! (page-locked with `cuMemHostAlloc` on a GPU) and zeroed. A take pops, so
//! it never misses and never waits for another thread; a give-back
//! re-zeroes the written prefix on the prover's own thread and pushes.
//!
//! Lengths are pinpool's fine size classes ([`SizeClasses::Fine`]), at most
//! 12.5% over the size asked: sizes are drawn from a continuous profile, so
//! lists by exact size would hold nearly every buffer of the run (about
//! 256 GiB at full scale), where lists by class hold a few segments' worth.
//!
//! On a GPU the copy of a buffer may still be reading it when it is given
//! back, so there the give-back records an event instead, and the prefix is
//! re-zeroed, still on the prover's thread, once that copy is known to be
//! done: when the buffer is next popped, or at the end of the prover's run.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

use pinpool::SizeClasses;

use crate::demand::Demand;
use crate::gpu::HostAlloc;

/// The free lists of one prover, by length.
type Lists = HashMap<usize, Vec<IdealBuffer>>;

/// Every buffer each prover of a run needs, prepared before it starts:
/// the free lists of the ideal strategy, and of the limit strategy
/// ([`crate::limit`]).
#[derive(Debug)]
pub struct Prepared {
    provers: Vec<Mutex<Lists>>,
    /// Each prover's context, on a GPU.
    contexts: Vec<Option<Arc<CudaContext>>>,
    pinned_bytes: AtomicU64,
    registrations: AtomicU64,
    /// Buffers prepared during the run (see [`Prepared::pop`]).
    late: AtomicU64,
}

impl Prepared {
    /// Bytes the lists for `demand` hold.
    pub fn bytes_needed(demand: &dyn Demand) -> u64 {
        (0..demand.provers())
            .flat_map(|p| demand.peak_holdings(p, &length))
            .map(|(size, count)| (size * count) as u64)
            .sum()
    }

    /// Prepares every buffer of `demand`, one thread per prover, pinned
    /// on `gpu` if given (on the prover's device, usable from every
    /// context).
    pub fn new(demand: &dyn Demand, gpu: Option<&[Arc<CudaContext>]>) -> Self {
        let contexts: Vec<Option<Arc<CudaContext>>> = (0..demand.provers())
            .map(|prover| gpu.map(|g| g[demand.device_of(prover)].clone()))
            .collect();
        let provers: Vec<Mutex<Lists>> = std::thread::scope(|scope| {
            let preparing: Vec<_> = (0..demand.provers())
                .map(|prover| {
                    let ctx = contexts[prover].as_ref();
                    scope.spawn(move || {
                        demand
                            .peak_holdings(prover, &length)
                            .into_iter()
                            .map(|(size, count)| {
                                let buffers = (0..count)
                                    .map(|_| IdealBuffer::prepared(ctx, size))
                                    .collect();
                                (size, buffers)
                            })
                            .collect::<Lists>()
                    })
                })
                .collect();
            preparing
                .into_iter()
                .map(|p| Mutex::new(p.join().expect("preparing the ideal strategy's buffers")))
                .collect()
        });
        let (pinned_bytes, registrations) = if gpu.is_some() {
            let buffers: usize = provers
                .iter()
                .map(|l| {
                    let lists = l.lock().expect("the prover's free lists");
                    lists.values().map(Vec::len).sum::<usize>()
                })
                .sum();
            (Self::bytes_needed(demand), buffers as u64)
        } else {
            (0, 0)
        };
        Self {
            provers,
            contexts,
            pinned_bytes: AtomicU64::new(pinned_bytes),
            registrations: AtomicU64::new(registrations),
            late: AtomicU64::new(0),
        }
    }

    /// Pops a buffer of `size`'s length (its fine class) from `prover`'s
    /// list, as it was given back.
    ///
    /// A simulated prover never finds its list empty: it holds at most
    /// its plan's buffers. A replayed thread can, when a buffer another
    /// thread gives back to it runs late against the trace's times; then
    /// a buffer is prepared now, counted as pinned and as a registration on
    /// a GPU, and in [`Prepared::late`].
    pub fn pop(&self, prover: usize, size: usize) -> IdealBuffer {
        let popped = self.provers[prover]
            .lock()
            .expect("the prover's free lists")
            .get_mut(&length(size))
            .and_then(Vec::pop);
        popped.unwrap_or_else(|| {
            let len = length(size);
            self.late.fetch_add(1, Ordering::Relaxed);
            if self.contexts[prover].is_some() {
                self.pinned_bytes.fetch_add(len as u64, Ordering::Relaxed);
                self.registrations.fetch_add(1, Ordering::Relaxed);
            }
            IdealBuffer::prepared(self.contexts[prover].as_ref(), len)
        })
    }

    /// Buffers prepared during the run because a list was empty (see
    /// [`Prepared::pop`]).
    pub fn late(&self) -> u64 {
        self.late.load(Ordering::Relaxed)
    }

    /// Pushes `buf` onto `prover`'s list of its length.
    pub fn push(&self, prover: usize, buf: IdealBuffer) {
        self.provers[prover]
            .lock()
            .expect("the prover's free lists")
            .entry(buf.len())
            .or_default()
            .push(buf);
    }

    /// Bytes page-locked (all the lists', on a GPU).
    pub fn pinned_bytes(&self) -> u64 {
        self.pinned_bytes.load(Ordering::Relaxed)
    }

    /// `cuMemHostAlloc` calls made, all before the run: one per buffer on
    /// a GPU, none without.
    pub fn registrations(&self) -> u64 {
        self.registrations.load(Ordering::Relaxed)
    }

    /// Bytes of the buffers in the lists now.
    pub fn bytes_held(&self) -> u64 {
        self.provers
            .iter()
            .map(|l| {
                let lists = l.lock().expect("the prover's free lists");
                lists
                    .values()
                    .flatten()
                    .map(|b| b.len() as u64)
                    .sum::<u64>()
            })
            .sum()
    }
}

/// Every buffer of a run, prepared before it starts.
#[derive(Debug)]
pub struct IdealPool {
    lists: Prepared,
    bytes_zeroed: AtomicU64,
}

/// A buffer of the [`Prepared`] lists of an [`IdealPool`] or a
/// [`LimitPool`](crate::limit::LimitPool).
#[derive(Debug)]
pub struct IdealBuffer {
    memory: Memory,
    /// The last copy from the buffer and the bytes to re-zero once it is
    /// done (the ideal strategy's, on a GPU).
    pending: Option<(CudaEvent, usize)>,
}

#[derive(Debug)]
enum Memory {
    Pageable(Vec<u8>),
    Pinned(HostAlloc),
}

impl IdealPool {
    /// Bytes the pool for `demand` holds.
    pub fn bytes_needed(demand: &dyn Demand) -> u64 {
        Prepared::bytes_needed(demand)
    }

    /// Prepares every buffer of `demand` ([`Prepared::new`]).
    pub fn new(demand: &dyn Demand, gpu: Option<&[Arc<CudaContext>]>) -> Self {
        Self {
            lists: Prepared::new(demand, gpu),
            bytes_zeroed: AtomicU64::new(0),
        }
    }

    /// A zeroed buffer of at least `size` bytes (its class's length) for
    /// `prover`.
    ///
    /// A list found empty prepares one now ([`Prepared::pop`]).
    pub fn take(&self, prover: usize, size: usize) -> IdealBuffer {
        let mut buf = self.lists.pop(prover, size);
        self.clean(&mut buf);
        buf
    }

    /// Gives `buf`, of which the first `written` bytes were written, back
    /// to `prover`'s free list. Re-zeroes them now without `stream`; with
    /// it, records an event after the copy enqueued there and re-zeroes
    /// once the copy is done.
    pub fn give_back(
        &self,
        prover: usize,
        mut buf: IdealBuffer,
        written: usize,
        stream: Option<&Arc<CudaStream>>,
    ) {
        match stream {
            Some(stream) => {
                let event = stream.record_event(None).expect("record an event");
                buf.pending = Some((event, written));
            }
            None => self.zero(&mut buf, written),
        }
        self.lists.push(prover, buf);
    }

    /// Re-zeroes every buffer of `prover` still waiting for its copy
    /// (waiting for it first); the prover calls this at the end of its run.
    pub fn finish(&self, prover: usize) {
        let mut lists = self.lists.provers[prover]
            .lock()
            .expect("the prover's free lists");
        for buf in lists.values_mut().flatten() {
            self.clean(buf);
        }
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

    /// Bytes re-zeroed after use (preparation not included).
    pub fn bytes_zeroed(&self) -> u64 {
        self.bytes_zeroed.load(Ordering::Relaxed)
    }

    /// Waits for `buf`'s last copy, if any, and re-zeroes what it wrote.
    fn clean(&self, buf: &mut IdealBuffer) {
        if let Some((event, written)) = buf.pending.take() {
            event.synchronize().expect("wait for a copy");
            self.zero(buf, written);
        }
    }

    fn zero(&self, buf: &mut IdealBuffer, written: usize) {
        buf[..written].fill(0);
        self.bytes_zeroed
            .fetch_add(written as u64, Ordering::Relaxed);
    }
}

/// The length of the buffer the ideal strategy keeps for a take of `size`
/// bytes: its fine size class.
fn length(size: usize) -> usize {
    SizeClasses::Fine
        .len_for(size)
        .expect("the simulator's sizes stay within the largest class")
}

impl IdealBuffer {
    /// `size` zeroed bytes with every page faulted in: page-locked in
    /// `ctx` (and every other context) if given, else pageable.
    fn prepared(ctx: Option<&Arc<CudaContext>>, size: usize) -> Self {
        let memory = match ctx {
            Some(ctx) => Memory::Pinned(
                HostAlloc::new(ctx, size, true).expect("cuMemHostAlloc for the ideal strategy"),
            ),
            None => Memory::Pageable(vec![0; size]),
        };
        let mut buf = Self {
            memory,
            pending: None,
        };
        // Fresh zeroed pages are mapped on first write: writing the zeros
        // (through `black_box`, so that they are not elided as already
        // there) faults every page in now, outside the run.
        std::hint::black_box(&mut buf[..]).fill(0);
        buf
    }
}

impl Deref for IdealBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.memory {
            Memory::Pageable(v) => v,
            Memory::Pinned(m) => m,
        }
    }
}

impl DerefMut for IdealBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.memory {
            Memory::Pageable(v) => v,
            Memory::Pinned(m) => m,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Workload;

    fn workload() -> Workload {
        Workload {
            devices: 1,
            provers_per_device: 2,
            segments: 3,
            arenas: 4,
            staging: 1,
            scale: 1e-4,
            gap_ms: (0.0, 0.0),
            seed: 5,
        }
    }

    #[test]
    fn holds_each_provers_plan_and_gives_back_zeroed() {
        let workload = workload();
        let pool = IdealPool::new(&workload, None);
        assert_eq!(pool.pinned_bytes(), 0);
        assert_eq!(pool.registrations(), 0);
        for prover in 0..workload.provers() {
            for segment in workload.plan(prover) {
                let mut taken: Vec<_> = segment
                    .buffers
                    .iter()
                    .map(|b| (pool.take(prover, b.size), b.written))
                    .collect();
                for (buf, written) in &mut taken {
                    assert!(buf.iter().all(|&b| b == 0));
                    buf[..*written].fill(0xA5);
                }
                for (buf, written) in taken {
                    pool.give_back(prover, buf, written, None);
                }
            }
            pool.finish(prover);
        }
        let written: usize = (0..workload.provers())
            .flat_map(|p| workload.plan(p))
            .flat_map(|s| s.buffers)
            .map(|b| b.written)
            .sum();
        assert_eq!(pool.bytes_zeroed(), written as u64);
        assert_eq!(pool.lists.bytes_held(), IdealPool::bytes_needed(&workload));
    }
}
