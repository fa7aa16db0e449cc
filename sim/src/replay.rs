//! Replaying a pinpool trace ([`pinpool::trace`]) against the strategies:
//! one thread per traced thread, each take and drop at its time in the
//! trace (divided by a speed factor), copies issued where the trace says a
//! copy was recorded.
//!
//! A buffer is named in a trace by its address, which pool reuse repeats:
//! a drop belongs to the earliest take of the same address still open
//! before it, in time order (a stable sort of the records by time). The
//! trace's clock ticks every millisecond, and records of one tick keep the
//! order of the threads' buffers they came from, so a drop can sort before
//! its own take when two threads wrote them in one tick: such a drop is
//! moved to just after the take. A replayed drop of a
//! buffer another thread takes waits for that take, so a thread running
//! late holds up only the drops of its own buffers.
//!
//! What a replay cannot know it takes from the trace as follows: the bytes
//! written are the drop's dirty prefix (at most the size asked), written
//! right after the take; a drop's copy is issued by the dropping thread on
//! its own stream, of the whole dirty prefix, where the trace says a copy
//! was recorded, or for every drop with a dirty prefix in a trace of a
//! pool on a backend without a GPU (which records no copies: the
//! simulator's host stand-in copies every drop); a buffer never dropped is
//! held to the end of the replay; a drop with no take before it (its take
//! was among the records lost) is left out and counted.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;
use pinpool::trace::{Record, Trace};

use crate::demand::Demand;
use crate::gpu::Sink;
use crate::run::{measure, InUse, RunResult, Tally};
use crate::strategy::{Kind, Settings, Staged, Strategy};

/// The most threads a replay runs.
pub const MAX_THREADS: usize = 4096;

/// One take or drop of a replayed thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A take.
    Take {
        /// When, nanoseconds after the trace's first take or drop.
        at_ns: u64,
        /// The buffer (an index among the trace's takes).
        id: usize,
        /// The device, on this machine.
        device: usize,
        /// Bytes asked (at least 1).
        size: usize,
        /// Bytes written after the take: its drop's dirty prefix, at most
        /// `size`; 0 for a buffer never dropped.
        written: usize,
        /// Whether the take lies after the first quarter of the trace's
        /// time (its steady part).
        steady: bool,
    },
    /// A drop.
    Drop {
        /// When, nanoseconds after the trace's first take or drop.
        at_ns: u64,
        /// The buffer.
        id: usize,
        /// Whether to copy the dirty prefix before the drop: the trace
        /// says a copy was recorded, or its pool had no GPU and the
        /// prefix is not empty.
        copy: bool,
    },
}

impl Event {
    /// When, nanoseconds after the trace's first take or drop.
    pub fn at_ns(&self) -> u64 {
        match *self {
            Event::Take { at_ns, .. } | Event::Drop { at_ns, .. } => at_ns,
        }
    }
}

/// A buffer of the trace: who took it, what it asked, and whether anyone
/// dropped it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// The taking thread (an index into [`Replay::threads`]).
    pub taker: usize,
    /// Bytes asked.
    pub size: usize,
    /// Bytes written.
    pub written: usize,
    /// The take's place in the trace's time order.
    pub from: u64,
    /// The drop's place in the time order, `None` if it was never dropped.
    pub to: Option<u64>,
}

/// A trace made ready to replay.
#[derive(Debug, Clone)]
pub struct Replay {
    /// Each replayed thread's events, in time order.
    pub threads: Vec<Vec<Event>>,
    /// The device each thread's copies go to (its first buffer's).
    pub thread_devices: Vec<usize>,
    /// Every buffer taken, by id.
    pub buffers: Vec<Taken>,
    /// Devices the replay uses.
    pub devices: usize,
    /// Devices the traced pool had.
    pub traced_devices: usize,
    /// Nanoseconds from the first take or drop to the last.
    pub span_ns: u64,
    /// Records the traced pool lost (its threads' buffers were full).
    pub lost: u64,
    /// Drops with no take before them, left out.
    pub unmatched_drops: u64,
    /// Whether the trace ends with its end record (the pool closed).
    pub complete: bool,
    /// pinpool's settings in the trace, as `PINPOOL_CONF` pairs, without
    /// the backend and the devices (the replay's own).
    pub conf: String,
}

