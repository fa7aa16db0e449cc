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

/// The trace files this process's pools are writing, by [`file_key`]
/// (none for a path that names no regular file, such as `/dev/null`,
/// which any number of pools may write), and their tracers, for
/// [`finish_all`] at exit.
static OPEN: Mutex<Vec<(Option<PathBuf>, Weak<Tracer>)>> = Mutex::new(Vec::new());

/// Registers [`finish_all`] with `atexit` once.
static AT_EXIT: Once = Once::new();

/// Most numbered paths a lenient start tries (`PATH.2` and on).
const MAX_SUFFIX: usize = 1000;

/// What names the file `path` among the process's trace files: its
/// directory made absolute and its name; `None` for a path to something
/// that exists and is no regular file (any number of pools may write it).
fn file_key(path: &Path) -> Option<PathBuf> {
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        return None;
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    Some(match path.file_name() {
        Some(name) => dir.join(name),
        None => dir,
    })
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
    /// Buffers taken and not dropped: by address, takes minus drops and
    /// the last take's words.
    live: HashMap<u64, (i64, [u64; 6])>,
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
        let taken = |key: &Option<PathBuf>| key.is_some() && open.iter().any(|(k, _)| k == key);
        let mut path = path.to_path_buf();
        let mut key = file_key(&path);
        if taken(&key) {
            if !lenient {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "another pool of this process is writing a trace to this file",
                ));
            }
            let free = (2..=MAX_SUFFIX).find_map(|n| {
                let mut name = path.clone().into_os_string();
                name.push(format!(".{n}"));
                let candidate = PathBuf::from(name);
                let candidate_key = file_key(&candidate);
                (!taken(&candidate_key)).then_some((candidate, candidate_key))
            });
            let Some((free, free_key)) = free else {
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
            (path, key) = (free, free_key);
        }
        let clock = Arc::new(Clock::new());
        header
            .entries
            .push(("clock".into(), format!("tick-{}ms", TICK.as_millis())));
        let mut out = BufWriter::with_capacity(1 << 20, File::create(&path)?);
        out.write_all(&format::preamble(&header))?;
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
                live: HashMap::new(),
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
            let from = batch.len();
            let lost = match head {
                Some(head) => ring.drain_to(&mut batch, head),
                None => ring.drain(&mut batch),
            };
            if lost > 0 {
                let thread = batch[from..].last().map_or(0, |w| w[2]);
                file.lost += lost;
                batch.push([u64::from(LOST), now_ticks, thread, 0, lost, 0]);
            }
        }
        for words in &mut batch {
            words[1] = Clock::to_ns(words[1]);
        }
        batch.sort_by_key(|w| w[1]);
        for words in &batch {
            match words[0] as u8 {
                TAKE => {
                    let entry = file.live.entry(words[3]).or_insert((0, *words));
                    entry.0 += 1;
                    entry.1 = *words;
                }
                DROP => {
                    let entry = file.live.entry(words[3]).or_insert((0, *words));
                    entry.0 -= 1;
                    if entry.0 == 0 {
                        file.live.remove(&words[3]);
                    }
                }
                _ => {}
            }
            file.write(*words);
        }
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
        let mut live: Vec<[u64; 6]> = file
            .live
            .values()
            .filter(|(count, _)| *count > 0)
            .map(|(_, take)| *take)
            .collect();
        live.sort_by_key(|w| w[1]);
        for take in live {
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
}
