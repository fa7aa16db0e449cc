//! "Dropping a buffer never blocks and never calls CUDA, in
//! every state of the pool". Drops are timed and the fault backend says
//! which thread made each backend call.
#![cfg(feature = "testing")]

mod adversarial_util;

use std::sync::Arc;
use std::time::{Duration, Instant};

use adversarial_util::{eventually, faulty, within};
use pinpool::{BackendKind, Pool};

fn timed_drop(buf: pinpool::PinnedBuffer) -> Duration {
    let t0 = Instant::now();
    drop(buf);
    t0.elapsed()
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// On the host backend, a drop whose dirty bytes would push the zeroing
/// backlog past its limit (half the cap, clamped to 64 MiB..2 GiB) is freed
/// by the dropping thread itself, at once: an overloaded cleaner makes the
/// droppers pay for their own frees instead of queueing without bound. The
/// buffer is gone before the drop returns, and no flush is needed.
#[test]
fn a_large_written_buffer_over_the_backlog_is_freed_by_its_dropper() {
    const SIZE: usize = 1536 << 20;
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(1)
        .max_pooled_bytes(1 << 20)
        .build()
        .unwrap();
    let mut buf = pool.take(SIZE);
    buf.fill(1); // resident
    let (wall, cpu) = (Instant::now(), thread_cpu());
    drop(buf);
    let (wall, cpu) = (wall.elapsed(), thread_cpu() - cpu);
    let stats = pool.stats();
    assert_eq!(
        stats.zeroing_skipped, 1,
        "the drop took the zero-backlog branch"
    );
    assert_eq!(
        stats.released, 1,
        "freed by the dropping thread, before any flush"
    );
    assert_eq!(stats.in_cleaner, 0, "nothing queued for the cleaner");
    // The unmapping is the dropper's only work: well under a second.
    assert!(
        cpu < Duration::from_secs(1),
        "dropping a written {} MiB buffer cost the dropping thread {cpu:?} of CPU ({wall:?} wall)",
        SIZE >> 20
    );
}

/// Drops during a clear, an eviction and a flush that are stuck in the
/// backend (a held device synchronize) neither block nor call the backend.
#[test]
fn drops_during_stuck_clear_evict_and_flush_neither_block_nor_call() {
    let (pool, faults) = faulty(2);
    let warm: Vec<_> = (0..8).map(|i| pool.take(4096 << (i % 4))).collect();
    drop(warm);
    pool.flush();
    let held: Vec<_> = (0..8).map(|i| pool.take(4096 << (i % 4))).collect();
    assert!(held.iter().all(|b| b.is_pinned()));
    // An event-less pinned buffer in the cleaner: a flush blocks on it.
    drop(pool.take(1 << 16));
    faults.hold_synchronize();
    let flusher = {
        let p = pool.clone();
        std::thread::spawn(move || p.flush())
    };
    let clearer = {
        let p = pool.clone();
        std::thread::spawn(move || {
            for _ in 0..50 {
                p.clear();
                p.set_max_pooled_bytes(4096);
                p.set_max_pooled_bytes(1 << 30);
            }
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    let faults2 = faults.clone();
    let (took, calls) = within(Duration::from_secs(5), "drops while stuck", move || {
        let t0 = Instant::now();
        drop(held);
        (t0.elapsed(), faults2.calls_on(std::thread::current().id()))
    });
    faults.release();
    flusher.join().unwrap();
    clearer.join().unwrap();
    assert!(took < Duration::from_millis(20), "drops took {took:?}");
    assert_eq!(calls, 0, "a drop called the backend");
    pool.shutdown();
    assert!(eventually(Duration::from_secs(2), || faults.registered()
        == faults.unregistered()));
}

/// Cross-thread drops of many buffers taken on a thread that keeps
/// stealing and evicting: each drop is quick.
#[test]
fn cross_thread_drops_are_quick() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(2)
        .max_pooled_bytes(8 << 20)
        .build()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::sync_channel::<pinpool::PinnedBuffer>(1024);
    let worst = Arc::new(std::sync::Mutex::new(Duration::ZERO));
    let dropper = {
        let worst = worst.clone();
        std::thread::spawn(move || {
            for b in rx {
                let t = timed_drop(b);
                let mut w = worst.lock().unwrap();
                *w = (*w).max(t);
            }
        })
    };
    let deadline = Instant::now() + Duration::from_millis(1500);
    let mut i = 0usize;
    while Instant::now() < deadline {
        let mut b = pool.take(4096 << (i % 6));
        b[..64].fill(1);
        b.set_dirty_len(64);
        tx.send(b).unwrap();
        if i.is_multiple_of(1000) {
            pool.set_max_pooled_bytes(if i.is_multiple_of(2000) {
                4096
            } else {
                8 << 20
            });
        }
        i += 1;
    }
    drop(tx);
    dropper.join().unwrap();
    pool.flush();
    let worst = *worst.lock().unwrap();
    assert!(
        worst < Duration::from_millis(100),
        "worst cross-thread drop {worst:?}"
    );
}