impl Replay {
    /// Makes `trace` ready to replay on `present` devices (the GPUs of this
    /// machine), or on as many devices as the trace used when `None` (the
    /// host backend, whose devices are shards of memory; at most
    /// [`pinpool::MAX_DEVICES`]). Also returns warnings: records lost,
    /// devices mapped onto fewer, drops left out.
    pub fn new(trace: &Trace, present: Option<usize>) -> Result<(Self, Vec<String>), String> {
        let mut warnings = Vec::new();
        let mut records: Vec<&Record> = trace
            .records
            .iter()
            .filter(|r| matches!(r, Record::Take { .. } | Record::Drop { .. }))
            .collect();
        records.sort_by_key(|r| r.time_ns());
        let traced_devices = trace
            .header
            .get("devices")
            .and_then(|d| d.parse::<usize>().ok())
            .unwrap_or(1)
            .max(
                records
                    .iter()
                    .map(|r| match r {
                        Record::Take { device, .. } | Record::Drop { device, .. } => {
                            usize::from(*device) + 1
                        }
                        _ => 1,
                    })
                    .max()
                    .unwrap_or(1),
            );
        // On the host backend the devices are shards of memory, as many as
        // a pool can have.
        let present = present.unwrap_or(pinpool::MAX_DEVICES).max(1);
        let devices = if present < traced_devices {
            warnings.push(format!(
                "the trace names {traced_devices} device(s) and {present} can replay here: \
                 device d replays on device d mod {present}"
            ));
            present
        } else {
            traced_devices
        };
        // A pool without a GPU records no copies: copy every dirty prefix.
        let copies_unrecorded = trace.header.get("backend") != Some("cuda");
        let first = records.first().map_or(0, |r| r.time_ns());
        let span_ns = records.last().map_or(0, |r| r.time_ns()) - first;
        let steady_from = span_ns / 4;
        let mut thread_index: HashMap<u64, usize> = HashMap::new();
        let mut threads: Vec<Vec<Event>> = Vec::new();
        let mut thread_devices: Vec<Option<usize>> = Vec::new();
        let mut buffers: Vec<Taken> = Vec::new();
        let Paired {
            ops,
            unmatched: unmatched_drops,
            closed,
        } = pair(&records);
        // Each take's buffer, by the take's place in `ops`.
        let mut buffer_of: Vec<usize> = vec![usize::MAX; ops.len()];
        for (seq, (record, paired)) in ops.iter().enumerate() {
            let (record, paired) = (record.as_ref(), *paired);
            let (at_ns, thread) = (record.time_ns() - first, thread_of(record));
            let next = thread_index.len();
            let t = *thread_index.entry(thread).or_insert(next);
            if t == threads.len() {
                threads.push(Vec::new());
                thread_devices.push(None);
            }
            match *record {
                Record::Take { asked, device, .. } => {
                    let size = usize::try_from(asked)
                        .ok()
                        .filter(|&s| s <= pinpool::MAX_CLASS_SIZE)
                        .ok_or_else(|| {
                            format!(
                                "a take at {} ns asks {asked} bytes, more than the largest \
                                 size class ({} bytes)",
                                record.time_ns(),
                                pinpool::MAX_CLASS_SIZE
                            )
                        })?
                        .max(1);
                    let device = usize::from(device) % devices;
                    thread_devices[t].get_or_insert(device);
                    let index = buffers.len();
                    buffer_of[seq] = index;
                    buffers.push(Taken {
                        taker: t,
                        size,
                        written: 0,
                        from: seq as u64,
                        to: None,
                    });
                    threads[t].push(Event::Take {
                        at_ns,
                        id: index,
                        device,
                        size,
                        written: 0,
                        steady: at_ns >= steady_from,
                    });
                }
                Record::Drop {
                    dirty,
                    copy_recorded,
                    device,
                    ..
                } => {
                    let index = buffer_of[paired.expect("`pair` keeps paired drops only")];
                    let buffer = &mut buffers[index];
                    buffer.written = usize::try_from(dirty)
                        .unwrap_or(usize::MAX)
                        .min(buffer.size);
                    buffer.to = Some(seq as u64);
                    thread_devices[t].get_or_insert(usize::from(device) % devices);
                    threads[t].push(Event::Drop {
                        at_ns,
                        id: index,
                        copy: copy_recorded || (copies_unrecorded && buffer.written > 0),
                    });
                }
                _ => unreachable!("only takes and drops are kept"),
            }
        }
        if threads.len() > MAX_THREADS {
            let traced = threads.len();
            (threads, thread_devices) = fold_threads(threads, thread_devices, &mut buffers);
            if threads.len() > MAX_THREADS {
                return Err(format!(
                    "the trace has more than {MAX_THREADS} taking or dropping threads at once"
                ));
            }
            warnings.push(format!(
                "{traced} traced threads replay on {} (threads of one device whose takes and \
                 drops do not overlap in time run one after another)",
                threads.len()
            ));
        }
        // The bytes written are known at the drop; the take writes them.
        for events in &mut threads {
            for event in events {
                if let Event::Take { id, written, .. } = event {
                    *written = buffers[*id].written;
                }
            }
        }
        let (lost, complete) = match trace.records.last() {
            Some(Record::End { lost, .. }) => (*lost, true),
            // Counts from the file: saturating, as a count past `u64::MAX`
            // is only a corrupt file's.
            _ => (
                trace
                    .records
                    .iter()
                    .map(|r| match r {
                        Record::Lost { records, .. } => *records,
                        _ => 0,
                    })
                    .fold(0u64, u64::saturating_add),
                false,
            ),
        };
        if lost > 0 {
            warnings.push(format!(
                "the traced pool lost {lost} record(s) (a thread's buffer was full): the \
                 replay lacks those takes and drops"
            ));
        }
        if !complete {
            warnings.push(
                "the trace has no end record (its pool never closed, or the file was cut): \
                 replaying what it has"
                    .to_string(),
            );
        }
        if closed > 0 {
            warnings.push(format!(
                "{closed} take(s) of an address were followed by another take of it while \
                 held (their drops were lost): each is dropped at the next take"
            ));
        }
        if unmatched_drops > 0 {
            warnings.push(format!(
                "{unmatched_drops} drop(s) have no take before them and are left out"
            ));
        }
        // The traced pool's settings, less where it ran (this machine's
        // backend and devices replay it) and where it wrote its trace (a
        // replay writes no trace unless asked: a header naming a path,
        // the trace itself say, must not make it overwrite that file).
        let conf = trace
            .header
            .conf()
            .split(',')
            .filter(|pair| {
                // Trimmed, as the pool reads keys.
                let key = pair.split('=').next().unwrap_or("").trim();
                !pair.is_empty() && !matches!(key, "backend" | "devices" | "trace")
            })
            .collect::<Vec<_>>()
            .join(",");
        Ok((
            Self {
                threads,
                thread_devices: thread_devices.into_iter().map(|d| d.unwrap_or(0)).collect(),
                buffers,
                devices,
                traced_devices,
                span_ns,
                lost,
                unmatched_drops,
                complete,
                conf,
            },
            warnings,
        ))
    }

    /// Takes in all.
    pub fn takes(&self) -> usize {
        self.buffers.len()
    }

    /// Takes in the trace's steady part (after its first quarter of time),
    /// which the steady hit rates count.
    pub fn steady_takes(&self) -> usize {
        self.threads
            .iter()
            .flatten()
            .filter(|e| matches!(e, Event::Take { steady: true, .. }))
            .count()
    }

    /// Buffers never dropped.
    pub fn never_dropped(&self) -> usize {
        self.buffers.iter().filter(|b| b.to.is_none()).count()
    }

    /// The most bytes asked and not yet dropped at once, in the trace's
    /// order: what the replay's own peak in-use figure should come to.
    pub fn peak_in_use_bytes(&self) -> u64 {
        let mut changes: Vec<(u64, i64)> = Vec::with_capacity(2 * self.buffers.len());
        for b in &self.buffers {
            changes.push((b.from, b.size as i64));
            if let Some(to) = b.to {
                changes.push((to, -(b.size as i64)));
            }
        }
        changes.sort_unstable();
        let (mut now, mut peak) = (0i64, 0i64);
        for (_, change) in changes {
            now += change;
            peak = peak.max(now);
        }
        peak as u64
    }

