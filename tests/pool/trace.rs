//! Traces: a traced pool writes every take and drop (cross-thread drops
//! naming both threads), its own events, the buffers never dropped and an
//! end record; the file reads back into the same bytes; a truncated,
//! corrupt or wrong-version file is an error with its byte offset, never
//! a panic; a path that cannot be written fails a strict build and leaves
//! a lenient one untraced.

use std::path::PathBuf;

use pinpool::trace::{Reader, Record, Source, Trace};
use pinpool::{BackendKind, Error, Pool};

use crate::common::in_child;

/// A fresh path in the temporary directory, removed when dropped.
struct TempPath(PathBuf);

impl TempPath {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "pinpool-test-{}-{name}-{:?}.trace",
            std::process::id(),
            std::thread::current().id()
        ));
        Self(path)
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A traced host pool without thread caches: a buffer dropped goes to the
/// shard at once, where any thread's next take finds it.
fn without_caches(path: &TempPath) -> Pool {
    Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(1)
        .thread_cache_bytes(0)
        .regions(false)
        .trace(&path.0)
        .build()
        .unwrap()
}

fn traced(path: &TempPath) -> Pool {
    Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(1)
        .trace(&path.0)
        .build()
        .expect("a traced pool")
}

fn takes(trace: &Trace) -> Vec<Record> {
    trace
        .records
        .iter()
        .filter(|r| matches!(r, Record::Take { .. }))
        .copied()
        .collect()
}

fn drops(trace: &Trace) -> Vec<Record> {
    trace
        .records
        .iter()
        .filter(|r| matches!(r, Record::Drop { .. }))
        .copied()
        .collect()
}

#[test]
fn takes_drops_and_the_buffers_never_dropped_are_recorded() {
    let path = TempPath::new("records");
    let pool = traced(&path);
    let mut first = pool.take(5000);
    first[..10].fill(1);
    first.set_dirty_len(10);
    let first_addr = first.as_ptr() as u64;
    let first_len = first.len() as u64;
    drop(first);
    // Reused by the same thread: its deferred buffer, re-zeroed.
    let again = pool.take(5000);
    assert_eq!(again.as_ptr() as u64, first_addr);
    // Dropped on another thread.
    let moved = pool.take(1 << 20);
    let moved_addr = moved.as_ptr() as u64;
    std::thread::spawn(move || drop(moved)).join().unwrap();
    // Still out when the pool closes.
    let kept = pool.take(100);
    let kept_addr = kept.as_ptr() as u64;
    pool.flush();
    drop(again);
    drop(pool);
    let trace = Trace::read(&path.0).expect("the trace reads");
    drop(kept);

    let takes = takes(&trace);
    assert_eq!(takes.len(), 4, "{:#?}", trace.records);
    let Record::Take {
        thread: me,
        asked,
        len,
        source,
        id,
        ..
    } = takes[0]
    else {
        unreachable!()
    };
    assert_eq!(
        (asked, len, id, source),
        (5000, first_len, first_addr, Source::Miss)
    );
    assert!(
        matches!(takes[1], Record::Take { source: Source::Deferred, id, thread, .. } if id == first_addr && thread == me)
    );
    let drops = drops(&trace);
    assert_eq!(drops.len(), 3, "{drops:#?}");
    assert!(matches!(
        drops[0],
        Record::Drop { dirty: 10, remote: false, copy_recorded: false, thread, .. } if thread == me
    ));
    let remote = drops
        .iter()
        .find(|d| matches!(d, Record::Drop { id, .. } if *id == moved_addr))
        .expect("the other thread's drop");
    assert!(
        matches!(*remote, Record::Drop { remote: true, taker, thread, dirty, .. }
            if taker == me && thread != me && dirty == 1 << 20),
        "{remote:?}"
    );
    let outstanding: Vec<_> = trace
        .records
        .iter()
        .filter(|r| matches!(r, Record::Outstanding { .. }))
        .collect();
    assert!(
        matches!(outstanding[..], [Record::Outstanding { id, asked: 100, thread, .. }] if *id == kept_addr && *thread == me),
        "{outstanding:?}"
    );
    assert!(trace
        .records
        .iter()
        .any(|r| matches!(r, Record::Flush { .. })));
    assert!(matches!(
        trace.records.last(),
        Some(Record::End { lost: 0, .. })
    ));
    // Times are in order within the batches, and all before the end.
    let end = trace.records.last().unwrap().time_ns();
    assert!(trace.records.iter().all(|r| r.time_ns() <= end));
}

#[test]
fn the_header_names_the_settings_and_the_machine() {
    let path = TempPath::new("header");
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .max_pooled_bytes(3 << 30)
        .borrow_slack(20)
        .trace(&path.0)
        .build()
        .unwrap();
    drop(pool);
    let trace = Trace::read(&path.0).unwrap();
    let h = &trace.header;
    assert_eq!(h.get("backend"), Some("host"));
    assert_eq!(h.get("devices"), Some("1"));
    assert_eq!(h.get("clock"), Some("tick-1ms"));
    assert!(h.get("cores").unwrap().parse::<usize>().unwrap() >= 1);
    // The machine: its processor and its memory, as the system names them.
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
    if let Some(model) = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')))
    {
        assert_eq!(h.get("cpu"), Some(model.1.trim()));
    }
    let memory: u64 = h.get("memory_bytes").unwrap().parse().unwrap();
    assert!(memory >= 1 << 20, "{memory}");
    assert_eq!(h.get("setting.max_pooled_bytes"), Some("3221225472"));
    // The settings build the same pool again.
    let again = Pool::builder()
        .try_conf(&h.conf())
        .unwrap()
        .build()
        .unwrap();
    let mut want = pinpool::Config::default();
    want.backend = BackendKind::Host;
    let config = again.config();
    assert_eq!(config.max_pooled_bytes, Some(3 << 30));
    assert_eq!(config.borrow_slack, 20);
    assert_eq!(config.backend, BackendKind::Host);
    assert_eq!(config.idle_trim, want.idle_trim);
}

#[test]
fn the_file_reads_back_into_its_own_bytes() {
    let path = TempPath::new("bytes");
    let pool = traced(&path);
    for size in [1, 4096, 70_000, 3 << 20] {
        drop(pool.take(size));
    }
    drop(pool);
    let bytes = std::fs::read(&path.0).unwrap();
    let trace = Trace::from_reader(&bytes[..]).unwrap();
    assert_eq!(trace.to_bytes(), bytes);
    assert_eq!(takes(&trace).len(), 4);
}

