//! Take and drop from thread-local destructors, while the thread is being
//! torn down, in every order of the destructors that matter: pinpool's own
//! per-thread guard, the `thread_local` crate's (any user of a
//! `ThreadLocal`, tracing-subscriber's registry for one), and the
//! destructor that uses the pool. No order may panic inside the pool (a
//! process built with `panic = "abort"` would abort, and every panic hook
//! fires): a hook counts the panics of each test's thread. The tests whose
//! failure would abort or crash the process run alone in a child process.

use std::cell::RefCell;
use std::collections::HashSet;
#[cfg(feature = "testing")]
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex, Once};
use std::time::Duration;

#[cfg(feature = "testing")]
use pinpool::SizeClasses;
use pinpool::{BackendKind, Pool};

use crate::common::{all_zero, host_pool, in_child, within, OnExit};
#[cfg(feature = "testing")]
use crate::common::{faulty_with_classes, state_freed};

struct TakesOnDrop {
    pool: Pool,
    held: Option<pinpool::PinnedBuffer>,
}

impl Drop for TakesOnDrop {
    fn drop(&mut self) {
        // A buffer held by the dying thread goes back...
        drop(self.held.take());
        // ...and a fresh take works, bypassing the thread's cache.
        let mut buf = self.pool.take(4096);
        assert!(buf.iter().all(|&b| b == 0));
        buf[..8].fill(3);
        drop(buf);
    }
}

thread_local!(static GUARD: RefCell<Option<TakesOnDrop>> = const { RefCell::new(None) });

/// A thread-local destructor that runs after pinpool's own gives back the
/// buffer it holds, and a fresh take in it works. Alone in a child process:
/// the failure this guards against aborts the process.
#[test]
fn take_and_drop_in_a_thread_local_destructor() {
    const TEST: &str = "take_and_drop_in_a_thread_local_destructor";
    if in_child(module_path!(), TEST, &[]).is_some() {
        return;
    }
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(1)
        .build()
        .unwrap();
    for _ in 0..3 {
        let p = pool.clone();
        std::thread::spawn(move || {
            // Registered before the pool's own thread-locals are touched,
            // so it is destroyed after them.
            GUARD.with(|g| {
                *g.borrow_mut() = Some(TakesOnDrop {
                    pool: p.clone(),
                    held: None,
                })
            });
            let mut buf = p.take(4096);
            buf.fill(1);
            GUARD.with(|g| g.borrow_mut().as_mut().unwrap().held = Some(buf));
        })
        .join()
        .unwrap();
    }
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.in_cleaner, 0);
    assert_eq!(stats.hits + stats.misses, 6);
    let buf = pool.take(4096);
    assert!(buf.iter().all(|&b| b == 0));
}

#[test]
fn buffer_dropped_during_thread_local_teardown() {
    use std::cell::RefCell;
    thread_local!(static HELD: RefCell<Option<pinpool::PinnedBuffer>> = const { RefCell::new(None) });
    let pool = host_pool(1);
    let p = pool.clone();
    std::thread::spawn(move || {
        let mut buf = p.take(4096);
        buf.fill(9);
        HELD.with(|h| *h.borrow_mut() = Some(buf));
    })
    .join()
    .unwrap();
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.in_cleaner, 0);
    assert_eq!(
        stats.pooled_buffers, 1,
        "the buffer dropped at thread exit came back"
    );
    assert!(all_zero(&pool.take(4096)));
}

#[cfg(feature = "testing")]
thread_local!(static EARLY: RefCell<Option<OnExit>> = const { RefCell::new(None) });
#[cfg(feature = "testing")]
thread_local!(static LATE: RefCell<Option<OnExit>> = const { RefCell::new(None) });

