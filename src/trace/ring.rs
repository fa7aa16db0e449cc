//! A thread's trace buffer: a bounded ring of records, written by one
//! thread (the owner of the thread cache it belongs to) and read by the
//! trace's background thread, with no lock on either side; or a shared
//! ring that several threads write under a lock (the orphan cache's takes,
//! the cleaner's events). A full ring drops the record and counts it.
//!
//! A record in a ring is four words, 32 bytes (two to a cache line): the
//! file's first word with the clock's tick in its upper half (the low 32
//! bits of it: the reader, which drains every few milliseconds, restores
//! the rest), then the buffer and the kind's `a` and `b`. The thread is
//! not in the record: a ring records which thread wrote its next records
//! with a marker, written only when the writing thread changes (a cache
//! inherited by another thread, the shared ring's writers taking turns).
//!
//! The ring uses `std`'s atomics, not the crate's `sync` layer: tracing is
//! never enabled under the loom models.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_utils::CachePadded;

use super::clock::Clock;

/// Records one thread's ring holds: at 32 bytes each, 256 KiB; the
/// background thread empties it every few milliseconds.
pub(crate) const THREAD_RECORDS: usize = 8192;

/// Records the shared ring holds.
pub(crate) const SHARED_RECORDS: usize = 1 << 16;

/// The kind of a ring's thread marker (never written to a file: the
/// kinds of the file's records are below 16).
const THREAD: u64 = 0xff;

/// The producer's side.
#[derive(Debug)]
struct Producer {
    /// Records written (the next slot is `head % capacity`).
    head: AtomicUsize,
    /// The producer's last view of `tail` (only the producer reads and
    /// writes it).
    tail_seen: AtomicUsize,
    /// The thread the ring's last marker names (only the producer reads
    /// and writes it; 0 before the first, which no thread's name is).
    thread: AtomicU64,
    /// Records dropped because the ring was full.
    lost: AtomicU64,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Ring {
    slots: Box<[[AtomicU64; 4]]>,
    mask: usize,
    clock: Arc<Clock>,
    producer: CachePadded<Producer>,
    /// Records read by the background thread.
    tail: CachePadded<AtomicUsize>,
    /// The thread the reader's last marker named (only the reader reads
    /// and writes it).
    reader_thread: AtomicU64,
    /// Records lost that the background thread has reported.
    lost_reported: AtomicU64,
    /// For a shared ring: serialises the producers.
    lock: Option<Mutex<()>>,
}

impl Ring {
    /// A ring of `capacity` records (a power of two), stamped by `clock`;
    /// `shared`: several threads may write.
    pub(crate) fn new(capacity: usize, clock: Arc<Clock>, shared: bool) -> Self {
        assert!(capacity.is_power_of_two() && capacity >= 2);
        Self {
            slots: (0..capacity).map(|_| Default::default()).collect(),
            mask: capacity - 1,
            clock,
            producer: CachePadded::new(Producer {
                head: AtomicUsize::new(0),
                tail_seen: AtomicUsize::new(0),
                thread: AtomicU64::new(0),
                lost: AtomicU64::new(0),
            }),
            tail: CachePadded::new(AtomicUsize::new(0)),
            reader_thread: AtomicU64::new(0),
            lost_reported: AtomicU64::new(0),
            lock: shared.then(|| Mutex::new(())),
        }
    }

