//! Take and drop from thread-local destructors, while the thread is being
//! torn down. Its own test binary: the failure this guards against aborts
//! the process.

use std::cell::RefCell;

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