/// Thread-locals destroyed before and after pinpool's guard take and drop
/// buffers of two pools (one never used by the thread before its teardown);
/// the counts stay exact and both pools let their state go once closed.
#[cfg(feature = "testing")]
#[test]
fn teardown_takes_and_drops_in_both_orders() {
    let (p, fp) = faulty_with_classes(1, SizeClasses::Fine);
    let (q, fq) = faulty_with_classes(1, SizeClasses::Fine);
    let takes_p = Arc::new(AtomicU64::new(0));
    let takes_q = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(AtomicBool::new(false));
    for _ in 0..8 {
        let (p1, q1, tp, tq, bad1) = (
            p.clone(),
            q.clone(),
            takes_p.clone(),
            takes_q.clone(),
            bad.clone(),
        );
        std::thread::spawn(move || {
            // Registered before the pool's thread-locals: destroyed after
            // pinpool's guard.
            let (p2, q2, tp2, tq2, bad2) =
                (p1.clone(), q1.clone(), tp.clone(), tq.clone(), bad1.clone());
            EARLY.with(|e| {
                *e.borrow_mut() = Some(OnExit(Some(Box::new(move || {
                    let b = p2.take(4096);
                    let c = q2.take(4096);
                    if !all_zero(&b) || !all_zero(&c) {
                        bad2.store(true, Ordering::Relaxed);
                    }
                    tp2.fetch_add(1, Ordering::Relaxed);
                    tq2.fetch_add(1, Ordering::Relaxed);
                    drop(c);
                    drop(b);
                }))))
            });
            // First pool use: pinpool's guard registers now.
            let mut held = p1.take(4096);
            held[..16].fill(1);
            held.set_dirty_len(16);
            tp.fetch_add(1, Ordering::Relaxed);
            // Registered after: destroyed before pinpool's guard, with the
            // memo still naming `p`; its first lookup of `q` is here.
            let (q3, tq3, bad3) = (q1.clone(), tq.clone(), bad1.clone());
            LATE.with(|l| {
                *l.borrow_mut() = Some(OnExit(Some(Box::new(move || {
                    drop(held);
                    let mut c = q3.take(4096);
                    if !all_zero(&c) {
                        bad3.store(true, Ordering::Relaxed);
                    }
                    c[..8].fill(3);
                    c.set_dirty_len(8);
                    tq3.fetch_add(1, Ordering::Relaxed);
                    drop(c);
                    drop(q3);
                }))))
            });
        })
        .join()
        .unwrap();
    }
    p.flush();
    q.flush();
    assert!(
        !bad.load(Ordering::Relaxed),
        "a non-zero buffer in teardown"
    );
    let (sp, sq) = (p.stats(), q.stats());
    assert_eq!(
        sp.hits + sp.misses,
        takes_p.load(Ordering::Relaxed),
        "{sp:?}"
    );
    assert_eq!(
        sq.hits + sq.misses,
        takes_q.load(Ordering::Relaxed),
        "{sq:?}"
    );
    assert_eq!(sp.in_cleaner, 0, "{sp:?}");
    assert_eq!(sq.in_cleaner, 0, "{sq:?}");
    drop(p);
    drop(q);
    assert!(state_freed(&fp, Duration::from_secs(5)), "p kept its state");
    assert!(state_freed(&fq, Duration::from_secs(5)), "q kept its state");
}

// === every order of the destructors ===

/// The names of the threads that panicked, recorded by a hook that then
/// calls the default one.
static PANICKED: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let name = std::thread::current().name().unwrap_or("").to_owned();
            PANICKED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(name);
            default(info);
        }));
    });
}

fn panics_on(thread: &str) -> usize {
    let panicked = PANICKED.lock().unwrap_or_else(|e| e.into_inner());
    panicked.iter().filter(|name| *name == thread).count()
}

thread_local!(static ON_EXIT: RefCell<Option<OnExit>> = const { RefCell::new(None) });

/// Where the destructor that uses the pool runs, among the thread's
/// destructors (they run in the reverse order of their registration).
#[derive(Debug, Clone, Copy)]
enum Order {
    /// Before pinpool's guard: the thread still owns its cache.
    BeforePinpoolsGuard,
    /// After pinpool's guard, before the `thread_local` crate's.
    BetweenTheGuards,
    /// After both guards, the thread having used the pool before.
    AfterBothGuards,
    /// After the `thread_local` crate's guard, the thread's first use of
    /// the pool (it never had a token of pinpool's).
    FirstUseAfterTheCratesGuard,
    /// The thread's first use of the pool, in its only destructor.
    FirstUseInTeardown,
}

const ORDERS: [Order; 5] = [
    Order::BeforePinpoolsGuard,
    Order::BetweenTheGuards,
    Order::AfterBothGuards,
    Order::FirstUseAfterTheCratesGuard,
    Order::FirstUseInTeardown,
];