    /// The largest copy thread `thread` issues.
    fn largest_copy(&self, thread: usize) -> usize {
        self.threads[thread]
            .iter()
            .filter_map(|e| match *e {
                Event::Drop { id, copy: true, .. } => Some(self.buffers[id].written),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }
}

/// What [`pair`] makes of a trace's takes and drops.
struct Paired<'a> {
    /// The takes and drops in order, each drop with the place of its take.
    ops: Vec<(Cow<'a, Record>, Option<usize>)>,
    /// Drops with no take (theirs was lost), left out.
    unmatched: u64,
    /// Takes whose drops were lost, dropped at the next take of their
    /// address.
    closed: u64,
}

/// The takes and drops of `records` (sorted by time) in an order that
/// keeps each thread's own order and puts every drop after its take, each
/// drop with the place of its take in that order; and how many drops have
/// no take (theirs was lost), left out.
///
/// A take of an address that a take of an earlier tick still holds, with
/// no drop of that take still to come in the tick, means that take's drop
/// was lost (a pool hands an address out once at a time, and a drop is
/// recorded no later than the tick of its address's next take): that take
/// is dropped, by its taker, at the new take (counted in `closed`), rather
/// than held to the end of the replay.
///
/// The trace's clock ticks once a millisecond, and the records of one tick
/// keep the order of the threads' buffers they came from, not the order
/// they happened in across threads: a drop may sort before the take it
/// belongs to when two threads wrote them in one tick. So within a tick
/// the threads' records are merged: at each step the earliest record (in
/// the file) that can come next does: a thread's drop of a buffer it took
/// itself once that take is open, else a drop of another thread's buffer
/// (the drop names its taker) once a take of the address by that taker is
/// open, else a take (so that a buffer is given back before it is taken
/// again, as a pool hands out one buffer once at a time). A drop that
/// can never come next (its taker's take is not open) pairs with the
/// earliest open take of its address, or with none.
fn pair<'a>(records: &[&'a Record]) -> Paired<'a> {
    /// A take not yet dropped: its place in the order, its thread.
    struct Open {
        op: usize,
        thread: u64,
    }
    let mut ops: Vec<(Cow<'a, Record>, Option<usize>)> = Vec::with_capacity(records.len());
    let mut open: HashMap<u64, Vec<Open>> = HashMap::new();
    let mut unmatched = 0;
    let mut closed = 0;
    let mut start = 0;
    while start < records.len() {
        let time = records[start].time_ns();
        let end = start
            + records[start..]
                .iter()
                .take_while(|r| r.time_ns() == time)
                .count();
        // Each thread's records of the tick, in file order (with their
        // places in the file).
        let mut chains: Vec<(u64, VecDeque<(usize, &Record)>)> = Vec::new();
        for (at, &record) in records[start..end].iter().enumerate() {
            let thread = thread_of(record);
            match chains.iter_mut().find(|(t, _)| *t == thread) {
                Some((_, chain)) => chain.push_back((at, record)),
                None => chains.push((thread, VecDeque::from([(at, record)]))),
            }
        }
        // Whether a drop of `id` taken by `taker` is still to come in the
        // tick, by `by` if given.
        let pending =
            |chains: &[(u64, VecDeque<(usize, &Record)>)], id: u64, taker: u64, by: Option<u64>| {
                chains.iter().any(|(thread, chain)| {
                    by.is_none_or(|b| b == *thread)
                    && chain.iter().any(|&(_, r)| {
                        matches!(*r, Record::Drop { id: i, taker: t, .. } if i == id && t == taker)
                    })
                })
            };
        loop {
            // The next record: the earliest ready head, drops of one's own
            // buffers first, then drops of others', then takes (a buffer
            // given back before it is taken again); if none is ready, the
            // earliest head. A drop of another's buffer is not ready while
            // its taker's own drop of the address is still to come in the
            // tick: the open take is the one the taker drops itself, and
            // the handed one is its next take of the address.
            let mut ready: Option<(u8, usize, usize)> = None;
            let mut earliest: Option<(usize, usize)> = None;
            for (c, (thread, chain)) in chains.iter().enumerate() {
                let Some(&(at, record)) = chain.front() else {
                    continue;
                };
                if earliest.is_none_or(|(e, _)| at < e) {
                    earliest = Some((at, c));
                }
                let class = match *record {
                    Record::Drop { id, taker, .. } => {
                        let by = |t: u64| {
                            open.get(&id)
                                .is_some_and(|v| v.iter().any(|o| o.thread == t))
                        };
                        if taker == *thread {
                            by(taker).then_some(0)
                        } else {
                            (by(taker) && !pending(&chains, id, taker, Some(taker))).then_some(1)
                        }
                    }
                    _ => Some(2),
                };
                if let Some(class) = class {
                    if ready.is_none_or(|(rc, ra, _)| (class, at) < (rc, ra)) {
                        ready = Some((class, at, c));
                    }
                }
            }
            let c = match (ready, earliest) {
                (Some((_, _, c)), _) | (None, Some((_, c))) => c,
                (None, None) => break,
            };
            // Takes of the head's address held since an earlier tick whose
            // drops are not still to come in this one: their drops were
            // lost (a drop comes no later than the tick of the address's
            // next take).
            let lost: Vec<usize> = match *chains[c].1.front().expect("a head was chosen").1 {
                Record::Take { id, time_ns, .. } => open.get(&id).map_or_else(Vec::new, |takes| {
                    (0..takes.len())
                        .filter(|&i| {
                            ops[takes[i].op].0.time_ns() < time_ns
                                && !pending(&chains, id, takes[i].thread, None)
                        })
                        .collect()
                }),
                _ => Vec::new(),
            };
            let (thread, chain) = &mut chains[c];
            let (_, record) = chain.pop_front().expect("a head was chosen");
            match *record {
                Record::Take {
                    id,
                    time_ns,
                    device,
                    ..
                } => {
                    let takes = open.entry(id).or_default();
                    for i in lost.into_iter().rev() {
                        let held = takes.remove(i);
                        let drop = Record::Drop {
                            time_ns,
                            thread: held.thread,
                            taker: held.thread,
                            device,
                            id,
                            dirty: 0,
                            copy_recorded: false,
                            pinned: false,
                            remote: false,
                        };
                        ops.push((Cow::Owned(drop), Some(held.op)));
                        closed += 1;
                    }
                    takes.push(Open {
                        op: ops.len(),
                        thread: *thread,
                    });
                    ops.push((Cow::Borrowed(record), None));
                }
                Record::Drop { id, taker, .. } => {
                    let takes = open.entry(id).or_default();
                    // One's own buffer: the latest take of it by this
                    // thread; another's: the earliest by its taker.
                    let by_taker = if taker == *thread {
                        takes.iter().rposition(|o| o.thread == taker)
                    } else {
                        takes.iter().position(|o| o.thread == taker)
                    };
                    match by_taker.or((!takes.is_empty()).then_some(0)) {
                        Some(i) => {
                            let take = takes.remove(i);
                            ops.push((Cow::Borrowed(record), Some(take.op)));
                        }
                        None => unmatched += 1,
                    }
                }
                _ => {}
            }
        }
        start = end;
    }
    Paired {
        ops,
        unmatched,
        closed,
    }
}

/// Folds `threads` (with their devices) whose events do not overlap in time
/// onto fewer threads: each, in order of its first event, goes after the
/// events of a folded thread of its device that ended before it began, or
/// on a thread of its own; `buffers`' takers follow.
fn fold_threads(
    threads: Vec<Vec<Event>>,
    devices: Vec<Option<usize>>,
    buffers: &mut [Taken],
) -> (Vec<Vec<Event>>, Vec<Option<usize>>) {
    let first = |events: &[Event]| events.first().map_or(0, Event::at_ns);
    let mut order: Vec<usize> = (0..threads.len()).collect();
    order.sort_by_key(|&t| first(&threads[t]));
    let mut threads: Vec<Option<Vec<Event>>> = threads.into_iter().map(Some).collect();
    let mut folded: Vec<Vec<Event>> = Vec::new();
    let mut folded_devices: Vec<Option<usize>> = Vec::new();
    // Each folded thread's last event time, by device.
    let mut ends: HashMap<Option<usize>, Vec<(u64, usize)>> = HashMap::new();
    let mut to = vec![0; threads.len()];
    for t in order {
        let events = threads[t].take().expect("each thread once");
        let (begin, end) = (first(&events), events.last().map_or(0, Event::at_ns));
        let free = ends.entry(devices[t]).or_default();
        let slot = match free.iter().position(|&(e, _)| e < begin) {
            Some(i) => {
                let slot = free[i].1;
                free[i].0 = end;
                folded[slot].extend(events);
                slot
            }
            None => {
                folded.push(events);
                folded_devices.push(devices[t]);
                free.push((end, folded.len() - 1));
                folded.len() - 1
            }
        };
        to[t] = slot;
    }
    for buffer in buffers {
        buffer.taker = to[buffer.taker];
    }
    (folded, folded_devices)
}

/// The thread that wrote `record`.
fn thread_of(record: &Record) -> u64 {
    match *record {
        Record::Take { thread, .. } | Record::Drop { thread, .. } => thread,
        _ => 0,
    }
}

impl Demand for Replay {
    fn devices(&self) -> usize {
        self.devices
    }

    fn provers(&self) -> usize {
        self.threads.len()
    }

    fn device_of(&self, prover: usize) -> usize {
        self.thread_devices[prover]
    }