#[test]
fn bad_files_are_errors_with_their_offsets() {
    let path = TempPath::new("bad");
    let pool = traced(&path);
    drop(pool.take(4096));
    drop(pool);
    let good = std::fs::read(&path.0).unwrap();
    let header_len = u32::from_le_bytes(good[12..16].try_into().unwrap()) as usize;
    let records_at = 16 + header_len;
    // Cut anywhere: an error at or before the cut, never a panic.
    for cut in 0..good.len() {
        let err = Trace::from_reader(&good[..cut]).expect_err("a cut file");
        assert!(err.offset <= cut as u64, "cut {cut}: {err}");
    }
    let err = Trace::from_reader(&good[..records_at + 50]).unwrap_err();
    assert_eq!(err.offset, (records_at + 48) as u64);
    assert!(err.to_string().contains("truncated record"), "{err}");
    let err = Trace::from_reader(&good[..good.len() - 48]).unwrap_err();
    assert!(err.to_string().contains("without an end record"), "{err}");

    let corrupt = |at: usize, byte: u8| {
        let mut bad = good.clone();
        bad[at] = byte;
        Trace::from_reader(&bad[..]).unwrap_err()
    };
    assert_eq!(corrupt(0, b'X').offset, 0);
    let err = corrupt(8, 7);
    assert_eq!(err.offset, 8);
    assert!(err.to_string().contains("version 7"), "{err}");
    assert_eq!(corrupt(15, 0x7f).offset, 12, "a header over 1 MiB");
    let err = corrupt(records_at, 200);
    assert_eq!(err.offset, records_at as u64);
    assert!(err.to_string().contains("unknown record kind 200"), "{err}");
    let err = corrupt(records_at + 5, 1);
    assert!(err.to_string().contains("reserved"), "{err}");
    // A take whose source is not one of the seven.
    let take_at = (records_at..good.len())
        .step_by(48)
        .find(|&at| good[at] == 1)
        .unwrap();
    let err = corrupt(take_at + 1, 9);
    assert_eq!(err.offset, take_at as u64);
    // Data after the end record, and an end record miscounting.
    let mut longer = good.clone();
    longer.push(0);
    let err = Trace::from_reader(&longer[..]).unwrap_err();
    assert_eq!(err.offset, good.len() as u64);
    let end_at = good.len() - 48;
    let err = corrupt(end_at + 32, 99);
    assert_eq!(err.offset, end_at as u64);
    // A header line without `=`.
    let mut bad = good.clone();
    let eq = 16 + bad[16..].iter().position(|&b| b == b'=').unwrap();
    bad[eq] = b':';
    let err = Trace::from_reader(&bad[..]).unwrap_err();
    assert_eq!(err.offset, 16);
    // The streaming reader yields the good records, then the error.
    let mut reader = Reader::new(&good[..good.len() - 48]).unwrap();
    let mut seen = 0;
    let last = loop {
        match reader.next().expect("an error ends it") {
            Ok(_) => seen += 1,
            Err(e) => break e,
        }
    };
    assert!(seen >= 2);
    assert_eq!(last.offset, end_at as u64);
    assert!(reader.next().is_none());
}

#[test]
fn records_past_a_full_buffer_are_counted_as_lost() {
    let path = TempPath::new("lost");
    let pool = traced(&path);
    const N: u64 = 200_000;
    for _ in 0..N {
        drop(pool.take(4096));
    }
    drop(pool);
    let trace = Trace::read(&path.0).unwrap();
    let recorded = (takes(&trace).len() + drops(&trace).len()) as u64;
    let lost: u64 = trace
        .records
        .iter()
        .map(|r| match r {
            Record::Lost { records, .. } => *records,
            _ => 0,
        })
        .sum();
    let Some(Record::End { lost: total, .. }) = trace.records.last() else {
        panic!("no end")
    };
    assert_eq!(lost, *total);
    assert_eq!(recorded + lost, 2 * N);
    // Each loss names the thread whose buffer was full: the one taking.
    let Some(&Record::Take { thread, .. }) = takes(&trace).first() else {
        panic!("no take")
    };
    for r in &trace.records {
        if let Record::Lost { thread: t, .. } = *r {
            assert_eq!(t, thread, "{r}");
        }
    }
}

#[test]
fn an_unwritable_path_fails_a_strict_build_and_a_lenient_one_runs_untraced() {
    let dir = std::env::temp_dir().join(format!("pinpool-no-such-dir-{}", std::process::id()));
    let path = dir.join("t.trace");
    match Pool::builder()
        .backend(BackendKind::Host)
        .trace(&path)
        .build()
    {
        Err(Error::Trace { path: p, .. }) => assert_eq!(p, path),
        other => panic!("{other:?}"),
    }
    let strict = Pool::builder()
        .try_conf(&format!("backend=host,trace={}", path.display()))
        .unwrap()
        .build();
    assert!(matches!(strict, Err(Error::Trace { .. })), "{strict:?}");
    assert!(strict
        .unwrap_err()
        .to_string()
        .contains(&*path.to_string_lossy()));
    let lenient = Pool::builder()
        .conf(&format!("backend=host,trace={}", path.display()))
        .build()
        .expect("runs untraced");
    assert_eq!(lenient.config().trace, None);
    drop(lenient.take(1));
    // `trace=off` and an empty value.
    let b = Pool::builder()
        .try_conf("trace=/tmp/x.trace,trace=off")
        .unwrap();
    assert_eq!(b.build().unwrap().config().trace, None);
    assert!(matches!(
        Pool::builder().try_conf("trace="),
        Err(Error::Setting { .. })
    ));
}

#[test]
fn pinpool_trace_in_the_environment_traces() {
    const TEST: &str = "pinpool_trace_in_the_environment_traces";
    let path = std::env::temp_dir().join(format!("pinpool-env-{}.trace", std::process::id()));
    let bad = "/no/such/dir/env.trace";
    let env = [
        ("PINPOOL_TRACE", path.to_str().unwrap()),
        ("PINPOOL_TEST_BAD_TRACE", bad),
    ];
    if let Some(out) = in_child(module_path!(), TEST, &env) {
        let trace = Trace::read(&path).expect("the child traced");
        let _ = std::fs::remove_file(&path);
        assert_eq!(takes(&trace).len(), 1);
        assert!(
            out.contains("cannot write the trace file /no/such/dir/env.trace"),
            "{out}"
        );
        return;
    }
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .from_env()
        .build()
        .unwrap();
    drop(pool.take(64));
    drop(pool);
    std::env::set_var("PINPOOL_TRACE", bad);
    let lenient = Pool::builder()
        .backend(BackendKind::Host)
        .from_env()
        .build()
        .expect("lenient: untraced");
    assert_eq!(lenient.config().trace, None);
    let strict = Pool::builder()
        .backend(BackendKind::Host)
        .try_from_env()
        .unwrap()
        .build();
    assert!(matches!(strict, Err(Error::Trace { .. })));
}

