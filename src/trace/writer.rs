//! The trace's background thread and file: the rings of the threads that
//! trace, the shared ring, and what turns their words into the file's
//! records (see the parent module for the format).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use super::clock::{Clock, TICK};
use super::format::{self, Header, Record, DROP, END, LOST, OUTSTANDING, TAKE};
use super::ring::{Ring, SHARED_SLOTS, THREAD_SLOTS};

/// How often the background thread empties the rings.
const DRAIN_EVERY: Duration = Duration::from_millis(5);

/// The trace files this process's pools are writing, by [`key_of`] (none
/// for a file that is no regular file, such as `/dev/null`, which any
/// number of pools may write), and their tracers, for [`finish_all`] at
/// exit.
static OPEN: Mutex<Vec<(Option<FileKey>, Weak<Tracer>)>> = Mutex::new(Vec::new());

/// A file's device and inode (see [`key_of`]).
type FileKey = (u64, u64);

/// Registers [`finish_all`] with `atexit` once.
static AT_EXIT: Once = Once::new();

/// Most numbered paths a lenient start tries (`PATH.2` and on).
const MAX_SUFFIX: usize = 1000;

/// Which file, with metadata `m`, a trace writes among the process's
/// trace files: its device and inode, so that every name of one file (a
/// symbolic or hard link, a relative path) is one key; `None` for
/// something that is no regular file (any number of pools may write it,
/// as `/dev/null`).
fn key_of(m: &std::fs::Metadata) -> Option<FileKey> {
    use std::os::unix::fs::MetadataExt;
    m.is_file().then(|| (m.dev(), m.ino()))
}

/// Finishes every trace still open: at process exit, for pools that never
/// close (the global pool, a leaked one), so that their files end with
/// their outstanding buffers and an end record.
extern "C" fn finish_all() {
    let open: Vec<Arc<Tracer>> = lock(&OPEN)
        .iter()
        .filter_map(|(_, tracer)| tracer.upgrade())
        .collect();
    for tracer in open {
        tracer.finish();
    }
}

