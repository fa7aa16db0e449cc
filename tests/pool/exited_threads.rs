//! Caches of threads that went idle or exited: their buffers are reachable
//! by other threads (steals, sweeps) and a new thread that inherits the
//! cache gets them back zeroed; nothing is handed out twice.

use std::time::Duration;

use pinpool::{BackendKind, Pool};

use crate::common::{all_zero, host, host_pool, within};

#[test]
fn buffers_cached_by_an_exited_thread_are_found() {
    let pool = host_pool(1);
    let p = pool.clone();
    let ptr = std::thread::spawn(move || {
        let buf = p.take(1 << 12);
        let ptr = buf.as_ptr() as usize;
        drop(buf);
        p.flush();
        ptr
    })
    .join()
    .unwrap();
    let buf = pool.take(1 << 12);
    assert_eq!(
        buf.as_ptr() as usize,
        ptr,
        "the exited thread's cached buffer was not found"
    );
    assert_eq!(pool.stats().hits, 1);
}

/// A thread fills its cache and exits; the buffers are reachable by others
/// (steal, sweep) and a new thread that inherits the cache gets them back
/// zeroed; nothing is handed out twice.
#[test]
fn exited_threads_caches_are_reachable_and_inherited_safely() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(2)
        .build()
        .unwrap();
    for round in 0..20 {
        let p = pool.clone();
        std::thread::spawn(move || {
            let bufs: Vec<_> = (0..8).map(|_| p.take(4096)).collect();
            for mut b in bufs {
                b[..100].fill(round as u8 + 1);
                b.set_dirty_len(100);
            }
        })
        .join()
        .unwrap();
        let p = pool.clone();
        within(Duration::from_secs(5), "inheriting thread", move || {
            let bufs: Vec<_> = (0..16).map(|_| p.take(4096)).collect();
            let mut ptrs: Vec<_> = bufs.iter().map(|b| b.as_ptr() as usize).collect();
            for b in &bufs {
                assert!(all_zero(b), "a non-zero buffer");
            }
            ptrs.sort_unstable();
            ptrs.dedup();
            assert_eq!(ptrs.len(), 16, "a buffer was handed out twice");
        });
    }
    let p = pool.clone();
    within(Duration::from_secs(5), "flush", move || p.flush());
    let stats = pool.stats();
    assert_eq!(stats.in_cleaner, 0);
    assert_eq!(stats.hits + stats.misses, 20 * 24);
}

/// A burst of takes after another thread left its buffers behind and went
/// away. Right after, a miss may steal one of them (steals that lock owners
/// out are rate-limited to one per millisecond per thread); the cleaner's
/// sweeps move an idle cache's buffers to the shards within a few sweep
/// periods (at most 100 ms each), after which a burst finds them all.
#[test]
fn burst_after_an_idle_thread_left_buffers_finds_them() {
    let pool = host(1);
    let p = pool.clone();
    std::thread::spawn(move || {
        let bufs: Vec<_> = (0..16).map(|_| p.take(4096)).collect();
        drop(bufs);
    })
    .join()
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let before = pool.stats();
    let bufs: Vec<_> = (0..16).map(|_| pool.take(4096)).collect();
    let after = pool.stats();
    drop(bufs);
    let hits = after.hits - before.hits;
    assert!(
        hits == 16,
        "only {hits} of 16 takes found the 16 buffers an exited thread left behind \
         ({} new allocations)",
        after.misses - before.misses
    );
}