#[cfg(feature = "testing")]
#[test]
fn registrations_are_recorded() {
    let path = TempPath::new("registrations");
    let faults = std::sync::Arc::new(pinpool::testing::Faults::default());
    let pool = Pool::builder()
        .regions(false)
        .faults(faults.clone())
        .cleaner_threads(1)
        .provision(false)
        .trace(&path.0)
        .build()
        .unwrap();
    let buf = pool.take(1 << 20);
    let addr = buf.as_ptr() as u64;
    drop(buf);
    pool.flush();
    faults.fail_register(&[2]);
    drop(pool.take(3 << 20));
    pool.flush();
    drop(pool);
    let trace = Trace::read(&path.0).unwrap();
    let registrations: Vec<_> = trace
        .records
        .iter()
        .filter_map(|r| match *r {
            Record::Register {
                id, bytes, failed, ..
            } => Some((id, bytes, failed)),
            _ => None,
        })
        .collect();
    assert_eq!(
        registrations,
        [(addr, 1 << 20, false), (registrations[1].0, 3 << 20, true)],
        "{:#?}",
        trace.records
    );
    assert!(matches!(
        drops(&trace)[0],
        Record::Drop { pinned: false, .. }
    ));
}

#[test]
fn random_corruption_is_an_error_or_a_trace_never_a_panic() {
    let path = TempPath::new("random");
    let pool = traced(&path);
    for size in [1, 4096, 1 << 20] {
        drop(pool.take(size));
    }
    pool.flush();
    drop(pool);
    let good = std::fs::read(&path.0).unwrap();
    // xorshift: the same mutations every run.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..5000 {
        let mut bad = good.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() % bad.len() as u64) as usize;
            bad[at] = next() as u8;
        }
        let cut = if next() % 4 == 0 {
            (next() % bad.len() as u64) as usize
        } else {
            bad.len()
        };
        if let Err(e) = Trace::from_reader(&bad[..cut]) {
            assert!(e.offset <= cut as u64, "{e}");
        }
    }
}

/// The global pool never closes: its trace is finished when the process
/// exits (the buffers still held as outstanding, then the end record), so
/// `PINPOOL_TRACE=... my-prover` leaves a whole trace.
#[test]
fn a_global_pool_trace_is_finished_when_the_process_exits() {
    const TEST: &str = "a_global_pool_trace_is_finished_when_the_process_exits";
    let path = std::env::temp_dir().join(format!("pinpool-global-{}.trace", std::process::id()));
    let env = [
        ("PINPOOL_TRACE", path.to_str().unwrap()),
        ("PINPOOL_CONF", "backend=host"),
    ];
    if in_child(module_path!(), TEST, &env).is_some() {
        let trace = Trace::read(&path);
        let _ = std::fs::remove_file(&path);
        let trace = trace.expect("a whole trace");
        assert_eq!(takes(&trace).len(), 11);
        let outstanding = trace
            .records
            .iter()
            .filter(|r| matches!(r, Record::Outstanding { .. }))
            .count();
        assert_eq!(outstanding, 1);
        return;
    }
    for _ in 0..10 {
        drop(pinpool::take(4096));
    }
    // Held when the process exits.
    std::mem::forget(pinpool::take(8192));
}

/// Two pools built from the environment in one process (the global pool
/// and one of the program's own, say) write two files, the second's named
/// with a suffix and a warning; a strict pool asked for a file another
/// pool of the process writes fails with its path.
#[test]
fn pools_of_one_process_never_write_one_file() {
    const TEST: &str = "pools_of_one_process_never_write_one_file";
    let path = std::env::temp_dir().join(format!("pinpool-two-{}.trace", std::process::id()));
    let second = PathBuf::from(format!("{}.2", path.display()));
    let env = [("PINPOOL_TRACE", path.to_str().unwrap())];
    if let Some(out) = in_child(module_path!(), TEST, &env) {
        let (a, b) = (Trace::read(&path), Trace::read(&second));
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(&second);
        let (a, b) = (a.expect("the first pool's trace"), b.expect("the second's"));
        assert_eq!(takes(&a).len(), 2);
        // The strict pool that wrote it again after the second closed.
        assert_eq!(takes(&b).len(), 0);
        assert!(out.contains(&second.display().to_string()), "{out}");
        return;
    }
    // The child's path is the parent's, which names the parent's process.
    let path = PathBuf::from(std::env::var_os("PINPOOL_TRACE").unwrap());
    let second = PathBuf::from(format!("{}.2", path.display()));
    let env_pool = || {
        Pool::builder()
            .backend(BackendKind::Host)
            .from_env()
            .build()
            .unwrap()
    };
    let a = env_pool();
    drop(a.take(4096));
    let b = env_pool();
    assert_eq!(b.config().trace.as_deref(), Some(second.as_path()));
    drop(b.take(4096));
    drop(a.take(8192));
    let strict = Pool::builder()
        .backend(BackendKind::Host)
        .trace(&path)
        .build();
    match strict {
        Err(Error::Trace { path: p, source }) => {
            assert_eq!(p, path);
            assert_eq!(source.kind(), std::io::ErrorKind::AlreadyExists);
        }
        other => panic!("{other:?}"),
    }
    drop(b);
    assert_eq!(takes(&Trace::read(&second).unwrap()).len(), 1);
    drop(a);
    // Once a pool has closed its file, another may write it.
    let again = Pool::builder()
        .backend(BackendKind::Host)
        .trace(&second)
        .build();
    assert!(again.is_ok());
}

/// Threads that drop a buffer while their thread-locals are torn down
/// (a thread-local holding it; the drop goes through the orphan cache's
/// shared ring, the take through the thread's own ring, usually in one
/// millisecond): each drop is recorded under its own thread, not as
/// another thread's, and comes after its take in the file and after a
/// stable sort by time.
#[test]
fn a_drop_in_thread_teardown_names_its_thread_and_follows_its_take() {
    use std::cell::RefCell;
    thread_local! {
        static HOLD: RefCell<Option<pinpool::PinnedBuffer>> = const { RefCell::new(None) };
    }
    let path = TempPath::new("teardown");
    let pool = traced(&path);
    for _ in 0..20 {
        let p = pool.clone();
        std::thread::spawn(move || {
            // Registered before the pool's per-thread guard, so destroyed
            // after it.
            HOLD.with(|h| h.borrow_mut().take());
            let buf = p.take(4096);
            HOLD.with(|h| *h.borrow_mut() = Some(buf));
        })
        .join()
        .unwrap();
    }
    drop(pool);
    let trace = Trace::read(&path.0).unwrap();
    assert_eq!(takes(&trace).len(), 20);
    assert_eq!(drops(&trace).len(), 20);
    let mut sorted = trace.records.clone();
    sorted.sort_by_key(|r| r.time_ns());
    for (what, records) in [("file", &trace.records), ("sorted", &sorted)] {
        for (i, r) in records.iter().enumerate() {
            let Record::Drop {
                thread,
                taker,
                id,
                remote,
                ..
            } = *r
            else {
                continue;
            };
            assert!(thread == taker && !remote, "{what}: {r:?}");
            let taken_before = records[..i].iter().any(
                |t| matches!(*t, Record::Take { thread: by, id: of, .. } if by == thread && of == id),
            );
            assert!(taken_before, "{what}: a drop before its own take: {r:?}");
        }
    }
}