    fn peak_holdings(
        &self,
        prover: usize,
        length: &dyn Fn(usize) -> usize,
    ) -> HashMap<usize, usize> {
        // Each buffer is held by its taker from its take to its drop.
        let mut changes: Vec<(u64, bool, usize)> = Vec::new();
        for b in self.buffers.iter().filter(|b| b.taker == prover) {
            changes.push((b.from, true, length(b.size)));
            if let Some(to) = b.to {
                changes.push((to, false, length(b.size)));
            }
        }
        changes.sort_unstable_by_key(|c| c.0);
        let (mut held, mut peak) = (HashMap::new(), HashMap::new());
        for (_, take, len) in changes {
            let now: &mut usize = held.entry(len).or_default();
            if take {
                *now += 1;
                let most: &mut usize = peak.entry(len).or_default();
                *most = (*most).max(*now);
            } else {
                *now -= 1;
            }
        }
        peak
    }
}

/// A take whose size is this panics in a test build, to show that a
/// replay thread's panic fails the replay.
#[cfg(test)]
const PANIC_SIZE: usize = 7_777_777;

/// A buffer passed from its taker to its dropper.
#[derive(Default)]
struct Slot<'a> {
    buf: Mutex<Option<Staged<'a>>>,
    filled: Condvar,
}

impl<'a> Slot<'a> {
    fn put(&self, buf: Staged<'a>) {
        *lock(&self.buf) = Some(buf);
        self.filled.notify_all();
    }

    /// The buffer, once its taker has put it here; a panic if another
    /// replay thread has failed (`failed`) first.
    fn wait(&self, failed: &AtomicBool) -> Staged<'a> {
        let mut slot = lock(&self.buf);
        loop {
            if let Some(buf) = slot.take() {
                return buf;
            }
            // Relaxed: a failure seen one wait late is seen at the next.
            if failed.load(Ordering::Relaxed) {
                panic!("another replay thread failed");
            }
            slot = self
                .filled
                .wait_timeout(slot, Duration::from_millis(50))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn try_take(&self) -> Option<Staged<'a>> {
        lock(&self.buf).take()
    }
}

/// `m` locked, poisoned or not: a slot holds only an `Option`.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Marks the replay failed if its thread unwinds, so that the threads
/// waiting for its buffers stop waiting.
struct FailOnUnwind<'a>(&'a AtomicBool);

impl Drop for FailOnUnwind<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

/// Replays `replay` through a new strategy of `kind` with pinpool's
/// `settings`, on `gpu` if given, at `speed` times the trace's pace.
pub fn run(
    kind: Kind,
    replay: &Replay,
    settings: &Settings,
    gpu: Option<&[Arc<CudaContext>]>,
    speed: f64,
) -> RunResult {
    run_strategy(
        Strategy::new(kind, replay, settings, gpu),
        replay,
        gpu,
        speed,
    )
}

/// Replays `replay` through `strategy` (built for it, on `gpu` if given)
/// at `speed` times the trace's pace, then shuts the strategy down.
pub fn run_strategy(
    strategy: Strategy,
    replay: &Replay,
    gpu: Option<&[Arc<CudaContext>]>,
    speed: f64,
) -> RunResult {
    measure(strategy, None, |strategy, in_use| {
        let slots: Vec<Slot<'_>> = (0..replay.buffers.len()).map(|_| Slot::default()).collect();
        let ready = Barrier::new(replay.threads.len());
        let start = OnceLock::new();
        let failed = AtomicBool::new(false);
        let mut tally = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..replay.threads.len())
                .map(|t| {
                    let (slots, ready, start, failed) = (&slots, &ready, &start, &failed);
                    scope.spawn(move || {
                        let _fail = FailOnUnwind(failed);
                        replay_thread(
                            strategy, replay, t, slots, ready, start, gpu, speed, in_use, failed,
                        )
                    })
                })
                .collect();
            let mut tally = Tally::default();
            for thread in threads {
                tally.merge(thread.join().expect("a replay thread panicked"));
            }
            tally
        });
        // Buffers never dropped in the trace are given back at its end.
        for (slot, taken) in slots.iter().zip(&replay.buffers) {
            if let Some(buf) = slot.try_take() {
                buf.give_back(taken.taker, taken.written, None);
                in_use.given_back(taken.size as u64);
            }
        }
        // Every copy is done (each thread synchronized its sink).
        for thread in 0..replay.threads.len() {
            strategy.finish(thread);
        }
        if tally.started.is_none() {
            tally.started = Some(Instant::now());
        }
        tally
    })
}

/// Waits until `due`; returns how late it is then.
fn wait_until(due: Instant) -> Duration {
    let now = Instant::now();
    if let Some(ahead) = due.checked_duration_since(now) {
        // A sleep overshoots by tens of microseconds: sleep short of the
        // time, then yield until it.
        if ahead > Duration::from_micros(200) {
            std::thread::sleep(ahead - Duration::from_micros(100));
        }
        while Instant::now() < due {
            std::thread::yield_now();
        }
    }
    Instant::now().saturating_duration_since(due)
}

/// One replayed thread: its events in order, at their times.
#[allow(clippy::too_many_arguments)]
fn replay_thread<'a>(
    strategy: &'a Strategy,
    replay: &Replay,
    thread: usize,
    slots: &[Slot<'a>],
    ready: &Barrier,
    start: &OnceLock<Instant>,
    gpu: Option<&[Arc<CudaContext>]>,
    speed: f64,
    in_use: &InUse,
    failed: &AtomicBool,
) -> Tally {
    let device = replay.thread_devices[thread];
    let mut sink = Sink::new(gpu.map(|g| &g[device]), replay.largest_copy(thread));
    ready.wait();
    let start = *start.get_or_init(Instant::now);
    let mut tally = Tally {
        started: Some(start),
        ..Tally::default()
    };
    for event in &replay.threads[thread] {
        // A time no `Instant` can hold (a speed near 0, a time near the
        // end of a u64) is due at once.
        let due = Duration::try_from_secs_f64(event.at_ns() as f64 / 1e9 / speed)
            .ok()
            .and_then(|after| start.checked_add(after))
            .unwrap_or(start);
        tally.late_ns.push(wait_until(due).as_nanos() as u64);
        match *event {
            Event::Take {
                id,
                device,
                size,
                written,
                steady,
                ..
            } => {
                #[cfg(test)]
                assert_ne!(size, PANIC_SIZE, "a take of the size that panics");
                let started = Instant::now();
                let mut buf = strategy.take(thread, device, size);
                tally.take_ns.push(started.elapsed().as_nanos() as u64);
                in_use.taken(size as u64);
                tally.take(&mut buf, size, steady);
                buf.bytes()[..written].fill(0x5A);
                slots[id].put(buf);
            }
            Event::Drop { id, copy, .. } => {
                let buf = slots[id].wait(failed);
                let taken = replay.buffers[id];
                let took = buf.give_back(taken.taker, taken.written, copy.then_some(&mut sink));
                tally.drop_ns.push(took.as_nanos() as u64);
                in_use.given_back(taken.size as u64);
                if copy {
                    tally.staged += taken.written as u64;
                }
            }
        }
    }
    sink.synchronize();
    tally
}

#[cfg(test)]
mod tests {
    use super::*;
    use pinpool::trace::{Header, Source};

    fn take(time_ns: u64, thread: u64, device: u16, id: u64, asked: u64) -> Record {
        Record::Take {
            time_ns,
            thread,
            device,
            id,
            asked,
            len: asked,
            source: Source::Miss,
        }
    }