    /// Records `head` (the file's first word: kind, flags, device),
    /// written by `thread` (its name), with the buffer `id` and `a`, `b`,
    /// stamped with the clock now. The caller is this ring's one producer
    /// (a per-thread ring's thread cache owner), or the ring is shared.
    #[inline]
    pub(crate) fn push(&self, head: u64, thread: u64, id: u64, a: u64, b: u64) {
        let _guard = self
            .lock
            .as_ref()
            .map(|l| l.lock().unwrap_or_else(|e| e.into_inner()));
        let p = &self.producer;
        // Relaxed: only the producer (or the lock's holder) writes these.
        let mut at = p.head.load(Ordering::Relaxed);
        let named = p.thread.load(Ordering::Relaxed) == thread;
        let needed = if named { 1 } else { 2 };
        if at.wrapping_sub(p.tail_seen.load(Ordering::Relaxed)) + needed > self.mask + 1 {
            // Acquire: pairs with the reader's Release of `tail` after it
            // read the slots it frees, so these writes cannot overtake its
            // reads.
            let tail = self.tail.load(Ordering::Acquire);
            p.tail_seen.store(tail, Ordering::Relaxed);
            if at.wrapping_sub(tail) + needed > self.mask + 1 {
                p.lost
                    .store(p.lost.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                return;
            }
        }
        let tick = self.clock.now() << 32;
        if !named {
            self.write(at, [THREAD | tick, thread, 0, 0]);
            at = at.wrapping_add(1);
            p.thread.store(thread, Ordering::Relaxed);
        }
        self.write(at, [head | tick, id, a, b]);
        // Release: publishes the slots' words to the reader's Acquire load
        // of `head`.
        p.head.store(at.wrapping_add(1), Ordering::Release);
    }

    #[inline]
    fn write(&self, at: usize, words: [u64; 4]) {
        for (cell, word) in self.slots[at & self.mask].iter().zip(words) {
            // Relaxed: published by the Release of `head` in `push`.
            cell.store(word, Ordering::Relaxed);
        }
    }

    /// How many records have been written: a bound for [`Ring::drain_to`].
    /// Acquire: pairs with `push`'s Release, so the slots below it are
    /// written, and so is everything the producers did before them (their
    /// records in other rings included).
    pub(crate) fn published(&self) -> usize {
        self.producer.head.load(Ordering::Acquire)
    }

    /// Moves the records written since the last call into `out`, in the
    /// file's words (the time in ticks of the clock, the thread filled
    /// in), and returns how many records were lost since then. Only the
    /// background thread calls it.
    pub(crate) fn drain(&self, out: &mut Vec<[u64; 6]>) -> u64 {
        self.drain_to(out, self.published())
    }

    /// [`Ring::drain`], of the records below `head` only, a value
    /// [`Ring::published`] returned since the last drain.
    pub(crate) fn drain_to(&self, out: &mut Vec<[u64; 6]>, head: usize) -> u64 {
        // Read after `head`'s Acquire, so no record up to `head` has a
        // later tick (the producers read the clock before their Release,
        // and one atomic's values are seen in one order).
        let now = self.clock.now();
        // Relaxed: only this thread writes `tail` and `reader_thread`.
        let tail = self.tail.load(Ordering::Relaxed);
        let mut thread = self.reader_thread.load(Ordering::Relaxed);
        let mut at = tail;
        while at != head {
            let slot = &self.slots[at & self.mask];
            let w: [u64; 4] = std::array::from_fn(|i| slot[i].load(Ordering::Relaxed));
            at = at.wrapping_add(1);
            // The tick's low 32 bits: the latest tick up to `now` with
            // them.
            let low = (w[0] >> 32) as u32;
            let tick = now - u64::from((now as u32).wrapping_sub(low));
            if w[0] & 0xff == THREAD {
                thread = w[1];
                continue;
            }
            out.push([w[0] & 0xffff_ffff, tick, thread, w[1], w[2], w[3]]);
        }
        self.reader_thread.store(thread, Ordering::Relaxed);
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
        let ring = Ring::new(4, Arc::new(Clock::new()), false);
        // The first record takes a marker's slot too: 3 records fit.
        for i in 0..6 {
            ring.push(1, 7, i, 0, 0);
        }
        let mut out = Vec::new();
        assert_eq!(ring.drain(&mut out), 3);
        assert_eq!(out.iter().map(|w| w[3]).collect::<Vec<_>>(), [0, 1, 2]);
        assert!(out.iter().all(|w| w[2] == 7 && w[0] == 1));
        out.clear();
        ring.push(1, 7, 9, 0, 0);
        assert_eq!(ring.drain(&mut out), 0);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0][3], 9);
    }

    #[test]
    fn records_name_the_thread_that_wrote_them() {
        let ring = Ring::new(16, Arc::new(Clock::new()), true);
        ring.push(1, 5, 10, 0, 0);
        ring.push(1, 5, 11, 0, 0);
        ring.push(2, 6, 12, 0, 0);
        let mut out = Vec::new();
        ring.drain(&mut out);
        ring.push(2, 6, 13, 0, 0);
        ring.push(1, 5, 14, 0, 0);
        ring.drain(&mut out);
        let named: Vec<(u64, u64)> = out.iter().map(|w| (w[3], w[2])).collect();
        assert_eq!(named, [(10, 5), (11, 5), (12, 6), (13, 6), (14, 5)]);
    }

    #[test]
    fn ticks_past_32_bits_are_restored() {
        let clock = Arc::new(Clock::new());
        let ring = Ring::new(16, Arc::clone(&clock), false);
        let past = (5u64 << 32) + 7;
        clock.set(past);
        ring.push(1, 1, 1, 0, 0);
        clock.set(past + 3);
        let mut out = Vec::new();
        ring.drain(&mut out);
        assert_eq!(out[0][1], past);
    }

