//! Loom models of the thread caches' owner / thief handshake: another
//! thread touching a cache's lists (a steal, `clear`, `flush` moving
//! deferred buffers along) while its owner takes and drops.
#![cfg(loom)]

mod common;

use common::{borrowing_pool, model, model_bounded, pool, pool_with_cached_buffer};
use loom::thread;

/// Another thread misses and steals from the owner's cache while the owner
/// takes from it.
///
/// Catches: a thief that works on the lists while the owner is active (the
/// handshake's fences weakened, or the owner not checking the request
/// word): both threads would hold the same buffer, or loom reports the
/// race on the lists.
#[test]
fn steal_races_owner_take() {
    model(|| {
        let (pool, cached) = pool_with_cached_buffer();
        // A take of another class collects the cached buffer from the
        // remote list into the owner's own ready list, where a thief must
        // lock the owner out to reach it.
        drop(pool.take(4));
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

/// The owner drops a small buffer (deferred in its own cache) and takes
/// again, re-zeroing it, while another thread's `flush` moves deferred
/// buffers to the cleaner.
///
/// Catches: a deferred buffer both re-zeroed by its owner and handed to the
/// cleaner (two owners of one buffer: loom reports the race on its bytes),
/// or a flush that returns with the buffer still deferred.
#[test]
fn flush_moves_deferred_buffers_while_the_owner_works() {
    model(|| {
        let pool = pool(1);
        let mut buf = pool.take(8);
        buf.fill(3);
        drop(buf);
        let flusher = {
            let pool = pool.clone();
            thread::spawn(move || {
                pool.flush();
            })
        };
        let mut again = pool.take(8);
        assert!(again.iter().all(|&b| b == 0), "handed out dirty");
        again.fill(4);
        drop(again);
        flusher.join().unwrap();
        pool.flush();
        assert_eq!(pool.stats().in_cleaner, 0);
        pool.shutdown();
    });
}

/// A thread drops a buffer into its own cache (deferred) and exits; the
/// main thread's flush must still bring it back.
///
/// Catches: deferred buffers of an exited thread that no one can reach
/// (flush would hang: loom reports a deadlock or a livelock).
#[test]
fn flush_reaches_an_exited_threads_cache() {
    model(|| {
        let pool = pool(1);
        {
            let pool = pool.clone();
            thread::spawn(move || {
                let mut buf = pool.take(8);
                buf.fill(5);
            })
            .join()
            .unwrap();
        }
        pool.flush();
        let stats = pool.stats();
        assert_eq!((stats.in_cleaner, stats.pooled_buffers), (0, 1));
        assert!(
            pool.take(8).was_pooled(),
            "the exited thread's buffer is reachable"
        );
        pool.shutdown();
    });
}

/// A take whose class is empty borrows the owner's idle buffer of the next
/// class up while another thread, missing on that class, adopts the
/// owner's remote list (where the flushed buffer waits).
///
/// Catches: the idle buffer handed to both (the borrow and the other
/// thread's adoption both reaching it) or lost, or a borrowed buffer that
/// changes class (it must keep its length and go back to its own class).
#[test]
fn borrow_races_another_threads_take_of_the_larger_class() {
    model(|| {
        let pool = borrowing_pool();
        let buf = pool.take(8);
        let cached = buf.as_ptr() as usize;
        drop(buf);
        pool.flush();
        let other = {
            let pool = pool.clone();
            thread::spawn(move || pool.take(8))
        };
        let small = pool.take(4);
        let big = other.join().unwrap();
        let (small_ptr, big_ptr) = (small.as_ptr() as usize, big.as_ptr() as usize);
        assert_ne!(small_ptr, big_ptr, "one buffer handed to two takes");
        assert!(
            small_ptr == cached || big_ptr == cached,
            "the idle buffer was lost"
        );
        assert_eq!(small.len(), 4, "a take shows its own class's length");
        if small_ptr == cached {
            assert_eq!(small.capacity(), 8, "a borrowed buffer keeps its class");
        }
        assert!(small.iter().chain(big.iter()).all(|&b| b == 0));
        drop((small, big));
        pool.flush();
        let stats = pool.stats();
        assert_eq!(stats.in_cleaner, 0);
        let class_8 = stats
            .per_class
            .iter()
            .find(|c| c.size == 8)
            .map_or(0, |c| c.pooled_buffers);
        let want = if small_ptr == cached { 2 } else { 1 };
        assert_eq!(
            class_8, want,
            "the borrowed buffer went back to another class"
        );
        pool.shutdown();
    });
}

/// `trim` (releasing every idle buffer now) on one thread races the owner's
/// take of the only pooled buffer, which sits on its cache's remote list.
///
/// Catches: a buffer both handed out and released (trim and the owner's
/// collection both taking the remote list: its take-all as a load and a
/// store instead of one swap), or pooled-bytes accounting that drifts when
/// trim and the take's fold race.
#[test]
fn trim_races_a_take_of_the_buffer_it_would_release() {
    model(|| {
        let (pool, ptr) = pool_with_cached_buffer();
        let footprint = pool.stats().pooled_bytes as u64;
        let trimmer = {
            let pool = pool.clone();
            thread::spawn(move || pool.trim())
        };
        let buf = pool.take(8);
        trimmer.join().unwrap();
        let stats = pool.stats();
        if buf.was_pooled() {
            assert_eq!(buf.as_ptr() as usize, ptr);
            assert_eq!(stats.trimmed_bytes, 0, "handed out and trimmed");
        } else {
            assert_eq!(
                stats.trimmed_bytes, footprint,
                "neither handed out nor trimmed"
            );
        }
        assert_eq!(stats.pooled_bytes, 0, "pooled bytes drifted");
        drop(buf);
        pool.shutdown();
    });
}

/// A thread's teardown reaches its guard (it gives its index back) while
/// it still takes and drops; a thread started meanwhile may get that index
/// and inherit its cache, and takes from it as its owner.
///
/// Catches: a dying thread let back into the cache it left (its old index
/// honoured after the guard: `current_index` without its `DEAD` check),
/// so that two threads run the owner's lists at once (loom reports the
/// concurrent access); or a dying thread's take or drop lost (the orphan
/// path: flush would not balance). Both fail at no preemption (seen on
/// 2026-12-07; the second with the orphan cache's drops forgotten), so it
/// runs at one whatever the bound: about 1 s, where two took 60-75 s.
#[test]
fn a_dying_thread_never_owns_the_cache_a_new_thread_inherits() {
    model_bounded(Some(1), || {
        let pool = pool(1);
        let dying = {
            let pool = pool.clone();
            thread::spawn(move || {
                let held = pool.take(8);
                pinpool::loom_internals::end_thread();
                drop(held); // its home cache may have a new owner now
                let late = pool.take(8); // the orphan cache
                assert!(late.iter().all(|&b| b == 0));
                drop(late);
            })
        };
        let newcomer = {
            let pool = pool.clone();
            thread::spawn(move || drop(pool.take(8)))
        };
        dying.join().unwrap();
        newcomer.join().unwrap();
        pool.flush();
        assert_eq!(pool.stats().in_cleaner, 0, "a drop was lost");
        pool.shutdown();
    });
}