    fn drop_(time_ns: u64, thread: u64, taker: u64, id: u64, dirty: u64) -> Record {
        Record::Drop {
            time_ns,
            thread,
            taker,
            device: 0,
            id,
            dirty,
            copy_recorded: false,
            pinned: false,
            remote: thread != taker,
        }
    }

    fn trace(records: Vec<Record>) -> Trace {
        Trace {
            version: pinpool::trace::VERSION,
            header: Header {
                entries: vec![
                    ("backend".into(), "host".into()),
                    ("setting.backend".into(), "host".into()),
                    ("setting.devices".into(), "1".into()),
                    ("setting.max_pooled_bytes".into(), "1048576".into()),
                ],
            },
            records,
        }
    }

    /// Thread 7 takes a buffer that thread 9 drops, then the same address
    /// again (the pool reused it), which it drops itself; thread 9 takes
    /// one it never drops; one drop has no take. The records are out of
    /// time order, as batches of the background thread can leave them.
    fn crossing() -> Trace {
        trace(vec![
            take(20, 7, 0, 0x1000, 300),
            drop_(10, 9, 7, 0x1000, 100),
            take(0, 7, 0, 0x1000, 200),
            take(5, 9, 0, 0x2000, 50),
            drop_(30, 7, 7, 0x1000, 400),
            drop_(40, 9, 9, 0x3000, 1),
        ])
    }

    /// Lost records counted past `u64::MAX` in all (a trace file's counts
    /// are outside input) warn, and saturate, rather than overflow.
    #[test]
    fn lost_records_past_u64_max_in_all_saturate() {
        let lost = |time_ns| Record::Lost {
            time_ns,
            thread: 0,
            records: u64::MAX / 2 + 1,
        };
        let (_, warnings) = Replay::new(
            &trace(vec![take(0, 7, 0, 0x1000, 300), lost(1), lost(2)]),
            None,
        )
        .unwrap();
        assert!(
            warnings
                .iter()
                .any(|w| w.contains(&format!("lost {}", u64::MAX))),
            "{warnings:?}"
        );
    }

