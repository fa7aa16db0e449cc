//! Take and drop from thread-local destructors, while the thread is being
//! torn down, in every order of the destructors that matter: pinpool's own
//! per-thread guard, the `thread_local` crate's (any user of a
//! `ThreadLocal`, tracing-subscriber's registry for one), and the
//! destructor that uses the pool. No order may panic inside the pool (a
//! process built with `panic = "abort"` would abort, and every panic hook
//! fires): a hook counts the panics of each test's thread. Its own test
//! binary: the failure this guards against aborts the process.

mod common;

use std::cell::RefCell;
use std::sync::{Mutex, Once};

use pinpool::{BackendKind, Pool};

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

#[test]
fn take_and_drop_in_a_thread_local_destructor() {
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

/// Runs `f` once, when its thread-local is destroyed.
struct OnExit(Option<Box<dyn FnOnce()>>);

impl Drop for OnExit {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
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

#[test]
fn no_teardown_order_panics_inside_the_pool() {
    count_panics();
    every_order_takes_and_drops_without_a_panic();
}

/// The same in a child process whose panic hook aborts, as a process built
/// with `panic = "abort"` does right after the hook (test binaries always
/// unwind): a panic inside the pool, caught or not, ends the process.
#[test]
fn no_teardown_order_panics_where_a_panic_aborts() {
    const TEST: &str = "no_teardown_order_panics_where_a_panic_aborts";
    if common::in_child(TEST, &[]).is_some() {
        return;
    }
    std::panic::set_hook(Box::new(|info| {
        eprintln!("{info}; aborting, as with panic = \"abort\"");
        std::process::abort();
    }));
    every_order_takes_and_drops_without_a_panic();
}
