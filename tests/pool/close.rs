//! Closing a pool (dropping its last handle) with buffers out: the pool's
//! state lives until the last one comes back, and then goes.
//!
//! The pool's shared state holds the fault backend's `Arc<Faults>`, so
//! `Arc::strong_count(&faults) == 1` means the state was freed. A buffer
//! still out when that happens would be a use after free on its drop: such
//! buffers are forgotten instead of dropped, and the test fails.

#[cfg(feature = "testing")]
use std::cell::RefCell;
#[cfg(feature = "testing")]
use std::sync::{Arc, Barrier, Mutex};
#[cfg(feature = "testing")]
use std::time::{Duration, Instant};

#[cfg(feature = "testing")]
use pinpool::testing::{Faults, TestFence};
#[cfg(feature = "testing")]
use pinpool::{PinnedBuffer, SizeClasses};

use crate::common::host_pool;
#[cfg(feature = "testing")]
use crate::common::{
    all_zero, eventually, faulty, faulty_with_classes, in_child, state_freed, OnExit,
};

#[test]
fn pool_dropped_while_buffers_are_out() {
    let pool = host_pool(1);
    let mut buf = pool.take(1 << 20);
    buf.fill(1);
    drop(pool);
    drop(buf); // freed inline: the pool is gone
}

/// Threads hold pinned buffers (some with unfinished copies) when the last
/// handle goes; they drop them afterwards. Every drop must be quick and call
/// nothing on the dropping thread, and every registration must be undone
/// once the copies finish.
#[cfg(feature = "testing")]
#[test]
fn last_handle_dropped_while_threads_hold_and_drop_buffers() {
    let (pool, faults) = faulty(2);
    // Pin a few buffers of each size first.
    let sizes = [4096usize, 1 << 16, 1 << 20, 6 << 20];
    let warm: Vec<_> = sizes
        .iter()
        .flat_map(|&s| (0..4).map(move |_| s))
        .map(|s| pool.take(s))
        .collect();
    drop(warm);
    pool.flush();
    let fences: Arc<Mutex<Vec<pinpool::testing::TestFence>>> = Arc::default();
    let barrier = Arc::new(Barrier::new(5));
    let max_drop = Arc::new(Mutex::new(Duration::ZERO));
    let calls = Arc::new(Mutex::new(0usize));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let mut bufs: Vec<_> = sizes.iter().map(|&s| pool.take(s)).collect();
            let (fences, barrier, max_drop, calls, faults) = (
                fences.clone(),
                barrier.clone(),
                max_drop.clone(),
                calls.clone(),
                faults.clone(),
            );
            std::thread::spawn(move || {
                for (i, b) in bufs.iter_mut().enumerate() {
                    b.fill(t as u8 + 1);
                    if i % 2 == 0 {
                        let f = pinpool::testing::TestFence::default();
                        f.record(b);
                        fences.lock().unwrap().push(f);
                    }
                }
                barrier.wait(); // the pool is being dropped
                std::thread::sleep(Duration::from_millis(20));
                for b in bufs {
                    let t0 = Instant::now();
                    drop(b);
                    let took = t0.elapsed();
                    let mut m = max_drop.lock().unwrap();
                    *m = (*m).max(took);
                }
                *calls.lock().unwrap() += faults.calls_on(std::thread::current().id());
            })
        })
        .collect();
    drop(pool);
    barrier.wait();
    for t in threads {
        t.join().unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        faults.unregistered() < faults.registered(),
        "buffers with unfinished copies were unregistered"
    );
    for f in fences.lock().unwrap().drain(..) {
        f.complete();
    }
    assert!(
        eventually(Duration::from_secs(5), || faults.unregistered()
            == faults.registered()),
        "late buffers never released: {} registered, {} unregistered",
        faults.registered(),
        faults.unregistered()
    );
    assert_eq!(*calls.lock().unwrap(), 0, "a late drop called the backend");
    let max_drop = *max_drop.lock().unwrap();
    assert!(
        max_drop < Duration::from_millis(20),
        "a late drop took {max_drop:?}"
    );
}