/// A trace being written; see the module docs.
#[derive(Debug)]
pub(crate) struct Tracer {
    clock: Arc<Clock>,
    /// The pool's class lengths, by index (the rings' compact takes name
    /// a class).
    sizes: Arc<[u64]>,
    /// The orphan cache's takes and drops and the pool's own events.
    shared: Arc<Ring>,
    /// Every thread cache's ring.
    rings: Mutex<Vec<Arc<Ring>>>,
    file: Mutex<FileState>,
    stop: AtomicBool,
    /// The background thread, then the clock's.
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// What the background thread keeps between drains.
#[derive(Debug)]
struct FileState {
    out: BufWriter<File>,
    path: PathBuf,
    /// Records written.
    records: u64,
    /// Records lost.
    lost: u64,
    /// Buffers taken and not dropped (see [`Live`]).
    live: Live,
    /// Set at the first write that fails: nothing more is written.
    failed: bool,
    finished: bool,
    /// Reused between drains.
    batch: Vec<[u64; 6]>,
}

impl Tracer {
    /// Creates the file at `path`, writes `header` (to which the clock is
    /// added) and starts the background thread, for a pool whose classes
    /// have the lengths `sizes`; returns the tracer and the path it
    /// writes. A file another pool of this process is writing is an error
    /// (`AlreadyExists`), or when `lenient`, the first of `PATH.2`,
    /// `PATH.3`, ... that none is writing, with a warning.
    pub(crate) fn start(
        path: &Path,
        mut header: Header,
        sizes: Arc<[u64]>,
        lenient: bool,
    ) -> std::io::Result<(Arc<Self>, PathBuf)> {
        // Held until the file is registered: two pools starting at once
        // cannot both take one path.
        let mut open = lock(&OPEN);
        open.retain(|(_, tracer)| tracer.strong_count() > 0);
        let taken = |key: &Option<FileKey>| key.is_some() && open.iter().any(|(k, _)| k == key);
        // Opened before it is truncated, so that the file checked is the
        // one written, whatever its path names meanwhile.
        let unshared = |path: &Path| -> std::io::Result<Option<(File, Option<FileKey>)>> {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)?;
            let key = key_of(&file.metadata()?);
            if taken(&key) {
                return Ok(None);
            }
            if key.is_some() {
                file.set_len(0)?;
            }
            Ok(Some((file, key)))
        };
        let mut path = path.to_path_buf();
        let (file, key) = match unshared(&path)? {
            Some(opened) => opened,
            None if !lenient => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "another pool of this process is writing a trace to this file",
                ));
            }
            None => {
                let mut free = None;
                for n in 2..=MAX_SUFFIX {
                    let mut name = path.clone().into_os_string();
                    name.push(format!(".{n}"));
                    let candidate = PathBuf::from(name);
                    if let Some(opened) = unshared(&candidate)? {
                        free = Some((candidate, opened));
                        break;
                    }
                }
                let Some((free, opened)) = free else {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        "other pools of this process are writing traces to this file and its numbered siblings",
                    ));
                };
                tracing::warn!(path = %path.display(), instead = %free.display(),
                    "pinpool: another pool of this process is writing this trace file");
                eprintln!(
                    "pinpool: another pool of this process is writing the trace {}; this one writes {}",
                    path.display(),
                    free.display()
                );
                path = free;
                opened
            }
        };
        let clock = Arc::new(Clock::new());
        header
            .entries
            .push(("clock".into(), format!("tick-{}ms", TICK.as_millis())));
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&format::preamble(format::VERSION, &header))?;
        out.flush()?;
        let tracer = Arc::new(Self {
            shared: Arc::new(Ring::new(
                SHARED_SLOTS,
                Arc::clone(&clock),
                Arc::clone(&sizes),
                true,
            )),
            clock,
            sizes,
            rings: Mutex::new(Vec::new()),
            file: Mutex::new(FileState {
                out,
                path: path.clone(),
                records: 0,
                lost: 0,
                live: Live::default(),
                failed: false,
                finished: false,
                batch: Vec::new(),
            }),
            stop: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
        });
        let background = Arc::clone(&tracer);
        let drainer = std::thread::Builder::new()
            .name("pinpool-trace".into())
            .spawn(move || {
                // Relaxed: the flag only ends the loop; `finish` drains
                // again after joining.
                while !background.stop.load(Ordering::Relaxed) {
                    std::thread::park_timeout(DRAIN_EVERY);
                    background.drain();
                }
            })?;
        lock(&tracer.threads).push(drainer);
        let ticking = Arc::clone(&tracer);
        let ticker = std::thread::Builder::new()
            .name("pinpool-trace-clock".into())
            .spawn(move || {
                // Relaxed: as above.
                while !ticking.stop.load(Ordering::Relaxed) {
                    std::thread::park_timeout(TICK);
                    ticking.clock.advance();
                }
            });
        match ticker {
            Ok(ticker) => lock(&tracer.threads).push(ticker),
            Err(e) => {
                tracer.stop_threads();
                return Err(e);
            }
        }
        open.push((key, Arc::downgrade(&tracer)));
        drop(open);
        AT_EXIT.call_once(|| {
            // SAFETY: `finish_all` is an `extern "C" fn()`, as `atexit`
            // takes: it locks, writes and reports failures on standard
            // error, and a panic there (standard error closed) aborts the
            // process rather than unwinding into the caller of the exit
            // handlers. A failed registration leaves traces unfinished at
            // exit.
            let _ = unsafe { libc::atexit(finish_all) };
        });
        Ok((tracer, path))
    }

    /// A ring for a new thread cache.
    pub(crate) fn ring(&self) -> Arc<Ring> {
        let ring = Arc::new(Ring::new(
            THREAD_SLOTS,
            Arc::clone(&self.clock),
            Arc::clone(&self.sizes),
            false,
        ));
        lock(&self.rings).push(Arc::clone(&ring));
        ring
    }

    /// The shared ring (several writers, under its lock).
    pub(crate) fn shared_ring(&self) -> Arc<Ring> {
        Arc::clone(&self.shared)
    }

    /// Records one of the pool's own events (kind, flags, device, buffer
    /// address, `a`, `b`; see the format).
    pub(crate) fn event(&self, kind: u8, flags: u8, device: usize, id: u64, a: u64, b: u64) {
        self.shared
            .push(format::head(kind, flags, device as u16), 0, id, a, b);
    }

    /// Stops the background thread and the clock's, and waits for them.
    fn stop_threads(&self) {
        self.stop.store(true, Ordering::Relaxed);
        let threads = std::mem::take(&mut *lock(&self.threads));
        for handle in threads {
            handle.thread().unpark();
            let _ = handle.join();
        }
    }

    /// Writes what the rings hold to the file.
    fn drain(&self) {
        let mut file = lock(&self.file);
        if file.finished {
            return;
        }
        self.drain_locked(&mut file);
    }

    fn drain_locked(&self, file: &mut FileState) {
        let now_ticks = self.clock.now();
        let mut batch = std::mem::take(&mut file.batch);
        // The shared ring's records are bounded first, then the threads'
        // own rings drained, then the shared ring up to that bound: a
        // record in the shared ring is drained no earlier than its
        // writer's earlier records in its own ring (the bound's Acquire
        // makes them, and their ring, visible), and within a batch after
        // them (the sort below is stable), so a drop a thread makes
        // through the shared ring during its teardown follows its take.
        // (The other way round is not kept across batches, and need not
        // be: once a thread's teardown has passed its guard, and it
        // writes the shared ring, it never writes its own again.)
        let shared_head = self.shared.published();
        let rings: Vec<Arc<Ring>> = lock(&self.rings).clone();
        for (ring, head) in rings
            .iter()
            .map(|r| (r, None))
            .chain(std::iter::once((&self.shared, Some(shared_head))))
        {
            let lost = match head {
                Some(head) => ring.drain_to(&mut batch, head),
                None => ring.drain(&mut batch),
            };
            if lost > 0 {
                file.lost += lost;
                // A thread's own ring names the threads that lost them;
                // the shared ring, which several threads write, names
                // none (0).
                let split = match head {
                    Some(_) => [(0, lost), (0, 0)],
                    None => ring.split_losses(lost),
                };
                for (thread, n) in split.into_iter().filter(|&(_, n)| n > 0) {
                    batch.push([u64::from(LOST), now_ticks, thread, 0, n, 0]);
                }
            }
        }
        for words in &mut batch {
            words[1] = Clock::to_ns(words[1]);
        }
        batch.sort_by_key(|w| w[1]);
        for words in &batch {
            match words[0] as u8 {
                TAKE => file.live.take(*words),
                DROP => file.live.drop(words),
                _ => {}
            }
            file.write(*words);
        }
        file.live.end_batch();
        batch.clear();
        file.batch = batch;
        if !file.failed {
            if let Err(e) = file.out.flush() {
                file.fail(&e);
            }
        }
    }

    /// Stops the background thread and finishes the file: what the rings
    /// still hold, the buffers never dropped, the end record. Later calls
    /// do nothing; records pushed after it are not written.
    pub(crate) fn finish(&self) {
        self.stop_threads();
        let mut file = lock(&self.file);
        if file.finished {
            return;
        }
        self.drain_locked(&mut file);
        let now = Clock::to_ns(self.clock.elapsed());
        for take in file.live.outstanding() {
            let device = (take[0] >> 16) as u16;
            let words = [
                format::head(OUTSTANDING, 0, device),
                take[1],
                take[2],
                take[3],
                take[4],
                take[5],
            ];
            file.write(words);
        }
        let end = Record::End {
            time_ns: now,
            records: file.records,
            lost: file.lost,
        };
        debug_assert_eq!(end.to_words()[0] as u8, END);
        file.write(end.to_words());
        if !file.failed {
            if let Err(e) = file.out.flush() {
                file.fail(&e);
            }
        }
        file.finished = true;
        drop(file);
        // The file is whole: another pool may write it now.
        lock(&OPEN).retain(|(_, t)| !std::ptr::eq(t.as_ptr(), self));
    }
}