/// The header's settings build a pool with the same settings, durations
/// that are no whole number of milliseconds included.
#[test]
fn the_headers_settings_rebuild_the_same_pool() {
    use std::time::Duration;
    for trim in [
        Duration::from_micros(500),
        Duration::from_nanos(1_500_001),
        Duration::from_secs(10 * 365 * 86400),
    ] {
        let path = TempPath::new("trim");
        let pool = Pool::builder()
            .backend(BackendKind::Host)
            .idle_trim(trim)
            .trace(&path.0)
            .build()
            .unwrap();
        let want = pool.config().clone();
        drop(pool);
        let conf = Trace::read(&path.0).unwrap().header.conf();
        let again = Pool::builder()
            .try_conf(&conf)
            .and_then(|b| b.build())
            .unwrap_or_else(|e| panic!("{trim:?}: `{conf}`: {e}"));
        assert_eq!(again.config().idle_trim, want.idle_trim, "`{conf}`");
    }
}

/// A record with a word its kind does not use set (the thread of a
/// registration) is refused, at its offset: every record the reader
/// accepts writes back into the bytes it was read from.
#[test]
fn a_record_with_an_unused_word_set_is_refused() {
    let trace = Trace {
        version: pinpool::trace::VERSION,
        header: pinpool::trace::Header::default(),
        records: vec![Record::End {
            time_ns: 1,
            records: 0,
            lost: 0,
        }],
    };
    let mut bytes = trace.to_bytes();
    let at = bytes.len() - 48;
    // Word 2 (the thread) of the end record.
    bytes[at + 16] = 1;
    let e = Trace::from_reader(&bytes[..]).unwrap_err();
    assert_eq!(e.offset, at as u64, "{e}");
    assert!(e.to_string().contains("does not use"), "{e}");
}

/// A header whose last line lacks its newline, or with an empty line, is
/// refused at that line: a header the reader accepts reads back into its
/// own bytes.
#[test]
fn a_header_that_would_not_read_back_into_its_bytes_is_refused() {
    let header = |text: &str| {
        let mut bytes = pinpool::trace::MAGIC.to_vec();
        bytes.extend_from_slice(&pinpool::trace::VERSION.to_le_bytes());
        bytes.extend_from_slice(&(text.len() as u32).to_le_bytes());
        bytes.extend_from_slice(text.as_bytes());
        Trace::from_reader(&bytes[..])
    };
    assert!(header("a=1\nb=2\n").is_err(), "no end record");
    let e = header("a=1\nb=2").unwrap_err();
    assert_eq!(e.offset, 16 + 4, "{e}");
    assert!(e.to_string().contains("newline"), "{e}");
    let e = header("a=1\n\nb=2\n").unwrap_err();
    assert_eq!(e.offset, 16 + 4, "{e}");
}