    #[test]
    fn one_writer_and_the_reader_at_once_lose_nothing_they_count() {
        let clock = Arc::new(Clock::new());
        let ring = Arc::new(Ring::new(64, Arc::clone(&clock), false));
        let writer = {
            let (ring, clock) = (ring.clone(), clock.clone());
            std::thread::spawn(move || {
                for i in 0..100_000u64 {
                    if i % 1000 == 0 {
                        clock.advance();
                    }
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
        assert!(
            seen.windows(2).all(|w| w[0][1] <= w[1][1]),
            "time went back"
        );
        assert!(seen.iter().all(|w| w[4] == w[3] * 3), "torn record");
    }

    /// A marker in the ring's last slot, the record after it in slot 0.
    #[test]
    fn a_marker_in_the_last_slot_before_the_wrap() {
        let ring = Ring::new(4, Arc::new(Clock::new()), false);
        let mut out = Vec::new();
        ring.push(1, 5, 0, 0, 0); // marker 0, record 1
        ring.push(1, 5, 1, 0, 0); // 2
        assert_eq!(ring.drain(&mut out), 0);
        ring.push(1, 6, 2, 0, 0); // marker 3, record 4 (slot 0)
        ring.push(1, 6, 3, 0, 0); // 5 (slot 1)
        ring.push(1, 6, 4, 0, 0); // 6 (slot 2)
        ring.push(1, 6, 5, 0, 0); // full: lost
        assert_eq!(ring.drain(&mut out), 1);
        let named: Vec<(u64, u64)> = out.iter().map(|w| (w[3], w[2])).collect();
        assert_eq!(named, [(0, 5), (1, 5), (2, 6), (3, 6), (4, 6)]);
    }

    /// One slot free and a marker needed: the record is lost (counted
    /// once), and the thread's next record still gets its marker.
    #[test]
    fn a_full_ring_exactly_when_a_marker_is_needed() {
        let ring = Ring::new(4, Arc::new(Clock::new()), true);
        let mut out = Vec::new();
        ring.push(1, 5, 0, 0, 0); // marker, record
        ring.push(1, 5, 1, 0, 0);
        // One slot free: thread 6 needs two.
        ring.push(1, 6, 2, 0, 0);
        // Thread 5 needs one: fits.
        ring.push(1, 5, 3, 0, 0);
        assert_eq!(ring.drain(&mut out), 1);
        ring.push(1, 6, 4, 0, 0);
        ring.push(1, 5, 5, 0, 0);
        assert_eq!(ring.drain(&mut out), 0);
        let named: Vec<(u64, u64)> = out.iter().map(|w| (w[3], w[2])).collect();
        assert_eq!(named, [(0, 5), (1, 5), (3, 5), (4, 6), (5, 5)]);
    }

    /// Random pushes by threads 0 (events), 1, 2, 3 and drains, on rings
    /// of several sizes: every record drained names its writer, keeps its
    /// order, and drained + lost = pushed.
    #[test]
    fn random_writers_and_drains_against_a_model() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for cap in [2usize, 4, 8, 16] {
            for _round in 0..200 {
                let clock = Arc::new(Clock::new());
                let ring = Ring::new(cap, Arc::clone(&clock), true);
                let (mut pushed, mut lost, mut out) = (0u64, 0u64, Vec::new());
                for _ in 0..200 {
                    let r = rand();
                    if r % 5 == 0 {
                        lost += ring.drain(&mut out);
                    } else {
                        if r % 7 == 0 {
                            clock.set(clock.now() + (r >> 40) % 3);
                        }
                        let thread = (r >> 8) % 4;
                        ring.push(1, thread, pushed, thread, clock.now());
                        pushed += 1;
                    }
                }
                lost += ring.drain(&mut out);
                assert_eq!(out.len() as u64 + lost, pushed, "cap {cap}");
                assert!(out.iter().all(|w| w[2] == w[4]), "misnamed: {out:?}");
                assert!(out.iter().all(|w| w[1] == w[5]), "tick wrong: {out:?}");
                assert!(out.windows(2).all(|w| w[0][3] < w[1][3]));
            }
        }
    }

    /// Three writers of the shared ring (one of them the events' thread
    /// 0) and the reader at once.
    #[test]
    fn shared_ring_writers_and_reader_at_once() {
        let clock = Arc::new(Clock::new());
        let ring = Arc::new(Ring::new(64, Arc::clone(&clock), true));
        const N: u64 = 30_000;
        let writers: Vec<_> = (0..3u64)
            .map(|t| {
                let (ring, clock) = (ring.clone(), clock.clone());
                std::thread::spawn(move || {
                    for i in 0..N {
                        if i % 500 == 0 {
                            clock.advance();
                        }
                        ring.push(1, t, i, t, 0);
                    }
                })
            })
            .collect();
        let mut seen = Vec::new();
        let mut lost = 0;
        while !writers.iter().all(|w| w.is_finished()) {
            lost += ring.drain(&mut seen);
        }
        for w in writers {
            w.join().unwrap();
        }
        lost += ring.drain(&mut seen);
        assert_eq!(seen.len() as u64 + lost, 3 * N);
        assert!(seen.iter().all(|w| w[2] == w[4]), "misnamed record");
        for t in 0..3 {
            let mine: Vec<&[u64; 6]> = seen.iter().filter(|w| w[2] == t).collect();
            assert!(mine.windows(2).all(|w| w[0][3] < w[1][3]), "order of {t}");
            assert!(mine.windows(2).all(|w| w[0][1] <= w[1][1]), "time of {t}");
        }
    }

    /// The clock at 2^32 - 1 when pushed, the reader's at 2^32 + 5.
    #[test]
    fn ticks_across_the_32_bit_boundary() {
        let clock = Arc::new(Clock::new());
        let ring = Ring::new(16, Arc::clone(&clock), false);
        for t in [(1u64 << 32) - 1, 1 << 32, (1 << 32) + 1] {
            clock.set(t);
            ring.push(1, 1, t, 0, 0);
        }
        clock.set((1 << 32) + 5);
        let mut out = Vec::new();
        ring.drain(&mut out);
        assert!(out.iter().all(|w| w[1] == w[3]), "{out:?}");
    }
}