/// The takes not dropped, as the file's records show them: by address,
/// the takes not yet closed (their words: time, thread, device, asked,
/// length), each with whether a later take of the address superseded it.
///
/// Several takes of one address may be open at once: records of one
/// millisecond are ordered by their rings, not by when they were written,
/// so another thread's take of a buffer may come before the take and drop
/// that freed it, and a drop by another thread than the taker's may come
/// after the taker's next take of the address. A drop closes its taker's
/// earliest take (the drop record names the taker; one thread's takes of
/// an address follow each other) at or before its time. A take of an
/// address supersedes its takes from earlier milliseconds (one address is
/// not held twice at once: they were dropped, their drops still to come
/// or lost to a full ring); a superseded take is never reported, and goes
/// at its drop or at the next take of the address. A drop whose take was
/// lost closes nothing. A drop by another thread than the taker's can be
/// read a batch before its take (the background thread reads the rings
/// one after the other): such a drop that closes nothing waits, through
/// the next batch, for a take of its taker at or before its time, which
/// it then closes (a drop by the taker itself never waits: its take
/// cannot come after it). So a buffer held at the close is reported whatever
/// records were lost before its take; one whose own drop was lost, and
/// whose address no later take reused, is reported too (the file's lost
/// count says when that can be).
#[derive(Debug, Default)]
struct Live {
    /// By address, the takes open and whether each is superseded.
    open: HashMap<u64, Vec<([u64; 6], bool)>>,
    /// Drops that closed nothing, and the batch they were read in.
    waiting: Vec<([u64; 6], u64)>,
    /// Batches written.
    batch: u64,
}

