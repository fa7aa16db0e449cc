//! A thread's trace buffer: a bounded ring of records, written by one
//! thread (the owner of the thread cache it belongs to) and read by the
//! trace's background thread, with no lock on either side; or a shared
//! ring that several threads write under a lock (the orphan cache's takes,
//! the cleaner's events). A full ring drops the record and counts it.
//!
//! The ring is made of 16-byte slots (four to a cache line). A record takes
//! one or two:
//!
//! - **Full** (two slots): the file's first word with the clock's tick in
//!   its upper half (the low 32 bits of it: the reader, which drains every
//!   few milliseconds, restores the rest), the buffer, then the kind's `a`
//!   and `b`.
//! - **Compact** (one slot), for a take or a drop whose values fit, which
//!   is nearly every one: a take of less than 1 TiB handed out its class's
//!   length, a drop of less than 1 TiB written by the thread that took it,
//!   on one of the first 32 devices, of a buffer aligned to 256 bytes
//!   below 2^48. Word 0: bits 0-7 the kind with [`COMPACT`] set, 8-10 the
//!   flags (the take's source; the drop's copy and pinned bits), 11-15 the
//!   device, 16-23 the take's class (its index in the pool's table, which
//!   gives the length handed out), 24-47 the tick's low 24 bits, 48-63 the
//!   value's (the bytes asked, or written) upper 16 of 40 bits. Word 1:
//!   bits 0-23 the value's lower 24 bits, 24-63 the buffer's address
//!   shifted right by 8. A compact drop's taker is the thread that wrote
//!   it. The reader restores the tick from the ring's previous record's
//!   (which it has read), so a record 2^24 ticks (4.6 hours) or more after
//!   the last one the ring holds (lost ones do not count) is written full
//!   instead, as is one stamped by a clock set back; a full record's tick
//!   is restored from the reader's clock, which is right for a record read
//!   less than 2^32 ticks (49 days) after it was written.
//!
//! A take and its drop in compact slots take 32 bytes, half a cache line's
//! worth (slots are aligned to their size, four to a line; two adjacent
//! ones may lie in two lines), against 64 for two full records.
//!
//! The thread is not in the record: a ring records which thread wrote its
//! next records with a marker (one slot), written only when the writing
//! thread changes (a cache inherited by another thread, the shared ring's
//! writers taking turns).
//!
//! The ring uses `std`'s atomics, not the crate's `sync` layer: tracing is
//! never enabled under the loom models.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_utils::CachePadded;

use super::clock::Clock;
use super::format::{head as file_head, DROP, DROP_COPY, DROP_PINNED, TAKE};

/// Slots one thread's ring holds: at 16 bytes each, 256 KiB; the
/// background thread empties it every few milliseconds.
pub(crate) const THREAD_SLOTS: usize = 16384;

/// Slots the shared ring holds.
pub(crate) const SHARED_SLOTS: usize = 1 << 17;

/// The kind of a ring's thread marker (never written to a file: the
/// kinds of the file's records are below 16).
const THREAD: u64 = 0xff;

/// Set in the kind of a compact record.
const COMPACT: u64 = 0x40;

/// The low 24 bits.
const LOW24: u64 = (1 << 24) - 1;

/// The largest value (bytes asked, or written) a compact record holds.
const COMPACT_VALUE: u64 = 1 << 40;

/// How many slots ahead of the one it writes a producer asks for the
/// cache line it will write (see [`prefetch_for_write`]).
const AHEAD: usize = 32;

/// One slot: aligned to its size, so that four share a cache line.
#[derive(Debug, Default)]
#[repr(C, align(16))]
struct Slot([AtomicU64; 2]);

/// A take's compact record (its tick left to [`Ring::push_compact`]), or
/// `None` when a value does not fit: `source`'s code, the buffer's
/// `device`, its `class`'s index in the pool's table (whose length the
/// take handed out), its address `id`, the bytes `asked`.
#[inline]
pub(crate) fn compact_take(
    source: u8,
    device: usize,
    class: usize,
    id: u64,
    asked: u64,
) -> Option<[u64; 2]> {
    // The sources' codes are 0-6.
    (source < 7)
        .then(|| compact(TAKE, source, device, class, id, asked))
        .flatten()
}

/// A drop's compact record, or `None` when a value does not fit: its
/// `flags` (copy and pinned only: the taker is the writing thread), the
/// buffer's `device`, its address `id`, the bytes written.
#[inline]
pub(crate) fn compact_drop(flags: u8, device: usize, id: u64, dirty: u64) -> Option<[u64; 2]> {
    (flags & !(DROP_COPY | DROP_PINNED) == 0)
        .then(|| compact(DROP, flags, device, 0, id, dirty))
        .flatten()
}