/// Drops `buf` only if the pool's state (holding `faults`) is still alive;
/// otherwise forgets it and panics with `what`.
#[cfg(feature = "testing")]
fn drop_late(buf: PinnedBuffer, faults: &Arc<Faults>, what: &str) {
    if Arc::strong_count(faults) == 1 {
        std::mem::forget(buf);
        panic!("{what}: the pool's state was freed while a buffer was still out (use after free on its drop)");
    }
    drop(buf);
}

/// Buffers of every kind held across the close (own, borrowed, stolen from a
/// deferred list, cross-thread, reserved, self-reused): the state lives until
/// the last one comes back, and then goes.
#[cfg(feature = "testing")]
#[test]
fn close_with_every_kind_of_buffer_out() {
    let (pool, faults) = faulty_with_classes(2, SizeClasses::PowersOfTwo);
    let mut late: Vec<(PinnedBuffer, &str)> = Vec::new();
    // Own miss.
    late.push((pool.take(4096), "own miss"));
    // Self-reused deferred.
    let mut d = pool.take(64);
    d[..8].fill(1);
    d.set_dirty_len(8);
    drop(d);
    late.push((pool.take(64), "owner-reused"));
    // Borrowed: a pinned 16 KiB ready, taken as 8 KiB.
    drop(pool.take(16384));
    pool.flush();
    let b = pool.take(8192);
    late.push((b, "borrowed"));
    // Reserved.
    pool.reserve(0, &[(32768, 2)]).unwrap();
    pool.flush();
    late.push((pool.take(32768), "reserved"));
    // Taken by another thread that then exits: dropped here (cross-thread).
    let p2 = pool.clone();
    let x = std::thread::spawn(move || p2.take(2048)).join().unwrap();
    late.push((x, "cross-thread"));
    // Stolen: another thread leaves deferred buffers in its cache and stays.
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let p3 = pool.clone();
    let idle = std::thread::spawn(move || {
        // Host-backend-like small buffers: pinned ones need a registration
        // first, so pin them through a flush, then defer them.
        let v: Vec<_> = (0..4).map(|_| p3.take(1024)).collect();
        drop(v);
        p3.flush();
        let mut v: Vec<_> = (0..4).map(|_| p3.take(1024)).collect();
        let f = TestFence::default();
        for b in &mut v {
            b[..4].fill(9);
            b.set_dirty_len(4);
            f.record(b);
        }
        f.complete();
        drop(v);
        drop(p3);
        ready_tx.send(()).unwrap();
        let _ = go_rx.recv();
    });
    ready_rx.recv().unwrap();
    let s = pool.take(1024);
    late.push((s, "stolen (or from the shard after a sweep)"));
    let before = pool.stats();
    drop(pool);
    std::thread::sleep(Duration::from_millis(100));
    for (buf, what) in late.into_iter().rev() {
        drop_late(buf, &faults, what);
    }
    go_tx.send(()).unwrap();
    idle.join().unwrap();
    assert!(
        state_freed(&faults, Duration::from_secs(8)),
        "every buffer back, but the closed pool kept its state ({} refs); before the close: {before:?}",
        Arc::strong_count(&faults)
    );
    assert_eq!(faults.registered(), faults.unregistered());
}

/// Many rounds of close with buffers dropped from other threads after the
/// close, borrowed and not, racing the close itself.
#[cfg(feature = "testing")]
#[test]
fn close_races_cross_thread_late_drops() {
    for round in 0..40 {
        let (pool, faults) = faulty_with_classes(1, SizeClasses::PowersOfTwo);
        drop(pool.take(8192));
        drop(pool.take(8192));
        pool.flush();
        let bufs: Vec<_> = (0..6)
            .map(|i| pool.take(if i % 2 == 0 { 4096 } else { 8192 }))
            .collect();
        let barrier = Arc::new(Barrier::new(2));
        let b2 = barrier.clone();
        let f2 = faults.clone();
        let t = std::thread::spawn(move || {
            b2.wait();
            for buf in bufs {
                drop_late(buf, &f2, "cross-thread late drop");
            }
        });
        barrier.wait();
        drop(pool);
        t.join()
            .unwrap_or_else(|_| panic!("round {round}: use after free"));
        assert!(
            state_freed(&faults, Duration::from_secs(5)),
            "round {round}: state kept ({} refs)",
            Arc::strong_count(&faults)
        );
    }
}