    /// Takes of an address still held (in the trace) whose drops were
    /// lost: a pool hands an address out once at a time, so each is dropped
    /// at the next take of its address, not held to the end.
    #[test]
    fn a_take_of_an_address_still_held_drops_the_earlier_take() {
        let ms = 1_000_000;
        let (replay, warnings) = Replay::new(
            &trace(vec![
                take(0, 7, 0, 0x1000, 300),
                take(ms, 7, 0, 0x1000, 300),
                take(2 * ms, 8, 0, 0x1000, 300),
                drop_(3 * ms, 8, 8, 0x1000, 10),
            ]),
            None,
        )
        .unwrap();
        assert_eq!(replay.takes(), 3);
        assert_eq!(replay.never_dropped(), 0, "{warnings:?}");
        assert_eq!(replay.peak_in_use_bytes(), 300);
        assert_eq!(replay.unmatched_drops, 0);
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("2 take(s)") && w.contains("lost")),
            "{warnings:?}"
        );
    }

    /// A process that ran more threads in its life than a replay runs
    /// (threads that come and go): those whose takes and drops do not
    /// overlap in time replay one after another on one thread; more than
    /// that many at once is refused.
    #[test]
    fn threads_that_come_and_go_replay_on_fewer_threads() {
        let ms = 1_000_000;
        let n = MAX_THREADS as u64 + 10;
        let records: Vec<_> = (0..n)
            .flat_map(|i| {
                [
                    take(2 * i * ms, i + 1, 0, 0x1000, 100),
                    drop_((2 * i + 1) * ms, i + 1, i + 1, 0x1000, 10),
                ]
            })
            .collect();
        let (replay, warnings) = Replay::new(&trace(records), None).unwrap();
        assert_eq!(replay.takes(), n as usize);
        assert_eq!(replay.threads.len(), 1, "{warnings:?}");
        assert_eq!(replay.never_dropped(), 0);
        assert!(
            warnings
                .iter()
                .any(|w| w.contains(&format!("{n} traced threads"))),
            "{warnings:?}"
        );
        // Every thread's takes and drops overlapping every other's: refused.
        let records: Vec<_> = (0..n)
            .flat_map(|i| {
                let id = 0x1000 * (i + 1);
                [
                    take(i * ms, i + 1, 0, id, 100),
                    drop_((n + i) * ms, i + 1, i + 1, id, 10),
                ]
            })
            .collect();
        let Err(e) = Replay::new(&trace(records), None) else {
            panic!("{n} threads at once replayed");
        };
        assert!(e.contains("at once"), "{e}");
    }

    #[test]
    fn drops_pair_with_the_open_take_of_their_address_on_the_dropping_thread() {
        let (replay, warnings) = Replay::new(&crossing(), None).unwrap();
        assert_eq!(replay.threads.len(), 2);
        assert_eq!(replay.takes(), 3);
        assert_eq!(replay.never_dropped(), 1);
        assert_eq!(replay.unmatched_drops, 1);
        assert_eq!(replay.span_ns, 40);
        assert!(warnings.iter().any(|w| w.contains("no take before them")));
        assert!(warnings.iter().any(|w| w.contains("no end record")));
        // Thread 7 (the first seen): its take at 0, its take at 20 of the
        // reused address, the drop at 30; the bytes written are the
        // drop's dirty prefix, at most the size asked.
        assert_eq!(
            replay.threads[0],
            vec![
                Event::Take {
                    at_ns: 0,
                    id: 0,
                    device: 0,
                    size: 200,
                    written: 100,
                    steady: false
                },
                Event::Take {
                    at_ns: 20,
                    id: 2,
                    device: 0,
                    size: 300,
                    written: 300,
                    steady: true
                },
                Event::Drop {
                    at_ns: 30,
                    id: 2,
                    copy: true
                },
            ]
        );
        // Thread 9 drops thread 7's first buffer.
        assert_eq!(
            replay.threads[1],
            vec![
                Event::Take {
                    at_ns: 5,
                    id: 1,
                    device: 0,
                    size: 50,
                    written: 0,
                    steady: false
                },
                Event::Drop {
                    at_ns: 10,
                    id: 0,
                    copy: true
                },
            ]
        );
        assert_eq!(replay.buffers[0].taker, 0);
        // Thread 7 holds one buffer at a time, thread 9 its one for ever.
        let same = |size: usize| size;
        assert_eq!(
            replay.peak_holdings(0, &same),
            HashMap::from([(200, 1), (300, 1)])
        );
        assert_eq!(replay.peak_holdings(1, &same), HashMap::from([(50, 1)]));
        assert_eq!(replay.peak_in_use_bytes(), 300 + 50);
        assert_eq!(replay.conf, "max_pooled_bytes=1048576");
    }

    /// In one tick of the clock, thread 2's ring (read first) holds its
    /// drops of a buffer thread 1 takes twice in that tick, passing it to
    /// thread 2 each time: the drops sort before their takes, and still
    /// pair with them.
    #[test]
    fn drops_that_sort_before_their_takes_in_one_tick_pair_with_them() {
        let (replay, warnings) = Replay::new(
            &trace(vec![
                drop_(5, 2, 1, 0x1000, 7),
                drop_(5, 2, 1, 0x1000, 8),
                take(5, 1, 0, 0x1000, 100),
                take(5, 1, 0, 0x1000, 100),
                take(9, 1, 0, 0x1000, 100),
                drop_(9, 1, 1, 0x1000, 9),
            ]),
            None,
        )
        .unwrap();
        assert_eq!(replay.unmatched_drops, 0, "{warnings:?}");
        assert_eq!(replay.never_dropped(), 0);
        assert_eq!(
            replay.buffers.iter().map(|b| b.written).collect::<Vec<_>>(),
            [7, 8, 9]
        );
        // Every drop follows its take in the replay's order.
        assert!(replay.buffers.iter().all(|b| b.to.unwrap() > b.from));
        assert_eq!(replay.peak_in_use_bytes(), 100);
    }

    #[test]
    fn a_cross_thread_replay_runs_every_take_and_drop() {
        let (replay, _) = Replay::new(&crossing(), None).unwrap();
        let settings = Settings {
            cleaner_threads: 1,
            max_pooled_bytes: Some(1 << 20),
            size_classes: pinpool::SizeClasses::Fine,
            conf: replay.conf.clone(),
            trace: None,
            emulate_pinning: false,
        };
        for kind in [
            Kind::Pinpool,
            Kind::Ideal,
            Kind::Limit,
            Kind::Seed,
            Kind::Pageable,
        ] {
            let result = run(kind, &replay, &settings, None, 1.0);
            assert_eq!(result.bytes_requested, 550, "{kind:?}");
            // At least the trace's peak; more when the drop on the other
            // thread runs late against the take that follows it.
            assert!((350..=550).contains(&result.peak_in_use_bytes), "{kind:?}");
            // Copies of the dirty prefixes on the host: 100 and 300 bytes.
            let staged = (result.staged_gb_per_s * result.wall_s * 1e9).round();
            assert_eq!(staged, 400.0, "{kind:?}");
            assert!(result.segments_per_s.is_none());
            assert!(result.steady_segments_per_s.is_none());
        }
    }

    #[test]
    fn devices_beyond_this_machines_replay_on_those_it_has() {
        let (replay, warnings) = Replay::new(
            &trace(vec![take(0, 1, 3, 0x1000, 10), drop_(1, 1, 1, 0x1000, 0)]),
            Some(2),
        )
        .unwrap();
        assert_eq!((replay.devices, replay.traced_devices), (2, 4));
        assert!(matches!(
            replay.threads[0][0],
            Event::Take { device: 1, .. }
        ));
        assert!(warnings.iter().any(|w| w.contains("mod 2")), "{warnings:?}");
    }

    #[test]
    fn a_take_larger_than_the_largest_class_is_an_error() {
        let huge = pinpool::MAX_CLASS_SIZE as u64 + 1;
        let e = Replay::new(&trace(vec![take(0, 1, 0, 0x1000, huge)]), None).unwrap_err();
        assert!(e.contains("largest size class"), "{e}");
    }

    /// Runs `f` on a thread: whether it panicked, if it ended within
    /// `secs`.
    fn ends_within(secs: u64, f: impl FnOnce() + Send + 'static) -> Option<bool> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err();
            let _ = tx.send(panicked);
        });
        rx.recv_timeout(Duration::from_secs(secs)).ok()
    }

    fn settings(replay: &Replay) -> Settings {
        Settings {
            cleaner_threads: 1,
            max_pooled_bytes: Some(1 << 20),
            size_classes: pinpool::SizeClasses::Fine,
            conf: replay.conf.clone(),
            trace: None,
            emulate_pinning: false,
        }
    }

    /// A speed near 0 puts every time beyond what an `Instant` holds: the
    /// replay runs them at once rather than panicking.
    #[test]
    fn a_tiny_speed_ends_the_replay() {
        let (replay, _) = Replay::new(&crossing(), None).unwrap();
        let settings = settings(&replay);
        let ended = ends_within(20, move || {
            let result = run(Kind::Pageable, &replay, &settings, None, 1e-300);
            assert_eq!(result.bytes_requested, 550);
        });
        assert_eq!(ended, Some(false), "the replay did not end cleanly");
    }

    /// A time beyond what a `Duration` holds (the last record's) replays
    /// at once too.
    #[test]
    fn a_time_beyond_a_duration_replays_at_once() {
        let (replay, _) = Replay::new(
            &trace(vec![
                take(0, 1, 0, 0x1000, 10),
                take(1, 2, 0, 0x2000, 10),
                drop_(u64::MAX, 2, 1, 0x1000, 1),
            ]),
            None,
        )
        .unwrap();
        let settings = settings(&replay);
        let ended = ends_within(20, move || {
            let result = run(Kind::Pageable, &replay, &settings, None, 1e-9);
            assert_eq!(result.bytes_requested, 20);
        });
        assert_eq!(ended, Some(false), "the replay did not end cleanly");
    }

    /// A replay thread that panics (here a take of [`PANIC_SIZE`] bytes)
    /// fails the replay, the panic reaching the caller, instead of leaving
    /// the thread that drops its buffer waiting for ever (and the sampler
    /// running).
    #[test]
    fn a_panicking_replay_thread_fails_the_replay() {
        let (replay, _) = Replay::new(
            &trace(vec![
                take(0, 1, 0, 0x1000, PANIC_SIZE as u64),
                drop_(1_000_000, 2, 1, 0x1000, 1),
                take(2_000_000, 2, 0, 0x2000, 10),
            ]),
            None,
        )
        .unwrap();
        let settings = settings(&replay);
        let ended = ends_within(20, move || {
            run(Kind::Pageable, &replay, &settings, None, 1.0);
        });
        assert_eq!(ended, Some(true), "the replay did not fail");
    }

    /// A trace naming a device far above what a pool serves replays on
    /// the host on the devices a pool can have, with a warning.
    #[test]
    fn a_device_far_above_replays_on_the_devices_that_exist() {
        let (replay, warnings) = Replay::new(
            &trace(vec![take(0, 1, 300, 0x1000, 10), drop_(1, 1, 1, 0x1000, 0)]),
            None,
        )
        .unwrap();
        let settings = settings(&replay);
        let built = crate::strategy::pinpool(&replay, &settings, None);
        assert!(
            built.is_ok(),
            "devices {} (warnings {warnings:?}): {}",
            replay.devices,
            built.unwrap_err()
        );
        assert_eq!(replay.devices, pinpool::MAX_DEVICES);
        let device = 300 % pinpool::MAX_DEVICES;
        assert!(
            matches!(replay.threads[0][0], Event::Take { device: d, .. } if d == device),
            "{:?}",
            replay.threads[0][0]
        );
        assert!(
            warnings.iter().any(|w| w.contains("301 device(s)")),
            "{warnings:?}"
        );
    }

    const MS: u64 = 1_000_000;

    /// In tick 5, thread 1 takes A and hands it to thread 2, which drops
    /// it and then takes B. Thread 2's ring is read first: its drop of A
    /// and take of B sort before thread 1's take of A. Thread 2's replayed
    /// events must stay in its own order (drop A, then take B), and the
    /// peak in use is one buffer.
    #[test]
    fn a_drop_sorted_before_its_take_keeps_its_threads_order() {
        let (replay, _) = Replay::new(
            &trace(vec![
                drop_(5 * MS, 2, 1, 0xA, 10),
                take(5 * MS, 2, 0, 0xB, 100),
                take(5 * MS, 1, 0, 0xA, 100),
            ]),
            None,
        )
        .unwrap();
        let t2 = replay.buffers[replay
            .buffers
            .iter()
            .position(|b| b.size == 100 && b.written == 0)
            .unwrap()]
        .taker;
        let kinds: Vec<&str> = replay.threads[t2]
            .iter()
            .map(|e| match e {
                Event::Take { .. } => "take",
                Event::Drop { .. } => "drop",
            })
            .collect();
        assert_eq!(kinds, ["drop", "take"], "thread 2's own order");
        assert_eq!(replay.peak_in_use_bytes(), 100);
    }

    /// Thread 1 takes A in tick 4, drops it itself in tick 5 (10 bytes
    /// written), takes A again (the pool reused it) and hands it to thread
    /// 2, which drops it (22 bytes written), all in tick 5; thread 2's ring
    /// is read first. No record is lost: the first buffer was dropped by
    /// thread 1 with 10 bytes, the second by thread 2 with 22.
    #[test]
    fn a_threads_drop_of_its_own_buffer_pairs_with_its_own_take() {
        let (replay, warnings) = Replay::new(
            &trace(vec![
                take(4 * MS, 1, 0, 0xA, 100),
                drop_(5 * MS, 2, 1, 0xA, 22),
                drop_(5 * MS, 1, 1, 0xA, 10),
                take(5 * MS, 1, 0, 0xA, 100),
            ]),
            None,
        )
        .unwrap();
        assert_eq!(replay.unmatched_drops, 0, "{warnings:?}");
        assert_eq!(
            replay.buffers.iter().map(|b| b.written).collect::<Vec<_>>(),
            [10, 22]
        );
    }

    /// Drops with no take (theirs were lost) in one tick, then takes: the
    /// plan (threads, buffers, events) is the same however often it is
    /// made.
    #[test]
    fn the_plan_is_the_same_every_time() {
        let t = trace(vec![
            drop_(5 * MS, 7, 7, 0xA, 1),
            drop_(5 * MS, 8, 8, 0xB, 1),
            drop_(5 * MS, 9, 9, 0xC, 1),
            take(6 * MS, 7, 0, 0xD, 10),
            take(6 * MS, 8, 0, 0xE, 20),
            take(6 * MS, 9, 0, 0xF, 30),
        ]);
        let first = Replay::new(&t, None).unwrap().0;
        for _ in 0..50 {
            let again = Replay::new(&t, None).unwrap().0;
            assert_eq!(again.buffers, first.buffers, "takers differ between runs");
            assert_eq!(again.threads, first.threads);
        }
    }

    /// The replay of `records` as a whole trace: ended, nothing lost.
    fn whole(mut records: Vec<Record>) -> (Replay, Vec<String>) {
        let time_ns = records.iter().map(Record::time_ns).max().unwrap_or(0);
        let count = records.len() as u64;
        records.push(Record::End {
            time_ns,
            records: count,
            lost: 0,
        });
        Replay::new(&trace(records), None).unwrap()
    }

    /// Thread 1 took A in tick 4; in tick 5 it takes B and drops A, and
    /// thread 2 takes A (the pool reused it); thread 2's ring is read
    /// first. No record is lost.
    #[test]
    fn a_drop_in_the_tick_of_the_next_take_is_not_lost() {
        let (replay, warnings) = whole(vec![
            take(4 * MS, 1, 0, 0xA, 100),
            take(5 * MS, 2, 0, 0xA, 100),
            take(5 * MS, 1, 0, 0xB, 100),
            drop_(5 * MS, 1, 1, 0xA, 10),
            drop_(6 * MS, 2, 2, 0xA, 22),
        ]);
        assert!(!warnings.iter().any(|w| w.contains("lost")), "{warnings:?}");
        assert_eq!(replay.unmatched_drops, 0, "{warnings:?}");
        // id 0: thread 1's A (10 bytes), id 1: thread 2's A (22), id 2: B.
        assert_eq!(
            replay.buffers.iter().map(|b| b.written).collect::<Vec<_>>(),
            [10, 22, 0]
        );
    }

    /// Checks a plan: every buffer dropped at most once, after its take
    /// (by `from`/`to` and on the replay threads), each thread's times in
    /// order, takers right, and a schedule that ends (no drop waits on a
    /// take that waits on it).
    fn check_plan(replay: &Replay) -> Result<(), String> {
        let mut dropped = vec![0; replay.buffers.len()];
        for (t, events) in replay.threads.iter().enumerate() {
            if events.windows(2).any(|w| w[0].at_ns() > w[1].at_ns()) {
                return Err(format!("thread {t} out of time order"));
            }
            for e in events {
                match *e {
                    Event::Take { id, .. } => {
                        if replay.buffers[id].taker != t {
                            return Err(format!("buffer {id}'s taker is not {t}"));
                        }
                    }
                    Event::Drop { id, .. } => {
                        dropped[id] += 1;
                        let b = replay.buffers[id];
                        if b.to.is_none_or(|to| to <= b.from) {
                            return Err(format!("buffer {id} dropped before its take"));
                        }
                    }
                }
            }
        }
        for (id, (n, b)) in dropped.iter().zip(&replay.buffers).enumerate() {
            if *n != usize::from(b.to.is_some()) {
                return Err(format!("buffer {id} dropped {n} times, to {:?}", b.to));
            }
        }
        // Run the plan: a drop waits for its take.
        let mut at = vec![0; replay.threads.len()];
        let mut taken = vec![false; replay.buffers.len()];
        loop {
            let mut moved = false;
            for (t, events) in replay.threads.iter().enumerate() {
                while let Some(e) = events.get(at[t]) {
                    match *e {
                        Event::Take { id, .. } => taken[id] = true,
                        Event::Drop { id, .. } if !taken[id] => break,
                        Event::Drop { .. } => {}
                    }
                    at[t] += 1;
                    moved = true;
                }
            }
            if !moved {
                break;
            }
        }
        if at.iter().zip(&replay.threads).any(|(a, e)| *a < e.len()) {
            return Err("the plan deadlocks".into());
        }
        Ok(())
    }

    /// Random small traces: few threads and addresses in few ticks, drops
    /// of one's own and of others' buffers, records lost at random if
    /// `lose`.
    fn random_trace(seed: u64, threads: u64, ticks: u64, lose: bool) -> Vec<Record> {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut next = |n: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % n
        };
        // Each address: who holds it (the taker), if anyone.
        let mut held: HashMap<u64, u64> = HashMap::new();
        let mut out = Vec::new();
        for tick in 0..ticks {
            // Each thread's records of the tick, then written ring by ring
            // in a random order of the threads.
            let mut rings: Vec<Vec<Record>> = vec![Vec::new(); threads as usize];
            for _ in 0..next(8) {
                let t = next(threads);
                let a = 0x1000 * (1 + next(3));
                match held.get(&a).copied() {
                    None => {
                        held.insert(a, t);
                        rings[t as usize].push(take(tick * MS, t + 1, 0, a, 100));
                    }
                    Some(taker) => {
                        held.remove(&a);
                        // The taker drops it, or hands it to `t`.
                        let by = if next(2) == 0 { taker } else { t };
                        rings[by as usize].push(drop_(tick * MS, by + 1, taker + 1, a, 5));
                    }
                }
            }
            let mut order: Vec<usize> = (0..threads as usize).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, next(i as u64 + 1) as usize);
            }
            for r in order {
                for rec in rings[r].drain(..) {
                    if !lose || next(10) != 0 {
                        out.push(rec);
                    }
                }
            }
        }
        out
    }

    #[test]
    fn random_traces_with_records_lost_make_whole_plans() {
        let mut failures = Vec::new();
        for seed in 0..3000 {
            let records = random_trace(seed, 3, 6, true);
            let lost = records.len();
            let t = trace(records.clone());
            match Replay::new(&t, None) {
                Ok((replay, _)) => {
                    if let Err(e) = check_plan(&replay) {
                        failures.push(format!("seed {seed} ({lost}): {e}"));
                    }
                }
                Err(e) => failures.push(format!("seed {seed}: error {e}")),
            }
        }
        assert!(
            failures.is_empty(),
            "{} failed, first: {:?}",
            failures.len(),
            &failures[..failures.len().min(5)]
        );
    }

    /// With nothing lost, nothing is taken for lost: no drop left out, no
    /// take dropped at the next.
    #[test]
    fn random_traces_with_nothing_lost_pair_every_drop() {
        let mut failures = Vec::new();
        for seed in 0..3000 {
            let records = random_trace(seed, 3, 6, false);
            let (replay, warnings) = Replay::new(&trace(records.clone()), None).unwrap();
            if let Err(e) = check_plan(&replay) {
                failures.push(format!("seed {seed}: {e}"));
            } else if replay.unmatched_drops > 0 || warnings.iter().any(|w| w.contains("lost")) {
                failures.push(format!("seed {seed}: {warnings:?} {records:?}"));
            }
        }
        assert!(
            failures.is_empty(),
            "{} of 3000 failed, first: {:?}",
            failures.len(),
            &failures[..failures.len().min(2)]
        );
    }

    /// 5,000 threads, each living two ticks: thread i takes its buffer in
    /// tick i on device i % 2, thread i + 1 drops it in tick i + 1 (a
    /// thread begins in the tick its neighbour ends); every third drop is
    /// lost, and the address is reused by the thread three on.
    #[test]
    fn folding_threads_that_come_and_go_keeps_the_plan() {
        let n = 5000u64;
        let mut records = Vec::new();
        for i in 0..n {
            let a = 0x1000 * (1 + i % 5);
            records.push(take(i * MS, i + 1, (i % 2) as u16, a, 100));
            if i % 5 != 1 {
                let mut d = drop_((i + 2) * MS, i + 3, i + 1, a, 5);
                if let Record::Drop { device, .. } = &mut d {
                    *device = (i % 2) as u16;
                }
                records.push(d);
            }
        }
        let (replay, warnings) = Replay::new(&trace(records), None).unwrap();
        assert!(replay.threads.len() <= MAX_THREADS, "{warnings:?}");
        check_plan(&replay).unwrap();
        for (t, events) in replay.threads.iter().enumerate() {
            for e in events {
                if let Event::Take { device, .. } = *e {
                    assert_eq!(device, replay.thread_devices[t], "thread {t} mixes devices");
                }
            }
        }
        assert_eq!(replay.takes(), n as usize);
        let settings = settings(&replay);
        for kind in [
            Kind::Pinpool,
            Kind::Ideal,
            Kind::Limit,
            Kind::Seed,
            Kind::Pageable,
        ] {
            let replay = replay.clone();
            let settings = settings.clone();
            let ended = ends_within(60, move || {
                let r = run(kind, &replay, &settings, None, 1000.0);
                assert_eq!(r.bytes_requested, 100 * n);
            });
            assert_eq!(ended, Some(false), "{kind:?}");
        }
    }

    /// Folding random plans of threads that come and go (each slot's
    /// thread is replaced every few ticks, one device per slot; buffers
    /// dropped by other threads, records lost) keeps every plan whole.
    #[test]
    fn folding_random_plans_keeps_each_threads_events_together() {
        for seed in 0..2000u64 {
            let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(99);
            let mut next = |n: u64| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 33) % n
            };
            let slots = 4u64;
            let id = |slot: u64, tick: u64| 1 + slot * 1000 + (tick + slot) / 3;
            let mut held: HashMap<u64, (u64, u16)> = HashMap::new();
            let mut records = Vec::new();
            for tick in 0..12u64 {
                let mut rings: Vec<Vec<Record>> = vec![Vec::new(); slots as usize];
                for _ in 0..next(8) {
                    let s = next(slots);
                    let me = id(s, tick);
                    let device = (s % 2) as u16;
                    let a = 0x1000 * (1 + next(4)) + u64::from(device);
                    match held.get(&a).copied() {
                        None => {
                            held.insert(a, (me, device));
                            rings[s as usize].push(take(tick * MS, me, device, a, 100));
                        }
                        Some((taker, d)) => {
                            held.remove(&a);
                            let mut r = drop_(tick * MS, me, taker, a, 5);
                            if let Record::Drop { device, .. } = &mut r {
                                *device = d;
                            }
                            // Only a slot of the buffer's device drops it.
                            if u64::from(d) == s % 2 {
                                rings[s as usize].push(r);
                            } else {
                                held.insert(a, (taker, d));
                            }
                        }
                    }
                }
                let mut order: Vec<usize> = (0..slots as usize).collect();
                for i in (1..order.len()).rev() {
                    order.swap(i, next(i as u64 + 1) as usize);
                }
                for r in order {
                    for rec in rings[r].drain(..) {
                        if next(8) != 0 {
                            records.push(rec);
                        }
                    }
                }
            }
            let (replay, _) = Replay::new(&trace(records), None).unwrap();
            check_plan(&replay).unwrap();
            let mut folded = replay.clone();
            let (threads, devices) = fold_threads(
                replay.threads.clone(),
                replay.thread_devices.iter().map(|&d| Some(d)).collect(),
                &mut folded.buffers,
            );
            folded.thread_devices = devices.into_iter().map(|d| d.unwrap()).collect();
            folded.threads = threads;
            check_plan(&folded).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            // Each traced thread's events run in one folded thread, in
            // their order and next to one another, on its device.
            for (t, events) in replay.threads.iter().enumerate() {
                let hits: Vec<usize> = folded
                    .threads
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| f.windows(events.len()).any(|w| w == &events[..]))
                    .map(|(i, _)| i)
                    .collect();
                assert!(!hits.is_empty(), "seed {seed}: thread {t} split");
                assert!(
                    hits.iter()
                        .any(|&i| folded.thread_devices[i] == replay.thread_devices[t]),
                    "seed {seed}: thread {t} on another device"
                );
            }
            assert_eq!(folded.peak_in_use_bytes(), replay.peak_in_use_bytes());
            assert_eq!(folded.never_dropped(), replay.never_dropped());
        }
    }

    /// Thread 2 took A in tick 4; in tick 5 it takes B, drops A, takes A
    /// again and hands it to thread 1, which drops it; thread 1's ring is
    /// read first. The handed drop pairs with the second take of A, not
    /// the first, which thread 2 drops itself.
    #[test]
    fn a_handed_drop_waits_for_the_takers_own_drop() {
        let (replay, warnings) = whole(vec![
            take(4 * MS, 2, 0, 0xA, 100),
            drop_(5 * MS, 1, 2, 0xA, 22),
            take(5 * MS, 2, 0, 0xB, 100),
            drop_(5 * MS, 2, 2, 0xA, 10),
            take(5 * MS, 2, 0, 0xA, 100),
        ]);
        assert_eq!(replay.unmatched_drops, 0, "{warnings:?}");
        assert_eq!(replay.never_dropped(), 1, "only B is held to the end");
    }
}