impl Live {
    fn take(&mut self, words: [u64; 6]) {
        // A drop of this take read before it (see above).
        let waiting = &mut self.waiting;
        if let Some(i) = waiting
            .iter()
            .position(|(d, _)| d[3] == words[3] && d[5] == words[2] && words[1] <= d[1])
        {
            waiting.swap_remove(i);
            return;
        }
        let open = self.open.entry(words[3]).or_default();
        // Superseded at an earlier take: their drops had a millisecond.
        open.retain(|(_, superseded)| !superseded);
        for (take, superseded) in open.iter_mut() {
            *superseded = take[1] < words[1];
        }
        open.push((words, false));
    }

    fn drop(&mut self, words: &[u64; 6]) {
        let (time, taker) = (words[1], words[5]);
        let closed = self.open.get_mut(&words[3]).and_then(|open| {
            let i = open
                .iter()
                .position(|(t, _)| t[2] == taker && t[1] <= time)?;
            open.remove(i);
            Some(open.is_empty())
        });
        match closed {
            Some(true) => {
                self.open.remove(&words[3]);
            }
            Some(false) => {}
            // Only a drop by another thread than the taker's can be read
            // before its take; the taker's own records keep their order,
            // so a drop of its own that closes nothing had its take lost.
            None if words[2] != taker => self.waiting.push((*words, self.batch)),
            None => {}
        }
    }

    /// A batch is written: drops that waited through a whole batch more
    /// for their take stop waiting (their takes were lost).
    fn end_batch(&mut self) {
        let batch = self.batch;
        self.waiting.retain(|&(_, since)| since == batch);
        self.batch += 1;
    }

    /// The takes open and not superseded, in time order.
    fn outstanding(&self) -> Vec<[u64; 6]> {
        let mut live: Vec<[u64; 6]> = self
            .open
            .values()
            .flatten()
            .filter(|(_, superseded)| !superseded)
            .map(|(take, _)| *take)
            .collect();
        live.sort_by_key(|w| (w[1], w[3]));
        live
    }
}

impl FileState {
    fn write(&mut self, words: [u64; 6]) {
        if self.failed {
            return;
        }
        match self.out.write_all(&format::words_to_bytes(words)) {
            Ok(()) => self.records += 1,
            Err(e) => self.fail(&e),
        }
    }

    fn fail(&mut self, e: &std::io::Error) {
        self.failed = true;
        tracing::warn!(path = %self.path.display(), error = %e,
            "pinpool: could not write the trace; tracing stops");
        eprintln!(
            "pinpool: could not write the trace {}: {e}; tracing stops",
            self.path.display()
        );
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Record, Trace};

