//! Loom models of the cleaner's work: chunked cleaning by two workers,
//! first registration, device synchronizes, on the fault-injecting backend
//! (which "pins" every buffer).
#![cfg(loom)]

mod common;

use common::{model, model_bounded, own_slabs_pool, pinning_pool, pool};
use loom::thread;

/// A 4-byte buffer is cleaned as two 2-byte chunks by two workers. Four
/// threads make this the largest model; one preemption keeps it short.
///
/// Catches: a buffer admitted before its last chunk is zeroed (non-zero
/// bytes on the next take; loom reports the race on the chunk's bytes), or
/// admitted twice (two live buffers with one address).
#[test]
fn chunked_buffer_is_completed_once() {
    model_bounded(Some(1), || {
        let pool = pool(2);
        let mut buf = pool.take(4);
        let ptr = buf.as_ptr() as usize;
        buf.fill(0xFF);
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

/// A pool-miss buffer dropped on a pinning backend is registered once by
/// the worker (on the register lane) while the dropping thread flushes; it
/// comes back pinned.
///
/// Catches: a registration racing the flush's count (flush returning before
/// the buffer is pooled), or a buffer registered twice or never
/// unregistered at shutdown. One preemption suffices: its mutations (the
/// completion counted before the admission, a release that does not
/// unregister) fail there.
#[test]
fn miss_buffer_is_registered_once_and_unregistered_at_shutdown() {
    model_bounded(Some(1), || {
        let (pool, faults) = pinning_pool(1);
        let buf = pool.take(8);
        assert!(!buf.is_pinned());
        drop(buf);
        pool.flush();
        let again = pool.take(8);
        assert!(again.is_pinned(), "the miss buffer came back unregistered");
        drop(again);
        pool.shutdown();
        assert_eq!(faults.registered(), 1, "registered more than once");
        assert_eq!(faults.unregistered(), 1, "shutdown left it registered");
    });
}

/// A pinned buffer dropped without events is reused only after a device
/// synchronize that started after its drop.
///
/// Catches: a synchronize that covers a buffer dropped after it started (a
/// coverage check by time, or a note taken after the numbering). One
/// preemption suffices: its mutation (no synchronize for event-less
/// buffers) fails there.
#[test]
fn event_less_pinned_buffers_wait_for_a_later_synchronize() {
    model_bounded(Some(1), || {
        let (pool, faults) = pinning_pool(1);
        drop(pool.take(8));
        pool.flush();
        let buf = pool.take(8);
        assert!(buf.is_pinned());
        let before = faults.synchronize_calls();
        drop(buf);
        pool.flush();
        assert!(
            faults.synchronize_calls() > before,
            "reused without a device synchronize"
        );
        assert!(pool.take(8).was_pooled());
        pool.shutdown();
    });
}

/// The two buffers of one slab (loom's slabs hold two 1-byte buffers) are
/// freed on two threads at once: one evicted by a cap lowered to 0, the
/// other released by a flush on another thread when it comes back under
/// that cap. No cleaner worker runs (the flushes clean), so the model
/// races only those two threads and runs at two preemptions. The slab is
/// registered on its own (regions off); a slab carved from a region
/// counts its shares the same way, and gives its page back where this one
/// unregisters.
///
/// Catches: a slab share count that loses an update (neither release sees
/// itself last: the slab stays registered, and loom reports it leaked) or
/// lets both see themselves last (unregistered twice).
#[test]
fn a_slab_is_unregistered_once_after_both_of_its_buffers() {
    model(|| {
        let (pool, faults) = own_slabs_pool();
        drop(pool.take(1));
        pool.flush();
        assert_eq!(pool.stats().pooled_buffers, 2, "the slab was not carved");
        let buf = pool.take(1);
        assert!(buf.was_pooled() && buf.is_pinned());
        let dropper = {
            let pool = pool.clone();
            thread::spawn(move || {
                drop(buf);
                pool.flush();
            })
        };
        pool.set_max_pooled_bytes(0);
        dropper.join().unwrap();
        pool.flush();
        assert_eq!(faults.registered(), 1, "the slab was registered again");
        assert_eq!(
            faults.unregistered(),
            1,
            "the slab was not unregistered once"
        );
        assert_eq!(pool.stats().pinned_bytes, 0);
        pool.shutdown();
    });
}
