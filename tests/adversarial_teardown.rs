//! Take and drop from thread-local destructors that run after pinpool's
//! per-thread guard but before the `thread_local` crate's own guard. Its
//! own test binary: the failure it provokes may crash the process.
//!
//! A thread that touched any `ThreadLocal` (tracing-subscriber's registry,
//! for one) before a thread-local of its own, and only then used the pool,
//! runs that destructor with its pinpool token retired (`DEAD`) while the
//! `thread_local` crate still maps the thread to its cache. Every dying
//! thread has that token, so two of them must not both be let in as the
//! cache's owner: a dying thread bypasses its cache (seen failing before
//! the fix: two such threads ran the owner's lists at once, and the process
//! crashed).

mod adversarial_util;

use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use adversarial_util::within;
use pinpool::{BackendKind, Pool};

struct OnExit(Option<Box<dyn FnOnce()>>);

impl Drop for OnExit {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

thread_local!(static ON_EXIT: RefCell<Option<OnExit>> = const { RefCell::new(None) });

/// A thread whose `f` runs in a thread-local destructor that sits between
/// pinpool's guard and the `thread_local` crate's guard.
fn spawn_dying(pool: Pool, f: impl FnOnce() + 'static + Send) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        // 1. The thread_local crate's guard (as any ThreadLocal user would).
        let tl = thread_local::ThreadLocal::<u8>::new();
        tl.get_or(|| 0);
        drop(tl);
        // 2. A thread-local of our own, with a destructor.
        let f: Box<dyn FnOnce()> = Box::new(f);
        ON_EXIT.with(|e| *e.borrow_mut() = Some(OnExit(Some(f))));
        // 3. The thread's first pool use: pinpool's guard comes last, so it
        // is destroyed first; our destructor runs with the token retired but
        // the thread_local id still live.
        let mut buf = pool.take(4096);
        buf[0] = 1;
        drop(buf);
    })
}

#[test]
fn two_dying_threads_share_one_cache_as_owners() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(1)
        .build()
        .unwrap();
    let problems: Arc<Mutex<Vec<String>>> = Arc::default();
    let barrier = Arc::new(Barrier::new(2));
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<pinpool::PinnedBuffer>>(4);
    const ROUNDS: usize = 1_000;
    const BATCH: usize = 32;
    let takes = Arc::new(std::sync::atomic::AtomicU64::new(0));

    let a = {
        let (pool2, problems, barrier, takes) = (
            pool.clone(),
            problems.clone(),
            barrier.clone(),
            takes.clone(),
        );
        spawn_dying(pool.clone(), move || {
            barrier.wait();
            let mut seen = HashSet::new();
            for _ in 0..ROUNDS {
                // A batch for B to drop (homed at this thread's cache)...
                let batch: Vec<_> = (0..BATCH).map(|_| pool2.take(4096)).collect();
                seen.clear();
                for buf in &batch {
                    if !seen.insert(buf.as_ptr() as usize) {
                        problems.lock().unwrap().push("double hand-out".into());
                    }
                    if !buf.iter().all(|&b| b == 0) {
                        problems.lock().unwrap().push("non-zero bytes".into());
                    }
                }
                takes.fetch_add(BATCH as u64, std::sync::atomic::Ordering::Relaxed);
                if tx.send(batch).is_err() {
                    break;
                }
                // ...while this thread works on the same lists itself.
                for _ in 0..64 {
                    let mut buf = pool2.take(4096);
                    buf[..8].fill(7);
                    buf.set_dirty_len(8);
                    drop(buf);
                }
                takes.fetch_add(64, std::sync::atomic::Ordering::Relaxed);
            }
        })
    };
    let b = {
        let barrier = barrier.clone();
        spawn_dying(pool.clone(), move || {
            barrier.wait();
            for batch in rx {
                for mut buf in batch {
                    buf[..8].fill(9);
                    buf.set_dirty_len(8);
                    drop(buf); // home: A's cache; both threads' tokens are DEAD
                }
            }
        })
    };
    a.join().unwrap();
    b.join().unwrap();
    let problems = problems.lock().unwrap().clone();
    let pool2 = pool.clone();
    within(
        Duration::from_secs(5),
        "flush after the dying threads",
        move || pool2.flush(),
    );
    let stats = pool.stats();
    assert!(
        problems.is_empty(),
        "{} problems, first: {:?}",
        problems.len(),
        &problems[..problems.len().min(5)]
    );
    assert_eq!(stats.in_cleaner, 0, "{stats:?}");
    let takes = takes.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(stats.hits + stats.misses, 2 + takes, "{stats:?}");
}
