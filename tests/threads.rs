//! Cross-thread drops, per-device shards, exited threads, and a stress run.

mod common;
use common::{all_zero, host_pool};
use std::collections::HashSet;
use std::sync::{Arc, Barrier, Mutex};

#[test]
fn buffer_dropped_on_another_thread_returns_to_its_device() {
    let pool = host_pool(2);
    let buf = pool.take_on(1, 1 << 13).unwrap();
    let ptr = buf.as_ptr() as usize;
    std::thread::spawn(move || drop(buf)).join().unwrap();
    pool.flush();
    assert!(
        pool.take_on(0, 1 << 13).unwrap().as_ptr() as usize != ptr,
        "device 0 must not get device 1's buffer"
    );
    let again = pool.take_on(1, 1 << 13).unwrap();
    assert_eq!(again.as_ptr() as usize, ptr);
    assert_eq!(again.device(), 1);
}

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

#[test]
fn stress_no_buffer_is_handed_out_twice_and_all_come_back_zeroed() {
    const THREADS: usize = 8;
    const ROUNDS: usize = 2000;
    let pool = host_pool(2);
    let live: Arc<Mutex<HashSet<usize>>> = Arc::default();
    let start = Arc::new(Barrier::new(THREADS));
    let (tx, rx) = std::sync::mpsc::channel::<pinpool::PinnedBuffer>();
    let rx = Arc::new(Mutex::new(rx));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (pool, live, start, tx, rx) = (
                pool.clone(),
                live.clone(),
                start.clone(),
                tx.clone(),
                rx.clone(),
            );
            std::thread::spawn(move || {
                start.wait();
                for i in 0..ROUNDS {
                    let size = 1 << (6 + (t + i) % 12);
                    let mut buf = pool.take_on((t + i) % 2, size).unwrap();
                    assert!(all_zero(&buf), "taken buffer not zeroed");
                    assert!(
                        live.lock().unwrap().insert(buf.as_ptr() as usize),
                        "buffer handed out twice"
                    );
                    let n = buf.len().min(64);
                    buf[..n].fill(0xFF);
                    buf.set_dirty_len(n);
                    live.lock().unwrap().remove(&(buf.as_ptr() as usize));
                    if i % 3 == 0 {
                        tx.send(buf).unwrap(); // dropped by another thread
                    } else {
                        drop(buf);
                    }
                    if let Ok(other) = rx.lock().unwrap().try_recv() {
                        drop(other);
                    }
                }
            })
        })
        .collect();
    drop(tx);
    for w in workers {
        w.join().unwrap();
    }
    for buf in rx.lock().unwrap().try_iter() {
        drop(buf);
    }
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.hits + stats.misses, (THREADS * ROUNDS) as u64);
    assert_eq!(stats.in_cleaner, 0);
    assert_eq!(
        stats.recycled,
        stats.misses + stats.hits - (stats.released - stats.evictions)
    );
    assert!(stats.hit_rate() > 0.5, "hit rate {}", stats.hit_rate());
}

#[test]
fn tight_take_drop_loop_keeps_hitting_without_growing() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 20_000;
    let pool = host_pool(1);
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                for _ in 0..ROUNDS {
                    let mut buf = pool.take(4096);
                    buf[..64].fill(1);
                    buf.set_dirty_len(64);
                }
            });
        }
    });
    pool.flush();
    let stats = pool.stats();
    assert!(stats.hit_rate() > 0.99, "hit rate {}", stats.hit_rate());
    assert!(
        stats.misses <= 64 * THREADS as u64,
        "{} misses: buffers in circulation grew instead of being reused",
        stats.misses
    );
    assert_eq!(stats.in_cleaner, 0);
}