/// A thread's cache inherited by a later thread: the later thread's
/// records name it, not the first.
#[test]
fn an_inherited_cache_names_its_new_thread() {
    let path = TempPath::new("inherit");
    let pool = traced(&path);
    for _ in 0..4 {
        let p = pool.clone();
        std::thread::spawn(move || {
            drop(p.take(4096));
            drop(p.take(8192));
        })
        .join()
        .unwrap();
    }
    drop(pool);
    let trace = Trace::read(&path.0).unwrap();
    let t = takes(&trace);
    let d = drops(&trace);
    assert_eq!(t.len(), 8);
    assert_eq!(d.len(), 8);
    let threads: std::collections::BTreeSet<u64> = t
        .iter()
        .map(|r| match r {
            Record::Take { thread, .. } => *thread,
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(threads.len(), 4, "{t:?}");
    for r in &d {
        assert!(
            matches!(r, Record::Drop { thread, taker, remote: false, .. } if thread == taker && threads.contains(thread)),
            "{r:?}"
        );
    }
    // Each thread's records in the file: take, drop, take, drop.
    for th in threads {
        let mine: Vec<&Record> = trace
            .records
            .iter()
            .filter(|r| matches!(r, Record::Take { thread, .. } | Record::Drop { thread, .. } if *thread == th))
            .collect();
        assert!(
            matches!(
                mine[..],
                [
                    Record::Take { .. },
                    Record::Drop { .. },
                    Record::Take { .. },
                    Record::Drop { .. }
                ]
            ),
            "{mine:?}"
        );
    }
}

/// A thread's buffer dropped in its teardown after its cache passed to a
/// new thread: the drop names the thread that took it as its taker (not
/// the cache's new owner), and is not remote.
#[test]
fn a_teardown_drop_after_the_cache_passed_on_names_its_taker() {
    use std::cell::RefCell;
    use std::sync::mpsc;
    struct Hold(Option<(pinpool::PinnedBuffer, mpsc::Sender<()>, mpsc::Receiver<()>)>);
    impl Drop for Hold {
        fn drop(&mut self) {
            if let Some((buf, past_guard, go)) = self.0.take() {
                past_guard.send(()).unwrap();
                go.recv().unwrap();
                drop(buf);
            }
        }
    }
    thread_local! {
        static HOLD: RefCell<Hold> = const { RefCell::new(Hold(None)) };
    }
    let path = TempPath::new("inherit-taker");
    let pool = traced(&path);
    let (past_tx, past_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    let p = pool.clone();
    let first = std::thread::spawn(move || {
        HOLD.with(|h| drop(h.borrow_mut().0.take()));
        let buf = p.take(4096);
        HOLD.with(|h| h.borrow_mut().0 = Some((buf, past_tx, go_rx)));
    });
    past_rx.recv().unwrap();
    let p = pool.clone();
    std::thread::spawn(move || drop(p.take(8192)))
        .join()
        .unwrap();
    go_tx.send(()).unwrap();
    first.join().unwrap();
    drop(pool);
    let trace = Trace::read(&path.0).unwrap();
    let t = takes(&trace);
    let d = drops(&trace);
    let name = |r: &Record| match *r {
        Record::Take { thread, asked, .. } => (thread, asked),
        _ => unreachable!(),
    };
    let first_name = t.iter().map(name).find(|&(_, a)| a == 4096).unwrap().0;
    let second_name = t.iter().map(name).find(|&(_, a)| a == 8192).unwrap().0;
    let teardown_drop = d
        .iter()
        .find(|r| matches!(r, Record::Drop { thread, .. } if *thread == first_name))
        .unwrap();
    assert!(
        matches!(teardown_drop, Record::Drop { taker, remote: false, .. } if *taker == first_name),
        "first {first_name}, second {second_name}: {teardown_drop:?}"
    );
}

/// A take and drop made in a thread's teardown (through the orphan cache,
/// which no thread owns): the drop names that thread as its taker, and is
/// not remote.
#[test]
fn a_take_and_drop_in_teardown_name_one_thread() {
    use std::cell::RefCell;
    struct Hold(Option<Pool>);
    impl Drop for Hold {
        fn drop(&mut self) {
            if let Some(pool) = self.0.take() {
                drop(pool.take(4096));
            }
        }
    }
    thread_local! {
        static HOLD: RefCell<Hold> = const { RefCell::new(Hold(None)) };
    }
    let path = TempPath::new("orphan-taker");
    let pool = traced(&path);
    let p = pool.clone();
    std::thread::spawn(move || {
        HOLD.with(|h| drop(h.borrow_mut().0.take()));
        drop(p.take(8192));
        HOLD.with(|h| h.borrow_mut().0 = Some(p));
    })
    .join()
    .unwrap();
    drop(pool);
    let trace = Trace::read(&path.0).unwrap();
    let d = drops(&trace);
    assert_eq!(d.len(), 2);
    assert!(
        matches!(d[1], Record::Drop { thread, taker, remote: false, .. } if taker == thread),
        "{:?}",
        d[1]
    );
}

/// Takes and drops of every size from a byte to 64 MiB, on devices past
/// the 32 a trace's short records name (64, the most a pool serves), read
/// back as they were made: device, size asked, length handed out, bytes
/// written and the two threads of each.
#[test]
fn every_device_and_size_reads_back_as_taken_and_dropped() {
    let path = TempPath::new("devices");
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .devices(64)
        .cleaner_threads(1)
        .trace(&path.0)
        .build()
        .expect("a traced pool");
    let mut made = Vec::new();
    for (i, device) in [0usize, 1, 31, 32, 33, 63].into_iter().enumerate() {
        for shift in [0u32, 8, 12, 13, 20, 26] {
            let asked = (1usize << shift) + i;
            let mut buf = pool.take_on(device, asked).unwrap();
            let written = asked.min(100 + i);
            buf[..written].fill(1);
            buf.set_dirty_len(written);
            made.push((device, asked, buf.len(), buf.as_ptr() as u64, written));
            if shift == 20 {
                std::thread::spawn(move || drop(buf)).join().unwrap();
            } else {
                drop(buf);
            }
        }
    }
    drop(pool);
    let trace = Trace::read(&path.0).expect("the trace reads");
    let (takes, drops) = (takes(&trace), drops(&trace));
    assert_eq!((takes.len(), drops.len()), (made.len(), made.len()));
    let me = match takes[0] {
        Record::Take { thread, .. } => thread,
        _ => unreachable!(),
    };
    for (n, &(device, asked, len, id, written)) in made.iter().enumerate() {
        let want_take = |r: &Record| {
            matches!(*r, Record::Take { device: d, asked: a, len: l, id: i, thread, .. }
                if (d as usize, a as usize, l as usize, i, thread) == (device, asked, len, id, me))
        };
        assert!(
            want_take(&takes[n]),
            "take {n}: {:?}, made {:?}",
            takes[n],
            made[n]
        );
        let remote = asked >> 20 == 1;
        let want_drop = |r: &Record| {
            matches!(*r, Record::Drop { device: d, dirty, id: i, taker, thread, remote: far, .. }
                if (d as usize, dirty as usize, i, taker, far, thread == me)
                    == (device, written, id, me, remote, !remote))
        };
        assert!(
            drops.iter().any(want_drop),
            "no drop like {:?}: {drops:#?}",
            made[n]
        );
    }
}

/// Sizes at and around every class's edges, from 0 bytes to 8 MiB.
fn edge_sizes(classes: pinpool::SizeClasses) -> Vec<usize> {
    let mut sizes = vec![
        0usize, 1, 2, 3, 7, 8, 9, 127, 128, 129, 255, 256, 257, 511, 512, 513,
    ];
    for k in 10..=23u32 {
        let p = 1usize << k;
        sizes.extend([p - 1, p, p + 1]);
        if matches!(classes, pinpool::SizeClasses::Fine) && k >= 12 {
            for j in 1..8 {
                let s = p + j * (p >> 3);
                sizes.extend([s - 1, s, s + 1]);
            }
        }
    }
    sizes
}

/// Every class edge, both class tables, devices 0, 30, 31, 32, 33: each
/// take (a miss, then the same size again from the thread's own cache),
/// each drop and each buffer left out reads back exactly as made.
#[test]
fn every_class_edge_reads_back_exactly() {
    for classes in [
        pinpool::SizeClasses::Fine,
        pinpool::SizeClasses::PowersOfTwo,
    ] {
        let path = TempPath::new("edges");
        let pool = Pool::builder()
            .backend(BackendKind::Host)
            .devices(40)
            .size_classes(classes)
            .cleaner_threads(1)
            .trace(&path.0)
            .build()
            .expect("a traced pool");
        let (mut made_takes, mut made_drops, mut kept, mut kept_made) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (n, &asked) in edge_sizes(classes).iter().enumerate() {
            let device = [0usize, 30, 31, 32, 33][n % 5];
            for round in 0..3 {
                let mut buf = pool.take_on(device, asked).unwrap();
                let rec = (
                    device as u16,
                    asked as u64,
                    buf.len() as u64,
                    buf.as_ptr() as u64,
                );
                made_takes.push(rec);
                if round == 2 && n % 4 == 0 {
                    kept_made.push(rec);
                    kept.push(buf);
                    continue;
                }
                let written = match round {
                    0 => buf.len(),
                    1 => 0,
                    _ => buf.len() / 3,
                };
                buf[..written].fill(7);
                buf.set_dirty_len(written);
                made_drops.push((device as u16, rec.3, written as u64));
                drop(buf);
            }
        }
        drop(pool);
        let trace = Trace::read(&path.0).expect("the trace reads");
        drop(kept);
        assert!(
            matches!(trace.records.last(), Some(Record::End { lost: 0, .. })),
            "lost: {:?}",
            trace.records.last()
        );
        let got_takes: Vec<_> = takes(&trace)
            .iter()
            .map(|r| match *r {
                Record::Take {
                    device,
                    asked,
                    len,
                    id,
                    ..
                } => (device, asked, len, id),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(got_takes.len(), made_takes.len());
        for (i, (g, m)) in got_takes.iter().zip(&made_takes).enumerate() {
            assert_eq!(g, m, "{classes:?} take {i}");
        }
        let got_drops: Vec<_> = drops(&trace)
            .iter()
            .map(|r| match *r {
                Record::Drop {
                    device,
                    id,
                    dirty,
                    thread,
                    taker,
                    remote,
                    ..
                } => {
                    assert!(thread == taker && !remote, "{r:?}");
                    (device, id, dirty)
                }
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(got_drops, made_drops, "{classes:?}");
        let mut out: Vec<_> = trace
            .records
            .iter()
            .filter_map(|r| match *r {
                Record::Outstanding {
                    device,
                    asked,
                    len,
                    id,
                    ..
                } => Some((device, asked, len, id)),
                _ => None,
            })
            .collect();
        out.sort();
        kept_made.sort();
        assert_eq!(out, kept_made, "{classes:?}");
    }
}

/// A version 1 file (written before unregistrations were recorded) reads
/// as before; an unregistration record in one is refused at its offset.
#[test]
fn a_version_1_trace_reads_but_holds_no_unregistration() {
    let path = TempPath::new("version-1");
    let faults = std::sync::Arc::new(pinpool::testing::Faults::default());
    let pool = Pool::builder()
        .regions(false)
        .faults(faults)
        .cleaner_threads(1)
        .trace(&path.0)
        .build()
        .unwrap();
    drop(pool.take(1 << 20));
    pool.flush();
    drop(pool);
    let mut bytes = std::fs::read(&path.0).unwrap();
    let records_at = 16 + u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    let unregistration = (records_at..bytes.len())
        .step_by(48)
        .find(|&at| bytes[at] == 10)
        .expect("the close unregisters the buffer");
    bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
    let err = Trace::from_reader(&bytes[..]).unwrap_err();
    assert_eq!(err.offset, unregistration as u64, "{err}");
    assert!(err.to_string().contains("version 1"), "{err}");
    // Without it (and the end record's count one less), it reads.
    bytes.drain(unregistration..unregistration + 48);
    let end_at = bytes.len() - 48;
    let count = u64::from_le_bytes(bytes[end_at + 32..end_at + 40].try_into().unwrap());
    bytes[end_at + 32..end_at + 40].copy_from_slice(&(count - 1).to_le_bytes());
    let trace = Trace::from_reader(&bytes[..]).unwrap();
    assert_eq!(takes(&trace).len(), 1);
    // And it writes back as it was: a version 1 file.
    assert_eq!(trace.version, 1);
    assert!(trace.to_bytes() == bytes, "written back, the bytes differ");
}

/// Two names of one file (a symbolic link, a hard link) are one file: a
/// strict pool whose trace path names the file another pool writes fails
/// to build rather than truncate that pool's trace.
#[test]
fn a_link_to_a_trace_being_written_is_that_trace() {
    let real = TempPath::new("linked");
    let soft = TempPath::new("soft-link");
    let hard = TempPath::new("hard-link");
    let a = traced(&real);
    std::os::unix::fs::symlink(&real.0, &soft.0).unwrap();
    std::fs::hard_link(&real.0, &hard.0).unwrap();
    drop(a.take(8192));
    for link in [&soft, &hard] {
        let b = Pool::builder()
            .backend(BackendKind::Host)
            .trace(&link.0)
            .build();
        match b {
            Err(Error::Trace { path, source }) => {
                assert_eq!(path, link.0);
                assert_eq!(source.kind(), std::io::ErrorKind::AlreadyExists);
            }
            other => panic!("{}: {other:?}", link.0.display()),
        }
    }
    drop(a);
    let trace = Trace::read(&real.0).unwrap();
    assert_eq!(takes(&trace).len(), 1, "{:#?}", trace.records);
}

/// The outstanding records name the take that holds each buffer: a
/// buffer that thread A took and dropped, then thread B took and never
/// dropped, often within one millisecond (where the file orders records
/// by their threads' buffers, B's first), is B's.
#[test]
fn an_outstanding_buffer_names_the_take_that_holds_it() {
    const A_ASKS: usize = 5000;
    const B_ASKS: usize = 4097;
    let path = TempPath::new("outstanding-owner");
    let pool = without_caches(&path);
    let (to_b, b_rx) = std::sync::mpsc::channel::<()>();
    let (to_main, main_rx) = std::sync::mpsc::channel::<Option<u64>>();
    let mut reused = 0;
    std::thread::scope(|s| {
        let pool = &pool;
        // B's buffer is made first, so its records come first within a
        // millisecond.
        s.spawn(move || {
            drop(pool.take(64));
            to_main.send(None).unwrap();
            while b_rx.recv().is_ok() {
                let b = pool.take(B_ASKS);
                let at = b.as_ptr() as u64;
                std::mem::forget(b);
                to_main.send(Some(at)).unwrap();
            }
        });
        main_rx.recv().unwrap();
        for _ in 0..200 {
            // A: a thread of its own each time, with a buffer made after B's.
            let at = std::thread::scope(|a| {
                a.spawn(|| {
                    let buf = pool.take(A_ASKS);
                    let at = buf.as_ptr() as u64;
                    drop(buf);
                    pool.flush();
                    at
                })
                .join()
                .unwrap()
            });
            to_b.send(()).unwrap();
            if main_rx.recv().unwrap() == Some(at) {
                reused += 1;
            }
        }
        drop(to_b);
    });
    drop(pool);
    let trace = Trace::read(&path.0).unwrap();
    let outstanding: Vec<&Record> = trace
        .records
        .iter()
        .filter(|r| matches!(r, Record::Outstanding { .. }))
        .collect();
    assert!(reused > 0, "setup: B never took A's buffer");
    assert_eq!(outstanding.len(), 200);
    let wrong: Vec<String> = outstanding
        .iter()
        .filter(|r| !matches!(r, Record::Outstanding { asked, .. } if *asked == B_ASKS as u64))
        .map(|r| r.to_string())
        .collect();
    assert!(wrong.is_empty(), "{} name A's take: {wrong:?}", wrong.len());
}

/// Buffers held when the pool closes are reported outstanding even when
/// records were lost before (full buffers): a drop whose take was lost
/// does not cancel a later take of the same address. (A held buffer whose
/// own take was lost cannot be reported: the test asks for those whose
/// take is in the file, told apart by the bytes asked.)
#[test]
fn buffers_held_at_the_close_are_outstanding_after_lost_records() {
    const HELD_ASKS: u64 = 4000;
    let path = TempPath::new("lost-outstanding");
    let pool = traced(&path);
    let held: Vec<u64> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let pool = &pool;
                s.spawn(move || {
                    for _ in 0..100_000 {
                        drop(pool.take(4096));
                    }
                    // Of the same class: most likely the same address.
                    let buf = pool.take(HELD_ASKS as usize);
                    let at = buf.as_ptr() as u64;
                    std::mem::forget(buf);
                    at
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    drop(pool);
    let trace = Trace::read(&path.0).unwrap();
    let Some(&Record::End { lost, .. }) = trace.records.last() else {
        panic!("no end record");
    };
    let outstanding: Vec<u64> = trace
        .records
        .iter()
        .filter_map(|r| match *r {
            Record::Outstanding { id, .. } => Some(id),
            _ => None,
        })
        .collect();
    let recorded = |at: u64| {
        trace
            .records
            .iter()
            .any(|r| matches!(*r, Record::Take { id, asked, .. } if id == at && asked == HELD_ASKS))
    };
    for &at in held.iter().filter(|&&at| recorded(at)) {
        assert!(
            outstanding.contains(&at),
            "{at:#x} held, not reported ({lost} records lost; outstanding {outstanding:x?})"
        );
    }
    // Without losses, exactly the buffers held.
    if lost == 0 {
        assert_eq!(outstanding.len(), held.len());
    }
}

/// Pinned memory given back is in the trace too: with regions (the
/// default), an idle trim releases them, and every byte registered is
/// unregistered by the time the trace ends (growths that fold regions,
/// trims, `clear` and the close included), so the trace tells what was
/// pinned at any time.
#[test]
fn every_unregistration_is_traced() {
    let path = TempPath::new("unregistrations");
    let faults = std::sync::Arc::new(pinpool::testing::Faults::default());
    let pool = Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(2)
        .idle_trim(std::time::Duration::from_millis(100))
        .trace(&path.0)
        .build()
        .unwrap();
    // Pinned through every path, the last buffers left for the idle trim
    // to release.
    crate::common::pin_and_give_back(&pool);
    let trimmed = crate::common::eventually(std::time::Duration::from_secs(10), || {
        pool.stats().pinned_bytes == 0
    });
    assert!(trimmed, "setup: {:#?}", pool.stats());
    drop(pool);
    // Counted once the pool is gone: a provisioning tick may pin again
    // after the idle trim (in CI one registration came between a count
    // taken before the drop and the close).
    let regions_registered = faults.registered();
    let trace = Trace::read(&path.0).unwrap();
    let Some(&Record::End { lost, .. }) = trace.records.last() else {
        panic!("no end record");
    };
    assert_eq!(lost, 0);
    // Bytes, then calls.
    let (mut registered, mut unregistered) = ((0u64, 0u64), (0u64, 0u64));
    for r in &trace.records {
        match *r {
            Record::Register {
                bytes,
                failed: false,
                ..
            } => registered = (registered.0 + bytes, registered.1 + 1),
            Record::Unregister {
                bytes,
                failed: false,
                ..
            } => unregistered = (unregistered.0 + bytes, unregistered.1 + 1),
            _ => {}
        }
    }
    assert!(registered.0 > 0);
    assert_eq!(registered.1, regions_registered);
    assert_eq!(unregistered.1, faults.unregistered());
    assert_eq!(
        registered.0, unregistered.0,
        "bytes registered and unregistered in the trace"
    );
}

/// A buffer taken by A, dropped by B (in B's buffer), taken again by A
/// and held, often within one millisecond: the outstanding record is A's
/// second take. A's buffer was made first, so within a millisecond the
/// file orders A's two takes before B's drop.
#[test]
fn a_remote_drop_sorted_after_its_takers_next_take_closes_the_first() {
    const FIRST: usize = 5000;
    const SECOND: usize = 4097;
    let path = TempPath::new("remote-retake");
    let pool = without_caches(&path);
    // The main thread's ring first.
    drop(pool.take(64));
    let (to_b, b_rx) = std::sync::mpsc::channel::<pinpool::PinnedBuffer>();
    let (ack, acked) = std::sync::mpsc::channel::<()>();
    let mut reused = 0;
    let rounds = 300;
    std::thread::scope(|s| {
        s.spawn(move || {
            for buf in b_rx {
                drop(buf);
                ack.send(()).unwrap();
            }
        });
        for _ in 0..rounds {
            let a = pool.take(FIRST);
            let at = a.as_ptr() as u64;
            to_b.send(a).unwrap();
            acked.recv().unwrap();
            pool.flush();
            let again = pool.take(SECOND);
            if again.as_ptr() as u64 == at {
                reused += 1;
            }
            std::mem::forget(again);
        }
        drop(to_b);
    });
    drop(pool);
    let trace = Trace::read(&path.0).unwrap();
    let Some(&Record::End { lost, .. }) = trace.records.last() else {
        panic!("no end")
    };
    assert_eq!(lost, 0);
    let outstanding: Vec<&Record> = trace
        .records
        .iter()
        .filter(|r| matches!(r, Record::Outstanding { .. }))
        .collect();
    assert!(reused > 0, "setup: never reused");
    let wrong: Vec<String> = outstanding
        .iter()
        .filter(|r| !matches!(r, Record::Outstanding { asked, .. } if *asked == SECOND as u64))
        .map(|r| r.to_string())
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {} outstanding name the dropped take ({reused} reused): {:?}",
        wrong.len(),
        outstanding.len(),
        &wrong[..wrong.len().min(3)]
    );
    assert_eq!(outstanding.len(), rounds);
}

/// A thread fills its buffer and exits; the next thread inherits its cache
/// (and buffer) and loses records into it before the background thread
/// empties it: each thread's records in the file and the losses named
/// after it are at most what it wrote.
#[test]
fn losses_name_the_thread_that_lost_them_after_its_cache_passed_on() {
    const A_PAIRS: u64 = 100_000;
    const B_PAIRS: u64 = 100_000;
    let mut failures = Vec::new();
    for round in 0..3 {
        let path = TempPath::new(&format!("lost-inherit-{round}"));
        let pool = Pool::builder()
            .backend(BackendKind::Host)
            .cleaner_threads(1)
            .trace(&path.0)
            .build()
            .unwrap();
        for pairs in [A_PAIRS, B_PAIRS] {
            let p = pool.clone();
            std::thread::spawn(move || {
                for _ in 0..pairs {
                    drop(p.take(4096));
                }
            })
            .join()
            .unwrap();
        }
        drop(pool);
        let trace = Trace::read(&path.0).unwrap();
        let mut threads: Vec<u64> = Vec::new();
        for r in &trace.records {
            if let Record::Take { thread, .. } = *r {
                if !threads.contains(&thread) {
                    threads.push(thread);
                }
            }
        }
        let Some(&Record::End { lost, .. }) = trace.records.last() else {
            panic!("no end")
        };
        for (i, &t) in threads.iter().enumerate() {
            let written = [A_PAIRS, B_PAIRS].get(i).copied().unwrap_or(0) * 2;
            let in_file = trace
                .records
                .iter()
                .filter(|r| matches!(**r, Record::Take { thread, .. } | Record::Drop { thread, .. } if thread == t))
                .count() as u64;
            let named: u64 = trace
                .records
                .iter()
                .filter_map(|r| match *r {
                    Record::Lost {
                        thread, records, ..
                    } if thread == t => Some(records),
                    _ => None,
                })
                .sum();
            if in_file + named > written {
                failures.push(format!(
                    "round {round}: thread {t} wrote {written} records, {in_file} in the file, \
                     {named} named lost ({lost} lost in all)"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Registrations that fail now and then (growths that folded regions
/// register them again on their own), unregistrations that fail, trims,
/// clears, a cap and budget lowered, from several threads with a clear
/// racing them: in the trace sorted by time (stable), every successful
/// unregistration follows a successful registration of its address and
/// bytes still open, the running total never goes below zero, and at the
/// end it equals what the pool holds pinned.
#[test]
fn registrations_and_unregistrations_pair_up_in_order() {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut problems = Vec::new();
    for round in 0..2u64 {
        let path = TempPath::new(&format!("pairs-{round}"));
        let faults = std::sync::Arc::new(pinpool::testing::Faults::default());
        faults.fail_register(&(1..400).filter(|c| c % 5 == round % 5).collect::<Vec<_>>());
        faults.fail_unregister(&[7, 19]);
        let pool = Pool::builder()
            .faults(faults.clone())
            .cleaner_threads(2)
            .idle_trim(std::time::Duration::from_millis(20))
            .trace(&path.0)
            .build()
            .unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let pool = &pool;
                s.spawn(move || {
                    let mut seed = 0x9e37_79b9 ^ (round * 7 + t);
                    let mut rnd = move || {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        seed
                    };
                    for _ in 0..60 {
                        let n = 1 + rnd() % 8;
                        let held: Vec<_> = (0..n)
                            .map(|_| pool.take(1000 + (rnd() % (4 << 20)) as usize))
                            .collect();
                        std::thread::sleep(std::time::Duration::from_millis(rnd() % 4));
                        drop(held);
                    }
                });
            }
            let pool = &pool;
            let stop = &stop;
            s.spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    match i % 4 {
                        0 => pool.clear(),
                        1 => pool.trim(),
                        _ => {}
                    }
                    i += 1;
                    std::thread::sleep(std::time::Duration::from_millis(3));
                }
            });
            std::thread::sleep(std::time::Duration::from_millis(1000));
            stop.store(true, Ordering::Relaxed);
        });
        pool.flush();
        let pinned_at_end = pool.stats().pinned_bytes;
        drop(pool);
        let trace = Trace::read(&path.0).unwrap();
        let mut records = trace.records.clone();
        records.sort_by_key(|r| r.time_ns());
        let mut open: HashMap<(u64, u64), i64> = HashMap::new();
        let mut total: i64 = 0;
        let mut min_total = 0;
        let mut unmatched = Vec::new();
        for r in &records {
            match *r {
                Record::Register {
                    id,
                    bytes,
                    failed: false,
                    ..
                } => {
                    *open.entry((id, bytes)).or_default() += 1;
                    total += bytes as i64;
                }
                Record::Unregister {
                    id,
                    bytes,
                    failed: false,
                    ..
                } => {
                    let e = open.entry((id, bytes)).or_default();
                    *e -= 1;
                    if *e < 0 {
                        unmatched.push(r.to_string());
                    }
                    total -= bytes as i64;
                    min_total = min_total.min(total);
                }
                _ => {}
            }
        }
        // Failed unregistrations leave memory pinned (leaked): still held.
        if !unmatched.is_empty() || min_total < 0 {
            problems.push(format!(
                "round {round}: {} unregistrations before their registration ({:?}), lowest total {min_total}",
                unmatched.len(),
                &unmatched[..unmatched.len().min(3)]
            ));
        }
        // What the trace says is pinned after the last flush, and what the
        // close released. (The close's unregistrations are in the trace.)
        let _ = pinned_at_end;
        if total != 0 {
            let leaked: u64 = records
                .iter()
                .filter_map(|r| match *r {
                    Record::Unregister {
                        bytes,
                        failed: true,
                        ..
                    } => Some(bytes),
                    _ => None,
                })
                .sum();
            if total as u64 != leaked {
                problems.push(format!(
                    "round {round}: {total} bytes registered and not unregistered at the end, {leaked} leaked"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// The path strict pools are built with keeps being replaced by a
/// symbolic link to another pool's trace and back: no build truncates
/// that trace (the file is checked once opened, before it is truncated).
#[test]
fn a_path_swapped_to_a_link_while_a_pool_starts_never_truncates_a_trace() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let real = TempPath::new("swap-real");
    let swapped = TempPath::new("swap-path");
    let sym = TempPath::new("swap-sym");
    let reg = TempPath::new("swap-reg");
    let a = Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(1)
        .trace(&real.0)
        .build()
        .unwrap();
    drop(a.take(8192));
    a.flush();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let stop = AtomicBool::new(false);
    let mut built = 0;
    let mut hijacked = 0;
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if n.is_multiple_of(2) {
                    let _ = std::fs::remove_file(&sym.0);
                    std::os::unix::fs::symlink(&real.0, &sym.0).unwrap();
                    std::fs::rename(&sym.0, &swapped.0).unwrap();
                } else {
                    std::fs::write(&reg.0, b"x").unwrap();
                    std::fs::rename(&reg.0, &swapped.0).unwrap();
                }
                n += 1;
            }
        });
        let real_len = || std::fs::metadata(&real.0).map(|m| m.len()).unwrap_or(0);
        for _ in 0..400 {
            let before = real_len();
            if let Ok(b) = Pool::builder()
                .backend(BackendKind::Host)
                .cleaner_threads(1)
                .trace(&swapped.0)
                .build()
            {
                built += 1;
                if real_len() < before {
                    hijacked += 1;
                }
                drop(b);
                if hijacked > 0 {
                    break;
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    drop(a);
    let _ = std::fs::remove_file(&swapped.0);
    let read = Trace::read(&real.0);
    assert!(
        hijacked == 0 && read.is_ok(),
        "{built} pools built, {hijacked} truncated the first pool's trace; it reads: {:?}",
        read.map(|t| t.records.len())
    );
}

/// A record's times print as microseconds to the nanosecond, exactly,
/// however large (a float lost nanoseconds past about 2^53).
#[test]
fn record_times_print_exactly() {
    let flush = |time_ns, took_ns| format!("{}", Record::Flush { time_ns, took_ns });
    assert_eq!(flush(1_234_567, 1), "1234.567 flush took_us=0.001");
    assert_eq!(
        flush(u64::MAX, 0),
        "18446744073709551.615 flush took_us=0.000"
    );
}