#[inline]
fn compact(
    kind: u8,
    flags: u8,
    device: usize,
    class: usize,
    id: u64,
    value: u64,
) -> Option<[u64; 2]> {
    let fits =
        device < 32 && class < 256 && value < COMPACT_VALUE && id & 0xff == 0 && id < 1 << 48;
    fits.then(|| {
        [
            u64::from(kind)
                | COMPACT
                | u64::from(flags) << 8
                | (device as u64) << 11
                | (class as u64) << 16
                | (value >> 24) << 48,
            (value & LOW24) | (id >> 8) << 24,
        ]
    })
}

/// The latest tick up to `now` whose low `bits` bits are `low` (a full
/// record's tick, read less than 2^32 ticks, 49 days, after it was
/// written).
#[inline]
fn restore(now: u64, low: u64, bits: u32) -> u64 {
    let mask = (1u64 << bits) - 1;
    // Wrapping: only a clock set back (tests do) makes `now` less.
    now.wrapping_sub(now.wrapping_sub(low) & mask)
}

/// Whether the processor has `prefetchw` (CPUID leaf 0x8000_0001, ECX bit
/// 8: PRFCHW, AMD's 3DNowPrefetch), read once.
fn has_prefetch_for_write() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            #[allow(unused_unsafe)]
            // SAFETY: CPUID exists on every x86_64 processor, and the
            // extended leaf is read only where leaf 0x8000_0000 says it
            // exists.
            let ecx = unsafe {
                (__cpuid(0x8000_0000).eax >= 0x8000_0001).then(|| __cpuid(0x8000_0001).ecx)
            };
            ecx.is_some_and(|ecx| ecx >> 8 & 1 == 1)
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Asks for the cache line at `p` in a state to be written, so that the
/// store there later does not wait for it (the ring's lines are written
/// once per pass, long after the background thread read them).
///
/// # Safety
///
/// The processor has `prefetchw` ([`has_prefetch_for_write`]).
#[inline(always)]
unsafe fn prefetch_for_write(p: *const Slot) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the processor has `prefetchw` (the caller's promise). It is
    // a hint: it writes no register and no memory, reads nothing the
    // program sees, and does not fault whatever the address (a prefetch
    // "does not affect program behavior", Intel's manual says); `p`
    // points into the ring's slots besides.
    unsafe {
        std::arch::asm!("prefetchw [{0}]", in(reg) p, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// The producer's side.
#[derive(Debug)]
struct Producer {
    /// Slots written (the next is `head % capacity`).
    head: AtomicUsize,
    /// The producer's last view of `tail` (only the producer reads and
    /// writes it).
    tail_seen: AtomicUsize,
    /// The thread the ring's last marker names (only the producer reads
    /// and writes it; 0 before the first, which no thread's name is).
    thread: AtomicU64,
    /// The tick of the last record written, not counting those lost (only
    /// the producer reads and writes it; 0 before the first): a compact
    /// record keeps its tick's low 24 bits, from which the reader, which
    /// knows this tick, restores it, so it must be less than 2^24 ticks
    /// after it.
    last_tick: AtomicU64,
    /// Records dropped because the ring was full.
    lost: AtomicU64,
    /// The thread that wrote the last record dropped, and the one before
    /// it and the count of records lost when it changed (only the
    /// producer writes them): losses split between the threads that
    /// wrote the ring between two drains (see [`Ring::split_losses`]).
    lost_thread: AtomicU64,
    lost_thread_before: AtomicU64,
    lost_switched_at: AtomicU64,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Ring {
    slots: Box<[Slot]>,
    mask: usize,
    clock: Arc<Clock>,
    /// The length of each class of the pool, by index (for compact takes).
    sizes: Arc<[u64]>,
    producer: CachePadded<Producer>,
    /// Slots read by the background thread.
    tail: CachePadded<AtomicUsize>,
    /// The thread the reader's last marker named (only the reader reads
    /// and writes it).
    reader_thread: AtomicU64,
    /// The tick of the last record read (only the reader reads and writes
    /// it): the producer's `last_tick` as of the next record.
    reader_tick: AtomicU64,
    /// Records lost that the background thread has reported.
    lost_reported: AtomicU64,
    /// For a shared ring: serialises the producers.
    lock: Option<Mutex<()>>,
    /// Whether to prefetch the lines ahead for writing.
    prefetch: bool,
}

impl Ring {
    /// A ring of `capacity` slots (a power of two, at least 4), stamped by
    /// `clock`, for a pool whose classes have the lengths `sizes`;
    /// `shared`: several threads may write.
    pub(crate) fn new(capacity: usize, clock: Arc<Clock>, sizes: Arc<[u64]>, shared: bool) -> Self {
        assert!(capacity.is_power_of_two() && capacity >= 4);
        Self {
            slots: (0..capacity).map(|_| Default::default()).collect(),
            mask: capacity - 1,
            clock,
            sizes,
            producer: CachePadded::new(Producer {
                head: AtomicUsize::new(0),
                tail_seen: AtomicUsize::new(0),
                thread: AtomicU64::new(0),
                last_tick: AtomicU64::new(0),
                lost: AtomicU64::new(0),
                lost_thread: AtomicU64::new(0),
                lost_thread_before: AtomicU64::new(0),
                lost_switched_at: AtomicU64::new(0),
            }),
            tail: CachePadded::new(AtomicUsize::new(0)),
            reader_thread: AtomicU64::new(0),
            reader_tick: AtomicU64::new(0),
            lost_reported: AtomicU64::new(0),
            lock: shared.then(|| Mutex::new(())),
            prefetch: has_prefetch_for_write(),
        }
    }

    /// Records `head` (the file's first word: kind, flags, device),
    /// written by `thread` (its name), with the buffer `id` and `a`, `b`,
    /// stamped with the clock now, in two slots. The caller is this ring's
    /// one producer (a per-thread ring's thread cache owner), or the ring
    /// is shared.
    #[inline]
    pub(crate) fn push(&self, head: u64, thread: u64, id: u64, a: u64, b: u64) {
        let _guard = self.lock();
        let tick = self.clock.now();
        self.append(thread, tick, [[head | tick << 32, id], [a, b]]);
    }

    /// Records `words` ([`compact_take`], [`compact_drop`]), written by
    /// `thread`, stamped with the clock now, in one slot (in two, as
    /// [`Ring::push`] writes them, if 2^24 ticks or more have passed since
    /// the ring's last record written, or the clock went back); the caller
    /// as for [`Ring::push`].
    ///
    /// The common case (a thread's own ring, the same thread as its last
    /// record, room known without reading the reader's `tail`) is written
    /// here, inlined into the take and the drop; every other case goes to
    /// [`Ring::push_compact_slow`], kept out of line so that the common
    /// case saves and restores few registers.
    #[inline(always)]
    pub(crate) fn push_compact(&self, thread: u64, words: [u64; 2]) {
        let p = &self.producer;
        let tick = self.clock.now();
        // Relaxed: only the producer writes these (a shared ring, whose
        // producers take the lock, goes to the slow path first).
        let at = p.head.load(Ordering::Relaxed);
        let fast = self.lock.is_none()
            && p.thread.load(Ordering::Relaxed) == thread
            && tick.wrapping_sub(p.last_tick.load(Ordering::Relaxed)) <= LOW24
            && at.wrapping_sub(p.tail_seen.load(Ordering::Relaxed)) <= self.mask;
        if !fast {
            return self.push_compact_slow(thread, words);
        }
        self.write(at, [words[0] | (tick & LOW24) << 24, words[1]]);
        p.last_tick.store(tick, Ordering::Relaxed);
        self.publish(at.wrapping_add(1));
    }

    /// [`Ring::push_compact`]'s every case, the lock, a marker naming a
    /// new thread, a full record, a look at the reader's `tail` and a
    /// record lost included.
    #[cold]
    #[inline(never)]
    fn push_compact_slow(&self, thread: u64, words: [u64; 2]) {
        let _guard = self.lock();
        let tick = self.clock.now();
        // Relaxed: only the producer (or the lock's holder) writes it.
        // A clock set back (only tests set it) writes a full record.
        if tick.wrapping_sub(self.producer.last_tick.load(Ordering::Relaxed)) <= LOW24 {
            self.append(thread, tick, [[words[0] | (tick & LOW24) << 24, words[1]]]);
        } else {
            let [head, id, a, b] = self.expand(words, thread);
            self.append(thread, tick, [[head | tick << 32, id], [a, b]]);
        }
    }

    /// For a shared ring: its lock, held while a record is stamped and
    /// written, so that the ring's ticks never go back.
    #[inline(always)]
    fn lock(&self) -> Option<std::sync::MutexGuard<'_, ()>> {
        self.lock
            .as_ref()
            .map(|l| l.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// A compact record's file words (kind, flags, device; the buffer,
    /// `a`, `b`) with `thread` as the writer, its tick left out.
    #[inline]
    fn expand(&self, [w0, w1]: [u64; 2], thread: u64) -> [u64; 4] {
        let kind = (w0 & 0xff & !COMPACT) as u8;
        let value = (w0 >> 48) << 24 | (w1 & LOW24);
        let head = file_head(kind, (w0 >> 8) as u8 & 7, (w0 >> 11) as u16 & 31);
        let b = if kind == TAKE {
            let class = (w0 >> 16) as usize & 0xff;
            self.sizes.get(class).copied().unwrap_or(0)
        } else {
            thread
        };
        [head, (w1 >> 24) << 8, value, b]
    }

    /// Writes `record`'s slots, stamped `tick`, by `thread`, or counts
    /// the record lost if they do not fit; under the caller's lock for a
    /// shared ring.
    #[inline(always)]
    fn append<const N: usize>(&self, thread: u64, tick: u64, record: [[u64; 2]; N]) {
        let p = &self.producer;
        // Relaxed: only the producer (or the lock's holder) writes these.
        let mut at = p.head.load(Ordering::Relaxed);
        let named = p.thread.load(Ordering::Relaxed) == thread;
        let needed = if named { N } else { N + 1 };
        if at.wrapping_sub(p.tail_seen.load(Ordering::Relaxed)) + needed > self.mask + 1 {
            // Acquire: pairs with the reader's Release of `tail` after it
            // read the slots it frees, so these writes cannot overtake its
            // reads.
            let tail = self.tail.load(Ordering::Acquire);
            p.tail_seen.store(tail, Ordering::Relaxed);
            if at.wrapping_sub(tail) + needed > self.mask + 1 {
                let lost = p.lost.load(Ordering::Relaxed);
                let before = p.lost_thread.load(Ordering::Relaxed);
                if before != thread {
                    p.lost_thread_before.store(before, Ordering::Relaxed);
                    p.lost_switched_at.store(lost, Ordering::Relaxed);
                    p.lost_thread.store(thread, Ordering::Relaxed);
                }
                p.lost.store(lost + 1, Ordering::Relaxed);
                return;
            }
        }
        if !named {
            self.write(at, [THREAD, thread]);
            at = at.wrapping_add(1);
            p.thread.store(thread, Ordering::Relaxed);
        }
        for words in record {
            self.write(at, words);
            at = at.wrapping_add(1);
        }
        p.last_tick.store(tick, Ordering::Relaxed);
        self.publish(at);
    }

    /// Makes the slots below `at` the reader's, after asking for the line
    /// [`AHEAD`] slots on for writing.
    #[inline(always)]
    fn publish(&self, at: usize) {
        if self.prefetch {
            // SAFETY: `prefetch` is `has_prefetch_for_write()`.
            unsafe { prefetch_for_write(&self.slots[at.wrapping_add(AHEAD) & self.mask]) };
        }
        // Release: publishes the slots' words to the reader's Acquire load
        // of `head`.
        self.producer.head.store(at, Ordering::Release);
    }

    #[inline(always)]
    fn write(&self, at: usize, words: [u64; 2]) {
        for (cell, word) in self.slots[at & self.mask].0.iter().zip(words) {
            // Relaxed: published by the Release of `head` in `append`.
            cell.store(word, Ordering::Relaxed);
        }
    }

    /// The `lost` records a drain just counted, by the threads that wrote
    /// them: the last thread that lost records, and the one before it if
    /// it lost some of these (a thread that inherited the ring's cache);
    /// a thread before those two, in one drain's interval, is counted
    /// with the second. Only the background thread calls it, after the
    /// drain.
    pub(crate) fn split_losses(&self, lost: u64) -> [(u64, u64); 2] {
        let p = &self.producer;
        // Relaxed: written by the producer alone; read after the drain's
        // Relaxed read of the count, so a loss racing the drain may be
        // named by the thread before it (only when a thread inherited
        // the ring meanwhile).
        let total = self.lost_reported.load(Ordering::Relaxed);
        let since = total.saturating_sub(lost);
        let switched = p.lost_switched_at.load(Ordering::Relaxed);
        let last = p.lost_thread.load(Ordering::Relaxed);
        if switched > since && switched <= total {
            let before = p.lost_thread_before.load(Ordering::Relaxed);
            [(before, switched - since), (last, total - switched)]
        } else {
            [(last, lost), (last, 0)]
        }
    }

    /// How many slots have been written: a bound for [`Ring::drain_to`].
    /// Acquire: pairs with `append`'s Release, so the slots below it are
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

    /// [`Ring::drain`], of the slots below `head` only, a value
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
        let mut last = self.reader_tick.load(Ordering::Relaxed);
        let read = |at: usize| -> [u64; 2] {
            let slot = &self.slots[at & self.mask].0;
            // Relaxed: below `head`, published by its Acquire.
            [
                slot[0].load(Ordering::Relaxed),
                slot[1].load(Ordering::Relaxed),
            ]
        };
        // A record never straddles `head`: `append` publishes whole ones.
        while at != head {
            let [w0, w1] = read(at);
            at = at.wrapping_add(1);
            let kind = w0 & 0xff;
            if kind == THREAD {
                thread = w1;
                continue;
            }
            if kind & COMPACT != 0 {
                // Less than 2^24 ticks after the ring's last record.
                last += ((w0 >> 24) & LOW24).wrapping_sub(last) & LOW24;
                let [head, id, a, b] = self.expand([w0, w1], thread);
                out.push([head, last, thread, id, a, b]);
                continue;
            }
            let [a, b] = read(at);
            at = at.wrapping_add(1);
            last = restore(now, w0 >> 32, 32);
            out.push([w0 & 0xffff_ffff, last, thread, w1, a, b]);
        }
        self.reader_tick.store(last, Ordering::Relaxed);
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

    const SIZES: [u64; 4] = [100, 101, 102, 103];

    fn ring(capacity: usize, clock: Arc<Clock>, shared: bool) -> Ring {
        Ring::new(capacity, clock, Arc::from(SIZES), shared)
    }

    /// Losses of a thread and of the one that inherited its ring, between
    /// two drains, are told apart; those of one thread alone are its.
    #[test]
    fn losses_are_split_between_the_threads_that_wrote_the_ring() {
        let ring = ring(8, Arc::new(Clock::new()), false);
        let mut out = Vec::new();
        for i in 0..5 {
            ring.push(1, 7, i, 0, 0);
        }
        assert_eq!(ring.drain(&mut out), 2);
        assert_eq!(ring.split_losses(2), [(7, 2), (7, 0)]);
        for i in 0..6 {
            ring.push(1, 7, i, 0, 0);
        }
        for i in 0..3 {
            ring.push(1, 9, i, 0, 0);
        }
        // Four fit: 7 loses two, 9 (a marker and two slots each) three.
        assert_eq!(ring.drain(&mut out), 5);
        assert_eq!(ring.split_losses(5), [(7, 2), (9, 3)]);
        for i in 0..5 {
            ring.push(1, 9, i, 0, 0);
        }
        assert_eq!(ring.drain(&mut out), 2);
        assert_eq!(ring.split_losses(2), [(9, 2), (9, 0)]);
    }

    #[test]
    fn a_full_ring_counts_what_it_drops_and_keeps_order() {
        // A marker and three full records fill seven of eight slots.
        let ring = ring(8, Arc::new(Clock::new()), false);
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
        let ring = ring(32, Arc::new(Clock::new()), true);
        ring.push(1, 5, 10, 0, 0);
        ring.push(1, 5, 11, 0, 0);
        ring.push(2, 6, 12, 0, 0);
        let mut out = Vec::new();
        ring.drain(&mut out);
        ring.push(2, 6, 13, 0, 0);
        ring.push_compact(5, compact_take(0, 0, 0, 14 << 8, 1).unwrap());
        ring.drain(&mut out);
        let named: Vec<(u64, u64)> = out.iter().map(|w| (w[3], w[2])).collect();
        assert_eq!(named, [(10, 5), (11, 5), (12, 6), (13, 6), (14 << 8, 5)]);
    }

    /// Compact records hold the largest values that fit, come back as the
    /// file's words, and values that do not fit get no compact record.
    #[test]
    fn compact_records_round_trip_at_their_limits() {
        let clock = Arc::new(Clock::new());
        let ring = ring(16, Arc::clone(&clock), false);
        let id = (1u64 << 48) - 256;
        let most = COMPACT_VALUE - 1;
        clock.set(77);
        ring.push_compact(9, compact_take(6, 31, 3, id, most).unwrap());
        ring.push_compact(9, compact_drop(DROP_BOTH, 31, id, most).unwrap());
        ring.push_compact(9, compact_take(0, 0, 0, 256, 0).unwrap());
        let mut out = Vec::new();
        ring.drain(&mut out);
        assert_eq!(
            out,
            [
                [file_head(TAKE, 6, 31), 77, 9, id, most, 103],
                [file_head(DROP, DROP_BOTH, 31), 77, 9, id, most, 9],
                [file_head(TAKE, 0, 0), 77, 9, 256, 0, 100],
            ]
        );
        assert_eq!(compact_take(0, 0, 0, 256, COMPACT_VALUE), None);
        assert_eq!(compact_take(0, 32, 0, 256, 1), None);
        assert_eq!(compact_take(0, 0, 256, 256, 1), None);
        assert_eq!(compact_take(8, 0, 0, 256, 1), None);
        assert_eq!(compact_take(0, 0, 0, 257, 1), None);
        assert_eq!(compact_take(0, 0, 0, 1 << 48, 1), None);
        assert_eq!(compact_drop(0, 0, 4096, COMPACT_VALUE), None);
    }

    const DROP_BOTH: u8 = super::super::format::DROP_COPY | super::super::format::DROP_PINNED;

    #[test]
    fn ticks_past_32_bits_are_restored() {
        let clock = Arc::new(Clock::new());
        let ring = ring(16, Arc::clone(&clock), false);
        let past = (5u64 << 32) + 7;
        clock.set(past);
        ring.push(1, 1, 1, 0, 0);
        ring.push_compact(1, compact_take(0, 0, 0, 256, 0).unwrap());
        clock.set(past + 3);
        let mut out = Vec::new();
        ring.drain(&mut out);
        assert_eq!(out[0][1], past);
        assert_eq!(out[1][1], past);
    }

    #[test]
    fn one_writer_and_the_reader_at_once_lose_nothing_they_count() {
        let clock = Arc::new(Clock::new());
        let ring = Arc::new(ring(128, Arc::clone(&clock), false));
        let writer = {
            let (ring, clock) = (ring.clone(), clock.clone());
            std::thread::spawn(move || {
                for i in 0..100_000u64 {
                    if i % 1000 == 0 {
                        clock.advance();
                    }
                    if i % 3 == 0 {
                        ring.push(1, 1, i, i * 3, 0);
                    } else {
                        ring.push_compact(1, compact_take(0, 1, 2, i << 8, i * 3).unwrap());
                    }
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
        let index = |w: &[u64; 6]| if w[5] == 0 { w[3] } else { w[3] >> 8 };
        assert!(seen.windows(2).all(|w| index(&w[0]) < index(&w[1])));
        assert!(
            seen.windows(2).all(|w| w[0][1] <= w[1][1]),
            "time went back"
        );
        assert!(seen.iter().all(|w| w[4] == index(w) * 3), "torn record");
    }

    /// A marker in the ring's last slot, and a full record across the
    /// wrap (its second slot in slot 0).
    #[test]
    fn a_marker_or_a_record_across_the_wrap() {
        let ring = ring(8, Arc::new(Clock::new()), false);
        let mut out = Vec::new();
        ring.push(1, 5, 0, 0, 0); // marker 0, record 1-2
        ring.push(1, 5, 1, 0, 0); // 3-4
        ring.push(1, 5, 2, 0, 0); // 5-6
        assert_eq!(ring.drain(&mut out), 0);
        ring.push(1, 6, 3, 0, 0); // marker 7, record 8-9 (slots 0-1)
        ring.push_compact(6, compact_take(0, 0, 0, 4 << 8, 0).unwrap()); // 10
        ring.push(1, 6, 5, 0, 0); // 11-12
        assert_eq!(ring.drain(&mut out), 0);
        ring.push(1, 6, 6, 0, 0); // 13-14
        ring.push(1, 6, 7, 0, 0); // 15-16 (slots 7, 0)
        ring.push(1, 6, 8, 0, 0); // 17-18
        ring.push(1, 6, 9, 0, 0); // 19-20
        ring.push(1, 6, 10, 0, 0); // full: lost
        assert_eq!(ring.drain(&mut out), 1);
        let named: Vec<(u64, u64)> = out.iter().map(|w| (w[3], w[2])).collect();
        assert_eq!(
            named,
            [
                (0, 5),
                (1, 5),
                (2, 5),
                (3, 6),
                (4 << 8, 6),
                (5, 6),
                (6, 6),
                (7, 6),
                (8, 6),
                (9, 6)
            ]
        );
    }

    /// One slot free and a marker needed: the record is lost (counted
    /// once), and the thread's next record still gets its marker.
    #[test]
    fn a_full_ring_exactly_when_a_marker_is_needed() {
        let ring = ring(4, Arc::new(Clock::new()), true);
        let mut out = Vec::new();
        ring.push(1, 5, 0, 0, 0); // marker, record: three slots
                                  // One slot free: thread 6 needs two for a compact record.
        ring.push_compact(6, compact_take(0, 0, 0, 256, 0).unwrap());
        // Thread 5 needs one: fits.
        ring.push_compact(5, compact_take(0, 0, 0, 512, 0).unwrap());
        assert_eq!(ring.drain(&mut out), 1);
        ring.push_compact(6, compact_take(0, 0, 0, 768, 0).unwrap());
        ring.push_compact(5, compact_take(0, 0, 0, 1024, 0).unwrap());
        assert_eq!(ring.drain(&mut out), 0);
        let named: Vec<(u64, u64)> = out.iter().map(|w| (w[3], w[2])).collect();
        assert_eq!(named, [(0, 5), (512, 5), (768, 6), (1024, 5)]);
    }

    /// Random pushes, full and compact, by threads 0 (events), 1, 2, 3
    /// and drains, on rings of several sizes: every record drained names
    /// its writer, keeps its order and its tick, and drained + lost =
    /// pushed.
    #[test]
    fn random_writers_and_drains_against_a_model() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for cap in [4usize, 8, 16, 32] {
            for _round in 0..200 {
                let clock = Arc::new(Clock::new());
                let ring = ring(cap, Arc::clone(&clock), true);
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
                        if r >> 20 & 1 == 0 {
                            ring.push(3, thread, pushed, thread, clock.now());
                        } else {
                            let words =
                                compact_take(0, 0, thread as usize, pushed << 8, clock.now());
                            ring.push_compact(thread, words.unwrap());
                        }
                        pushed += 1;
                    }
                }
                lost += ring.drain(&mut out);
                assert_eq!(out.len() as u64 + lost, pushed, "cap {cap}");
                for w in &out {
                    if w[0] == 3 {
                        assert_eq!((w[2], w[1]), (w[4], w[5]), "full record wrong: {w:?}");
                    } else {
                        assert_eq!(w[0], file_head(TAKE, 0, 0), "{w:?}");
                        assert_eq!(
                            (w[5], w[1]),
                            (SIZES[w[2] as usize], w[4]),
                            "compact wrong: {w:?}"
                        );
                    }
                }
                let index = |w: &[u64; 6]| if w[0] == 3 { w[3] } else { w[3] >> 8 };
                assert!(out.windows(2).all(|w| index(&w[0]) < index(&w[1])));
            }
        }
    }

    /// Three writers of the shared ring (one of them the events' thread
    /// 0) and the reader at once.
    #[test]
    fn shared_ring_writers_and_reader_at_once() {
        let clock = Arc::new(Clock::new());
        let ring = Arc::new(ring(128, Arc::clone(&clock), true));
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

    /// The clock just below and past 2^32 and 2^24 (a compact record's
    /// tick) when pushed, the reader's a little later.
    #[test]
    fn ticks_across_the_32_and_24_bit_boundaries() {
        for bits in [24u32, 32] {
            let clock = Arc::new(Clock::new());
            let ring = ring(16, Arc::clone(&clock), false);
            for t in [(1u64 << bits) - 1, 1 << bits, (1 << bits) + 1] {
                clock.set(t);
                ring.push(3, 1, t, 0, 0);
                ring.push_compact(1, compact_take(0, 0, 0, t << 8, 0).unwrap());
            }
            clock.set((1 << bits) + 5);
            let mut out = Vec::new();
            ring.drain(&mut out);
            let ids: Vec<u64> = out
                .iter()
                .map(|w| if w[0] == 3 { w[3] } else { w[3] >> 8 })
                .collect();
            assert!(out.iter().zip(&ids).all(|(w, id)| w[1] == *id), "{out:?}");
        }
    }

    /// The drain reaching the ring more than 2^24 ticks after its records
    /// were written (a process stopped for hours, a trace on a pipe no one
    /// reads): every record comes back at its own tick, the compact ones
    /// too.
    #[test]
    fn a_drain_more_than_2_24_ticks_late_restores_every_tick() {
        let clock = Arc::new(Clock::new());
        let ring = ring(16, Arc::clone(&clock), false);
        clock.set(1000);
        ring.push(file_head(TAKE, 6, 0), 1, 1 << 8, 5000, 8192);
        ring.push_compact(1, compact_take(0, 0, 0, 2 << 8, 64).unwrap());
        ring.push(file_head(DROP, 0, 0), 1, 2 << 8, 1 << 40, 1);
        ring.push_compact(1, compact_drop(0, 0, 1 << 8, 64).unwrap());
        clock.set(1000 + (1 << 24) + 1);
        let mut out = Vec::new();
        ring.drain(&mut out);
        let ticks: Vec<u64> = out.iter().map(|w| w[1]).collect();
        assert_eq!(ticks, [1000; 4], "{out:?}");
    }

    /// A compact record 2^24 ticks or more after the ring's last record
    /// is written whole, with its own tick and values; one just under
    /// stays compact.
    #[test]
    fn a_record_long_after_the_last_keeps_its_tick() {
        let clock = Arc::new(Clock::new());
        let mut out = Vec::new();
        for gap in [(1u64 << 24) - 1, 1 << 24, (1 << 24) + 1, 3 << 30] {
            clock.set(7);
            let first = ring(16, Arc::clone(&clock), false);
            first.push_compact(2, compact_take(3, 5, 1, 256, 9).unwrap());
            clock.set(7 + gap);
            first.push_compact(2, compact_drop(DROP_BOTH, 5, 256, 8).unwrap());
            first.push_compact(2, compact_take(3, 5, 2, 512, 9).unwrap());
            out.clear();
            first.drain(&mut out);
            let late = 7 + gap;
            assert_eq!(
                out,
                [
                    [file_head(TAKE, 3, 5), 7, 2, 256, 9, 101],
                    [file_head(DROP, DROP_BOTH, 5), late, 2, 256, 8, 2],
                    [file_head(TAKE, 3, 5), late, 2, 512, 9, 102],
                ],
                "gap {gap}"
            );
        }
    }

    /// Flags no compact record holds: a code that is no source's, and a
    /// drop by another thread than the taker's.
    #[test]
    fn flags_a_compact_record_cannot_hold_are_refused() {
        assert_eq!(compact_take(7, 0, 0, 256, 1), None);
        assert!(compact_take(6, 0, 0, 256, 1).is_some());
        let remote = super::super::format::DROP_REMOTE;
        assert_eq!(compact_drop(remote, 0, 256, 1), None);
        assert_eq!(compact_drop(remote | DROP_BOTH, 0, 256, 1), None);
        assert!(compact_drop(DROP_BOTH, 0, 256, 1).is_some());
    }

    /// A compact take of buffer `id << 8` with `value` asked.
    fn ct(id: u64, value: u64) -> [u64; 2] {
        compact_take(0, 0, 1, id << 8, value).unwrap()
    }

    /// A record lost to a full ring between a compact record and its
    /// predecessor, with a gap of 2^24 and more after the last one written.
    #[test]
    fn a_record_lost_before_a_long_gap_leaves_the_last_tick_as_read() {
        let clock = Arc::new(Clock::new());
        let ring = ring(4, Arc::clone(&clock), false);
        let mut out = Vec::new();
        clock.set(100);
        ring.push_compact(1, ct(0, 100)); // marker + 1 slot
        ring.push_compact(1, ct(1, 100)); // 3 slots
        ring.push_compact(1, ct(2, 100)); // 4 slots: full
        clock.set(100 + (1 << 23));
        ring.push_compact(1, ct(3, 0)); // lost
        clock.set(100 + (1 << 24) + 7);
        ring.push_compact(1, ct(4, 0)); // lost (needs 2, 0 free)
        assert_eq!(ring.drain(&mut out), 2);
        // last_tick is still 100: this must be full
        ring.push_compact(1, ct(5, 100 + (1 << 24) + 7));
        clock.set(100 + (1 << 24) + 9);
        ring.push_compact(1, ct(6, 100 + (1 << 24) + 9));
        ring.drain(&mut out);
        clock.set(100 + 3 * (1 << 24) - 1);
        ring.push_compact(1, ct(7, 100 + 3 * (1 << 24) - 1)); // full
        ring.drain(&mut out);
        for w in &out {
            assert_eq!(w[1], w[4], "{w:?}");
        }
        assert_eq!(out.len(), 6);
    }

    /// Random gaps around multiples of 2^24, full and compact records,
    /// the writer changing (a cache passed on), drains to random bounds
    /// `published` gave, small rings: every tick comes back exact.
    #[test]
    fn random_gaps_writers_and_drain_bounds_keep_every_tick() {
        let mut seed = 0x1234_5678_9abc_def1u64;
        let mut rand = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let gaps = [
            0u64,
            1,
            2,
            (1 << 24) - 2,
            (1 << 24) - 1,
            1 << 24,
            (1 << 24) + 1,
            (1 << 25) - 1,
            1 << 25,
        ];
        for cap in [4usize, 8, 16, 64] {
            for round in 0..300 {
                let clock = Arc::new(Clock::new());
                let start = [0u64, (1 << 24) - 3, (1 << 32) - 5, rand() % (1 << 40)][round % 4];
                clock.set(start);
                let ring = ring(cap, Arc::clone(&clock), round % 2 == 0);
                let (mut pushed, mut lost, mut out) = (0u64, 0u64, Vec::new());
                let mut bounds: Vec<usize> = Vec::new();
                let mut thread = 1u64;
                let mut since_drain = 0;
                for _ in 0..400 {
                    let r = rand();
                    if r % 6 == 0 || since_drain > 50 {
                        since_drain = 0;
                        if r % 12 == 0 && !bounds.is_empty() {
                            let b = bounds[(r >> 32) as usize % bounds.len()];
                            lost += ring.drain_to(&mut out, b);
                        } else {
                            lost += ring.drain(&mut out);
                        }
                        bounds.clear();
                        continue;
                    }
                    since_drain += 1;
                    let g = if r >> 10 & 1 == 0 {
                        gaps[(r >> 12) as usize % gaps.len()]
                    } else {
                        (r >> 16) % 3
                    };
                    clock.set(clock.now() + g);
                    if r >> 40 & 15 == 0 {
                        thread += 1;
                    }
                    let t = clock.now();
                    if r >> 20 & 3 == 0 {
                        ring.push(3, thread, pushed, t, thread);
                    } else {
                        ring.push_compact(thread, compact_take(0, 0, 2, pushed << 8, t).unwrap());
                    }
                    pushed += 1;
                    bounds.push(ring.published());
                }
                lost += ring.drain(&mut out);
                assert_eq!(out.len() as u64 + lost, pushed, "cap {cap}");
                for w in &out {
                    assert_eq!(
                        w[1], w[4],
                        "tick wrong: cap {cap} round {round} start {start} {w:?}"
                    );
                }
                let index = |w: &[u64; 6]| if w[0] == 3 { w[3] } else { w[3] >> 8 };
                assert!(out.windows(2).all(|w| index(&w[0]) < index(&w[1])));
                for w in &out {
                    if w[0] == 3 {
                        assert_eq!(w[2], w[5]);
                    } else {
                        assert_eq!(w[5], SIZES[2]);
                    }
                }
            }
        }
    }
}
