//! Loom models of the thread caches, chunked cleaning, the cap and
//! shutdown, through the public API on the host backend. Pointer identity is
//! the witness that a buffer is in exactly one place: loom builds keep no
//! statistics counters (see `stats.rs`), but they keep the byte accounting.
#![cfg(loom)]

use loom::thread;
use pinpool::{BackendKind, Pool};

fn model(f: impl Fn() + Sync + Send + 'static) {
    model_bounded(None, f);
}

/// As `model`, with at most `preemptions` preemptions when given (the
/// default is `LOOM_MAX_PREEMPTIONS`).
fn model_bounded(preemptions: Option<usize>, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 100_000;
    if preemptions.is_some() {
        builder.preemption_bound = preemptions;
    }
    builder.check(f);
}

fn pool(workers: usize) -> Pool {
    Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(workers)
        .build()
        .unwrap()
}

/// A pool whose calling thread's cache holds one ready buffer; returns it
/// with the buffer's address.
fn pool_with_cached_buffer() -> (Pool, usize) {
    let pool = pool(1);
    let buf = pool.take(8);
    let ptr = buf.as_ptr() as usize;
    drop(buf);
    pool.flush();
    (pool, ptr)
}

/// Another thread misses and steals from the owner's cache while the owner
/// takes from it.
///
/// Catches: a steal that does not remove the buffer under the cache lock
/// (both threads would hold the same buffer), or one that loses it.
#[test]
fn steal_races_owner_take() {
    model(|| {
        let (pool, cached) = pool_with_cached_buffer();
        let thief = {
            let pool = pool.clone();
            thread::spawn(move || {
                let buf = pool.take(8);
                let ptr = buf.as_ptr() as usize;
                (buf, ptr)
            })
        };
        let own = pool.take(8);
        let (stolen, stolen_ptr) = thief.join().unwrap();
        let own_ptr = own.as_ptr() as usize;
        assert_ne!(own_ptr, stolen_ptr, "one buffer handed to two threads");
        assert!(
            own_ptr == cached || stolen_ptr == cached,
            "the cached buffer was lost"
        );
        drop((own, stolen));
        pool.shutdown();
    });
}

/// `clear` on another thread races the owner's take of its cached buffer.
///
/// Catches: a buffer both taken and still counted (or freed under the
/// taker), or left behind so that pooled bytes do not return to zero.
#[test]
fn clear_races_owner_take() {
    model(|| {
        let (pool, _) = pool_with_cached_buffer();
        let clearer = {
            let pool = pool.clone();
            thread::spawn(move || pool.clear())
        };
        let mut buf = pool.take(8);
        clearer.join().unwrap();
        buf.fill(1);
        // Branch on `was_pooled`, not on addresses: a freed address may come
        // back from the OS, which would make the model nondeterministic.
        if buf.was_pooled() {
            assert_eq!(
                pool.stats().pooled_bytes,
                0,
                "taken and still counted as pooled"
            );
        }
        drop(buf);
        pool.flush();
        pool.clear();
        assert_eq!(pool.stats().pooled_bytes, 0, "pooled bytes after clear");
        pool.shutdown();
    });
}

/// A 4-byte buffer is cleaned as two 2-byte chunks by two workers. Four
/// threads make this the largest model; one preemption keeps it to seconds.
///
/// Catches: a buffer admitted before its last chunk is zeroed (non-zero
/// bytes on the next take), or admitted twice (two live buffers with one
/// address).
#[test]
fn chunked_buffer_is_completed_once() {
    model_bounded(Some(1), || {
        let pool = pool(2);
        let mut buf = pool.take(4);
        let ptr = buf.as_ptr() as usize;
        buf.fill(0xFF);
        // Dropped on a thread other than the taker's, so the drop is not
        // deferred and the workers clean it.
        thread::spawn(move || drop(buf)).join().unwrap();
        pool.flush();
        let again = pool.take(4);
        assert_eq!(again.as_ptr() as usize, ptr, "the buffer was not pooled");
        assert!(
            again.iter().all(|&b| b == 0),
            "pooled before every chunk was zeroed"
        );
        let other = pool.take(4);
        assert_ne!(other.as_ptr() as usize, ptr, "the buffer was pooled twice");
        drop((again, other));
        pool.shutdown();
    });
}

/// Lowering the cap races a return.
///
/// Catches: an admission that reads the cap and the pooled bytes without
/// the estimate covering it (pooled bytes above the cap after quiescence),
/// or accounting that drifts from the buffers actually pooled.
#[test]
fn cap_change_races_return() {
    model(|| {
        let pool = pool(1);
        let (a, b) = (pool.take(8), pool.take(8));
        let lowerer = {
            let pool = pool.clone();
            thread::spawn(move || pool.set_max_pooled_bytes(4096))
        };
        drop(a);
        pool.flush();
        lowerer.join().unwrap();
        drop(b);
        pool.flush();
        let stats = pool.stats();
        assert!(
            stats.pooled_bytes <= 4096,
            "{} bytes pooled over a 4096-byte cap",
            stats.pooled_bytes
        );
        assert_eq!(
            stats.pooled_bytes,
            stats.pooled_buffers * 4096,
            "accounting drifted"
        );
        pool.shutdown();
    });
}

/// A drop (then a flush) on one thread races `shutdown` on another.
///
/// Catches: a buffer stranded in the cleaner's queue with no worker to take
/// it (the flush would never return: loom reports the deadlock), or one
/// still pooled after a shutdown that followed its recycling.
#[test]
fn shutdown_races_drop_and_flush() {
    model(|| {
        let pool = pool(1);
        let buf = pool.take(8);
        let dropper = {
            let pool = pool.clone();
            thread::spawn(move || {
                drop(buf);
                pool.flush();
            })
        };
        pool.shutdown();
        dropper.join().unwrap();
        pool.flush();
        let stats = pool.stats();
        assert_eq!(stats.in_cleaner, 0, "a buffer is stuck in the cleaner");
        assert!(stats.pooled_buffers <= 1);
        pool.shutdown();
        assert_eq!(
            pool.stats().pooled_buffers,
            0,
            "shutdown left a buffer pooled"
        );
    });
}

/// A buffer dropped after `shutdown`, with nothing else touching the pool.
///
/// Catches: a drop that queues its buffer while no worker runs and does not
/// start one (the buffer would wait forever; the loop below would spin until
/// loom gives up).
#[test]
fn drop_after_shutdown_restarts_the_cleaner() {
    model(|| {
        let pool = pool(1);
        let buf = pool.take(8);
        pool.shutdown();
        drop(buf);
        while pool.stats().in_cleaner > 0 {
            thread::yield_now();
        }
        assert!(pool.take(8).was_pooled(), "the buffer did not come back");
        pool.shutdown();
    });
}