    /// One thread takes through its own ring and drops through the shared
    /// ring (as a thread being torn down does) while the background
    /// thread drains: in the file, every drop follows its take, whichever
    /// ring the drain read first.
    #[test]
    fn a_drop_through_the_shared_ring_never_precedes_its_take() {
        let path =
            std::env::temp_dir().join(format!("pinpool-writer-order-{}.trace", std::process::id()));
        let (tracer, path) =
            Tracer::start(&path, Header { entries: vec![] }, Arc::from([]), false).unwrap();
        let own = tracer.ring();
        let shared = tracer.shared_ring();
        const N: u64 = 200_000;
        let writer = std::thread::spawn(move || {
            for id in 1..=N {
                own.push(format::head(TAKE, 0, 0), 7, id, 4096, 4096);
                shared.push(format::head(DROP, 0, 0), 7, id, 0, 7);
                if id % 256 == 0 {
                    // Let the drain catch up: nothing is lost.
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
        while !writer.is_finished() {
            tracer.drain();
        }
        writer.join().unwrap();
        tracer.finish();
        let trace = Trace::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        // A drain starved of its core (a loaded machine) may let a ring
        // fill, and records be lost, counted: the order of the rest is
        // what this checks.
        let Some(&Record::End { lost, .. }) = trace.records.last() else {
            panic!("no end record: {:?}", trace.records.last());
        };
        let position: std::collections::HashMap<u64, usize> = trace
            .records
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match *r {
                Record::Take { id, .. } => Some((id, i)),
                _ => None,
            })
            .collect();
        let mut drops = 0;
        for (i, r) in trace.records.iter().enumerate() {
            if let Record::Drop { id, .. } = *r {
                match position.get(&id) {
                    Some(&at) => assert!(at < i, "a drop before its take: {r:?}"),
                    None => assert!(lost > 0, "a drop without its take, nothing lost: {r:?}"),
                }
                drops += 1;
            }
        }
        // Every drop is in the file or counted lost.
        assert!(
            drops <= N && drops + lost >= N,
            "{drops} drops, {lost} records lost"
        );
    }

    /// A take's words: at `ms`, by `thread`, of the buffer at `id`.
    fn take(ms: u64, thread: u64, id: u64, asked: u64) -> [u64; 6] {
        [
            format::head(TAKE, 0, 0),
            ms * 1_000_000,
            thread,
            id,
            asked,
            4096,
        ]
    }

    /// A drop's words: at `ms`, of the buffer at `id` that `taker` took,
    /// by `taker`.
    fn drop_of(ms: u64, id: u64, taker: u64) -> [u64; 6] {
        remote_drop_of(ms, id, taker, taker)
    }

    /// As [`drop_of`], by thread `by`.
    fn remote_drop_of(ms: u64, id: u64, taker: u64, by: u64) -> [u64; 6] {
        [format::head(DROP, 0, 0), ms * 1_000_000, by, id, 0, taker]
    }

    fn held(live: &Live) -> Vec<(u64, u64, u64)> {
        live.outstanding()
            .iter()
            .map(|w| (w[2], w[3], w[4]))
            .collect()
    }

    /// Within one millisecond, B's take of an address can sort before the
    /// take and drop by A that freed it: the drop closes A's take, and B's
    /// is the one held.
    #[test]
    fn a_drop_closes_its_takers_take_whatever_the_order_within_a_tick() {
        let mut live = Live::default();
        live.take(take(5, 2, 0x1000, 4097));
        live.take(take(5, 1, 0x1000, 5000));
        live.drop(&drop_of(5, 0x1000, 1));
        assert_eq!(held(&live), vec![(2, 0x1000, 4097)]);
    }

    /// A lost take leaves its drop with nothing to close: a later take of
    /// the address, never dropped, is still reported.
    #[test]
    fn a_drop_whose_take_was_lost_closes_nothing() {
        let mut live = Live::default();
        live.drop(&drop_of(3, 0x2000, 1));
        live.take(take(4, 1, 0x2000, 10));
        live.drop(&drop_of(4, 0x2000, 1));
        live.take(take(6, 1, 0x2000, 20));
        assert_eq!(held(&live), vec![(1, 0x2000, 20)]);
    }

    /// A lost drop leaves its take open until the address is taken again
    /// at a later millisecond: that take closes it.
    #[test]
    fn a_take_of_an_address_closes_its_earlier_takes() {
        let mut live = Live::default();
        live.take(take(1, 1, 0x3000, 10));
        live.take(take(2, 2, 0x3000, 20));
        live.take(take(2, 3, 0x4000, 30));
        live.drop(&drop_of(3, 0x3000, 2));
        assert_eq!(held(&live), vec![(3, 0x4000, 30)]);
    }

    /// A drop never closes a take later than itself (a take of the
    /// address by the same thread after a drop read in a later batch).
    #[test]
    fn a_drop_never_closes_a_later_take() {
        let mut live = Live::default();
        live.take(take(7, 1, 0x5000, 10));
        live.drop(&drop_of(6, 0x5000, 1));
        assert_eq!(held(&live), vec![(1, 0x5000, 10)]);
    }

    /// A thread takes an address, another drops it (its record read after
    /// the taker's ring), and the taker takes it again and holds it, all
    /// in one millisecond: the drop closes the first take.
    #[test]
    fn a_remote_drop_after_its_takers_next_take_in_one_tick_closes_the_first() {
        let mut live = Live::default();
        live.take(take(5, 1, 0x6000, 5000));
        live.take(take(5, 1, 0x6000, 4097));
        live.drop(&drop_of(5, 0x6000, 1));
        assert_eq!(held(&live), vec![(1, 0x6000, 4097)]);
    }

    /// As above, the next take a millisecond later: it supersedes the
    /// first take, which the drop then closes.
    #[test]
    fn a_remote_drop_after_its_takers_next_take_a_tick_later_closes_the_first() {
        let mut live = Live::default();
        live.take(take(5, 1, 0x7000, 5000));
        live.take(take(6, 1, 0x7000, 4097));
        live.drop(&drop_of(6, 0x7000, 1));
        assert_eq!(held(&live), vec![(1, 0x7000, 4097)]);
        // A superseded take whose drop was lost goes at the next take.
        live.take(take(8, 2, 0x7000, 10));
        assert_eq!(live.open[&0x7000].len(), 2);
        live.take(take(9, 2, 0x7000, 20));
        assert_eq!(live.open[&0x7000].len(), 2);
        assert_eq!(held(&live), vec![(2, 0x7000, 20)]);
    }

    /// A remote drop read a batch before its take (the background thread
    /// read the dropper's ring first): the take, read next, is closed by
    /// it; a drop whose take never comes stops waiting after a batch.
    #[test]
    fn a_drop_read_a_batch_before_its_take_closes_it() {
        let mut live = Live::default();
        live.drop(&remote_drop_of(5, 0x8000, 1, 3));
        live.end_batch();
        live.take(take(5, 1, 0x8000, 5000));
        live.take(take(5, 1, 0x8000, 4097));
        live.end_batch();
        assert_eq!(held(&live), vec![(1, 0x8000, 4097)]);
        live.drop(&remote_drop_of(7, 0x9000, 2, 3));
        live.end_batch();
        live.end_batch();
        live.take(take(6, 2, 0x9000, 10));
        assert_eq!(held(&live), vec![(1, 0x8000, 4097), (2, 0x9000, 10)]);
    }

    /// A drop by the thread that took the buffer, whose take was lost (a
    /// full ring), closes nothing and waits for nothing: that thread's
    /// records keep their order, so its take cannot come later. Its next
    /// take of the address in the same millisecond, read in the next
    /// batch and held, is reported (the waiting drop closed it, and a
    /// buffer held at the close went unreported under heavy losses).
    #[test]
    fn a_drop_by_its_taker_whose_take_was_lost_waits_for_nothing() {
        let mut live = Live::default();
        live.drop(&drop_of(5, 0xa000, 1));
        live.end_batch();
        live.take(take(5, 1, 0xa000, 4000));
        live.end_batch();
        assert_eq!(held(&live), vec![(1, 0xa000, 4000)]);
    }
}