#[cfg(feature = "testing")]
thread_local!(static AFTER_GUARD: RefCell<Option<OnExit>> = const { RefCell::new(None) });

/// A dying thread (past pinpool's guard: the orphan cache) borrows a larger
/// buffer from the shard, holds it across the pool's close, and a thread
/// drops it afterwards: the state stays until then, and goes after.
#[cfg(feature = "testing")]
#[test]
fn orphan_borrow_held_across_close() {
    let (pool, faults) = faulty_with_classes(1, SizeClasses::PowersOfTwo);
    drop(pool.take(16384));
    pool.flush();
    pool.clear(); // nothing pooled; pin one 16 KiB into the shard again:
    pool.reserve(0, &[(16384, 1)]).unwrap();
    pool.flush();
    let (tx, rx) = std::sync::mpsc::channel::<PinnedBuffer>();
    let p2 = pool.clone();
    std::thread::spawn(move || {
        let p3 = p2.clone();
        AFTER_GUARD.with(|g| {
            *g.borrow_mut() = Some(OnExit(Some(Box::new(move || {
                let b = p3.take(8192);
                tx.send(b).unwrap();
                drop(p3);
            }))))
        });
        drop(p2.take(64)); // pinpool's guard registers after AFTER_GUARD
        drop(p2);
    })
    .join()
    .unwrap();
    let b = rx.recv().unwrap();
    assert_eq!(b.len(), 8192);
    assert!(all_zero(&b));
    let cap = b.capacity();
    drop(pool);
    std::thread::sleep(Duration::from_millis(50));
    let f2 = faults.clone();
    std::thread::spawn(move || drop_late(b, &f2, "orphan's borrowed buffer"))
        .join()
        .unwrap();
    assert!(
        state_freed(&faults, Duration::from_secs(5)),
        "state kept after the orphan's buffer (capacity {cap}) came back ({} refs)",
        Arc::strong_count(&faults)
    );
}

/// Closing a pool while a large buffer waits in the cleaner's parking for
/// its copy. Alone in a child process: the failure it shows ends in a use
/// after free.
///
/// The close drains the cleaner on the closing thread. A parked buffer
/// whose copy finishes meanwhile is zeroed there; above the chunk size that
/// means chunk jobs on the lanes, which the drain must run too (seen
/// failing before the fix: they were left on the lanes, the buffer was
/// never unregistered, and its job outlived the pool's caches).
#[cfg(feature = "testing")]
#[test]
fn closing_with_a_parked_large_buffer_loses_it() {
    const TEST: &str = "closing_with_a_parked_large_buffer_loses_it";
    if in_child(module_path!(), TEST, &[]).is_some() {
        return;
    }
    let (pool, faults) = faulty(1);
    // Pin an 8 MiB buffer and a small one.
    drop(pool.take(8 << 20));
    drop(pool.take(1 << 16));
    pool.flush();
    let mut large = pool.take(8 << 20);
    let small = pool.take(1 << 16);
    assert!(large.is_pinned() && small.is_pinned());
    // Stop the workers: drops queue jobs, nothing runs them until the next
    // take miss or flush (neither happens again here).
    pool.shutdown();
    let fence = TestFence::default();
    fence.record(&mut large);
    drop(large); // 8 MiB dirty, copy running: queued, parked when processed
    faults.hold_synchronize();
    drop(small); // pinned, no events: its processing synchronizes (held)
    let closer = std::thread::spawn(move || drop(pool));
    // The close's drain parks `large`, then blocks in `small`'s synchronize.
    std::thread::sleep(Duration::from_millis(300));
    fence.complete();
    faults.release();
    closer.join().unwrap();
    let balanced = eventually(Duration::from_secs(3), || {
        faults.unregistered() == faults.registered()
    });
    assert!(
        balanced,
        "after the pool closed, {} registrations vs {} unregistrations: the \
         large buffer was lost in a chunk job left on the lanes",
        faults.registered(),
        faults.unregistered()
    );
}