/// Registers the `thread_local` crate's guard, as any `ThreadLocal` user
/// does on the thread's first use of one.
fn touch_the_crates_guard() {
    let map = thread_local::ThreadLocal::<u8>::new();
    map.get_or(|| 0);
}

/// A thread named `name` whose destructors run in `order` and whose late
/// destructor takes and drops buffers; returns whether the late take came
/// back zeroed.
fn dying_thread(pool: &Pool, name: &str, order: Order) -> bool {
    let pool = pool.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let late = {
        let pool = pool.clone();
        move || {
            let mut buf = pool.take(4096);
            let zeroed = buf.iter().all(|&b| b == 0);
            buf[..8].fill(3);
            drop(buf);
            drop(pool.take(1 << 20)); // a class of its own: a miss
            let _ = tx.send(zeroed);
        }
    };
    let register_late = move || {
        let late: Box<dyn FnOnce()> = Box::new(late);
        ON_EXIT.with(|e| *e.borrow_mut() = Some(OnExit(Some(late))));
    };
    let use_pool = move || {
        let mut buf = pool.take(4096);
        buf[0] = 1;
        drop(buf);
    };
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || match order {
            Order::BeforePinpoolsGuard => {
                touch_the_crates_guard();
                use_pool();
                register_late();
            }
            Order::BetweenTheGuards => {
                touch_the_crates_guard();
                register_late();
                use_pool();
            }
            Order::AfterBothGuards => {
                register_late();
                touch_the_crates_guard();
                use_pool();
            }
            Order::FirstUseAfterTheCratesGuard => {
                register_late();
                touch_the_crates_guard();
            }
            Order::FirstUseInTeardown => register_late(),
        })
        .unwrap()
        .join()
        .unwrap();
    rx.recv().expect("the late destructor ran")
}

fn every_order_takes_and_drops_without_a_panic() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(1)
        .build()
        .unwrap();
    for order in ORDERS {
        let name = format!("teardown-{order:?}");
        let zeroed = dying_thread(&pool, &name, order);
        assert_eq!(panics_on(&name), 0, "{order:?}: a panic inside the pool");
        assert!(zeroed, "{order:?}: the late take was not zeroed");
    }
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.in_cleaner, 0, "{stats:?}");
    assert!(pool.take(4096).iter().all(|&b| b == 0));
}

/// No order panics inside the pool, as the hook counts. Alone in a child
/// process: the hook is process-wide, and the failure this guards against
/// aborts the process.
#[test]
fn no_teardown_order_panics_inside_the_pool() {
    const TEST: &str = "no_teardown_order_panics_inside_the_pool";
    if in_child(module_path!(), TEST, &[]).is_some() {
        return;
    }
    count_panics();
    every_order_takes_and_drops_without_a_panic();
}

/// The same in a child process whose panic hook aborts, as a process built
/// with `panic = "abort"` does right after the hook (test binaries always
/// unwind): a panic inside the pool, caught or not, ends the process.
#[test]
fn no_teardown_order_panics_where_a_panic_aborts() {
    const TEST: &str = "no_teardown_order_panics_where_a_panic_aborts";
    if in_child(module_path!(), TEST, &[]).is_some() {
        return;
    }
    std::panic::set_hook(Box::new(|info| {
        eprintln!("{info}; aborting, as with panic = \"abort\"");
        std::process::abort();
    }));
    every_order_takes_and_drops_without_a_panic();
}

// === two dying threads, one cache ===
//
// A thread that touched any `ThreadLocal` (tracing-subscriber's registry,
// for one) before a thread-local of its own, and only then used the pool,
// runs that destructor with its pinpool token retired (`DEAD`) while the
// `thread_local` crate still maps the thread to its cache. Every dying
// thread has that token, so two of them must not both be let in as the
// cache's owner: a dying thread bypasses its cache (seen failing before
// the fix: two such threads ran the owner's lists at once, and the process
// crashed).

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

/// Two dying threads, one taking batches for the other to drop home into
/// its cache: no double hand-out, all zero, the counts exact. Alone in a
/// child process: the failure it provokes may crash the process.
#[test]
fn two_dying_threads_share_one_cache_as_owners() {
    const TEST: &str = "two_dying_threads_share_one_cache_as_owners";
    if in_child(module_path!(), TEST, &[]).is_some() {
        return;
    }
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
