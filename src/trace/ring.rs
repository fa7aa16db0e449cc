//! A thread's trace buffer: a bounded ring of records, written by one
//! thread (the owner of the thread cache it belongs to) and read by the
//! trace's background thread, with no lock on either side; or a shared
//! ring that several threads write under a lock (the orphan cache's takes,
//! the cleaner's events). A full ring drops the record and counts it.
//!
//! The ring uses `std`'s atomics, not the crate's `sync` layer: tracing is
//! never enabled under the loom models.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crossbeam_utils::CachePadded;

use super::clock::Clock;

/// Records one thread's ring holds: at 48 bytes each, 384 KiB; the
/// background thread empties it every few milliseconds.
pub(crate) const THREAD_RECORDS: usize = 8192;

/// Records the shared ring holds.
pub(crate) const SHARED_RECORDS: usize = 1 << 16;

/// The producer's side.
#[derive(Debug)]
struct Producer {
    /// Records written (the next slot is `head % capacity`).
    head: AtomicUsize,
    /// The producer's last view of `tail` (only the producer reads and
    /// writes it).
    tail_seen: AtomicUsize,
    /// Records dropped because the ring was full.
    lost: AtomicU64,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Ring {
    slots: Box<[[AtomicU64; 6]]>,
    mask: usize,
    clock: Clock,
    producer: CachePadded<Producer>,
    /// Records read by the background thread.
    tail: CachePadded<AtomicUsize>,
    /// Records lost that the background thread has reported.
    lost_reported: AtomicU64,
    /// For a shared ring: serialises the producers.
    lock: Option<Mutex<()>>,
}

impl Ring {
    /// A ring of `capacity` records (a power of two), read with `clock`;
    /// `shared`: several threads may write.
    pub(crate) fn new(capacity: usize, clock: Clock, shared: bool) -> Self {
        assert!(capacity.is_power_of_two());
        Self {
            slots: (0..capacity).map(|_| Default::default()).collect(),
            mask: capacity - 1,
            clock,
            producer: CachePadded::new(Producer {
                head: AtomicUsize::new(0),
                tail_seen: AtomicUsize::new(0),
                lost: AtomicU64::new(0),
            }),
            tail: CachePadded::new(AtomicUsize::new(0)),
            lost_reported: AtomicU64::new(0),
            lock: shared.then(|| Mutex::new(())),
        }
    }

    /// Records `kind`'s words, stamped with the clock now (word 1). The
    /// caller is this ring's one producer (a per-thread ring's thread
    /// cache owner), or the ring is shared.
    #[inline]
    pub(crate) fn push(&self, word0: u64, thread: u64, id: u64, a: u64, b: u64) {
        let _guard = self
            .lock
            .as_ref()
            .map(|l| l.lock().unwrap_or_else(|e| e.into_inner()));
        let p = &self.producer;
        // Relaxed: only the producer (or the lock's holder) writes these.
        let head = p.head.load(Ordering::Relaxed);
        if head.wrapping_sub(p.tail_seen.load(Ordering::Relaxed)) > self.mask {
            // Acquire: pairs with the reader's Release of `tail` after it
            // read the slots it frees, so these writes cannot overtake its
            // reads.
            let tail = self.tail.load(Ordering::Acquire);
            p.tail_seen.store(tail, Ordering::Relaxed);
            if head.wrapping_sub(tail) > self.mask {
                p.lost
                    .store(p.lost.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                return;
            }
        }
        let slot = &self.slots[head & self.mask];
        let time = self.clock.ticks();
        for (cell, word) in slot.iter().zip([word0, time, thread, id, a, b]) {
            cell.store(word, Ordering::Relaxed);
        }
        // Release: publishes the slot's words to the reader's Acquire load
        // of `head`.
        p.head.store(head.wrapping_add(1), Ordering::Release);
    }

    /// Moves the records written since the last call into `out`, and
    /// returns how many records were lost since then. Only the background
    /// thread calls it.
    pub(crate) fn drain(&self, out: &mut Vec<[u64; 6]>) -> u64 {
        // Acquire: pairs with `push`'s Release; the slots up to `head` are
        // written.
        let head = self.producer.head.load(Ordering::Acquire);
        // Relaxed: only this thread writes `tail`.
        let tail = self.tail.load(Ordering::Relaxed);
        let mut at = tail;
        while at != head {
            let slot = &self.slots[at & self.mask];
            out.push(std::array::from_fn(|i| slot[i].load(Ordering::Relaxed)));
            at = at.wrapping_add(1);
        }
        // Release: the producer's Acquire of `tail` sees these reads done
        // before it reuses the slots.
        self.tail.store(head, Ordering::Release);
        // Relaxed: a count read late is reported at the next drain.
        let lost = self.producer.lost.load(Ordering::Relaxed);
        let reported = self.lost_reported.swap(lost, Ordering::Relaxed);
        lost - reported
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_ring_counts_what_it_drops_and_keeps_order() {
        let ring = Ring::new(4, Clock::Monotonic, false);
        for i in 0..6 {
            ring.push(1, 7, i, 0, 0);
        }
        let mut out = Vec::new();
        assert_eq!(ring.drain(&mut out), 2);
        assert_eq!(out.iter().map(|w| w[3]).collect::<Vec<_>>(), [0, 1, 2, 3]);
        out.clear();
        ring.push(1, 7, 9, 0, 0);
        assert_eq!(ring.drain(&mut out), 0);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0][3], 9);
    }

    #[test]
    fn one_writer_and_the_reader_at_once_lose_nothing_they_count() {
        let ring = std::sync::Arc::new(Ring::new(64, Clock::choose(), false));
        let writer = {
            let ring = ring.clone();
            std::thread::spawn(move || {
                for i in 0..100_000u64 {
                    ring.push(1, 1, i, i * 3, 0);
                }
            })
        };
        let mut seen = Vec::new();
        let mut lost = 0;
        while !writer.is_finished() {
            lost += ring.drain(&mut seen);
        }
        writer.join().unwrap();
        lost += ring.drain(&mut seen);
        assert_eq!(seen.len() as u64 + lost, 100_000);
        assert!(seen.windows(2).all(|w| w[0][3] < w[1][3]));
        assert!(seen.iter().all(|w| w[4] == w[3] * 3), "torn record");
    }
}
