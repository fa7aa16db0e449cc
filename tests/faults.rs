//! Behaviour under injected faults (the `testing` feature's backend), bad
//! input, allocation failure, and a soak.
#![cfg(feature = "testing")]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pinpool::testing::Faults;
use pinpool::{Error, Pool, MAX_CLASS_SIZE};

fn faulty(devices: usize) -> (Pool, Arc<Faults>) {
    let faults = Arc::new(Faults::default());
    let pool = Pool::builder()
        .faults(faults.clone())
        .devices(devices)
        .cleaner_threads(2)
        .build()
        .unwrap();
    (pool, faults)
}

/// A pinned buffer: a miss, dropped, registered by the cleaner, taken again.
fn pinned(pool: &Pool, size: usize) -> pinpool::PinnedBuffer {
    drop(pool.take(size));
    pool.flush();
    let buf = pool.take(size);
    assert!(buf.is_pinned());
    buf
}

#[test]
fn failed_registration_frees_the_buffer_and_is_counted() {
    let (pool, faults) = faulty(1);
    faults.fail_register(&[1]);
    let mut buf = pool.take(1 << 16);
    buf.fill(3); // usable by its owner as long as it is held
    drop(buf);
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.registration_failures, 1);
    assert_eq!(
        stats.pooled_buffers, 0,
        "an unpinned buffer must not be pooled as pinned"
    );
    assert_eq!(stats.released, 1);
    let again = pinned(&pool, 1 << 16); // the next one registers fine
    assert!(again.iter().all(|&b| b == 0));
}

#[test]
fn panicking_worker_releases_its_buffer_and_the_pool_serves_on() {
    let (pool, faults) = faulty(1);
    faults.panic_register(&[1]);
    drop(pool.take(1 << 16));
    pool.flush(); // returns: the buffer was released, not lost
                  // The panic is counted once the worker has caught it, which may be just
                  // after the unwinding released the buffer and let `flush` return.
    let deadline = Instant::now() + Duration::from_secs(5);
    while pool.stats().worker_panics == 0 {
        assert!(Instant::now() < deadline, "the panic was never counted");
        std::thread::sleep(Duration::from_millis(1));
    }
    let stats = pool.stats();
    assert_eq!(stats.worker_panics, 1);
    assert_eq!(stats.in_cleaner, 0);
    assert_eq!(stats.released, 1);
    let again = pinned(&pool, 1 << 16);
    drop(again);
    pool.flush();
    assert_eq!(pool.stats().pooled_buffers, 1, "the pool kept serving");
}

#[test]
fn failed_unregistration_is_counted() {
    let (pool, faults) = faulty(1);
    drop(pinned(&pool, 1 << 16));
    pool.flush();
    faults.fail_unregister(&[1]);
    pool.clear();
    let stats = pool.stats();
    assert_eq!(stats.unregister_failures, 1);
    assert_eq!(stats.pooled_buffers, 0);
}

#[test]
fn shutdown_unregisters_exactly_what_was_registered() {
    let (pool, faults) = faulty(2);
    let mut live = Vec::new();
    for round in 0..4 {
        for device in 0..2 {
            for shift in [12, 16, 20, 23] {
                live.push(pool.take_on(device, 1 << shift).unwrap());
            }
        }
        if round % 2 == 1 {
            live.clear();
            pool.flush();
        }
    }
    drop(live);
    pool.set_max_pooled_bytes(4 << 20); // evict some
    pool.shutdown();
    assert!(faults.registered() > 0);
    assert_eq!(
        faults.unregistered(),
        faults.registered(),
        "a registration was never undone"
    );
    let stats = pool.stats();
    assert_eq!(
        (stats.pooled_bytes, stats.pooled_buffers, stats.pinned_bytes),
        (0, 0, 0)
    );
}

#[test]
fn sizes_at_the_edges() {
    let pool = common::host_pool(1);
    assert_eq!(
        pool.take(0).len(),
        1,
        "0 bytes is served as the 1-byte class"
    );
    assert_eq!(pool.take(1).len(), 1);
    assert!(matches!(
        pool.try_take(MAX_CLASS_SIZE + 1),
        Err(Error::SizeTooLarge { .. })
    ));
    // The largest class: the OS may refuse 1 TiB (an error) or map it lazily.
    match pool.try_take(MAX_CLASS_SIZE) {
        Ok(buf) => assert_eq!(buf.len(), MAX_CLASS_SIZE),
        Err(Error::AllocationFailed { bytes, .. }) => assert!(bytes >= MAX_CLASS_SIZE),
        Err(other) => panic!("unexpected error {other}"),
    }
}

#[test]
fn builder_rejects_a_cap_below_one_buffer() {
    let built = Pool::builder()
        .backend(pinpool::BackendKind::Host)
        .max_pooled_bytes(100)
        .build();
    assert!(matches!(built, Err(Error::InvalidConfig(_))));
}

#[test]
fn buffer_dropped_during_thread_local_teardown() {
    use std::cell::RefCell;
    thread_local!(static HELD: RefCell<Option<pinpool::PinnedBuffer>> = const { RefCell::new(None) });
    let pool = common::host_pool(1);
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
    assert!(common::all_zero(&pool.take(4096)));
}

/// Many threads over mixed sizes and devices with cross-thread drops for
/// `secs`: every take is zeroed, no two live buffers overlap, and the
/// accounting is exact at the end. Returns the operations done.
fn soak(secs: u64) -> u64 {
    const THREADS: usize = 16;
    let (pool, faults) = faulty(2);
    let live: Arc<Mutex<BTreeMap<usize, usize>>> = Arc::default();
    let (tx, rx) = std::sync::mpsc::channel::<pinpool::PinnedBuffer>();
    let rx = Arc::new(Mutex::new(rx));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let ops: u64 = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (pool, live, tx, rx) = (&pool, live.clone(), tx.clone(), rx.clone());
                scope.spawn(move || {
                    let mut ops = 0u64;
                    let mut i = t;
                    while Instant::now() < deadline {
                        i = i.wrapping_mul(31).wrapping_add(7);
                        let size = 1 << (4 + i % 17);
                        let mut buf = pool.take_on(i % 2, size).unwrap();
                        assert!(buf.iter().all(|&b| b == 0), "a taken buffer was not zeroed");
                        let (start, end) =
                            (buf.as_ptr() as usize, buf.as_ptr() as usize + buf.len());
                        {
                            let mut live = live.lock().unwrap();
                            let overlaps = live
                                .range(..end)
                                .next_back()
                                .is_some_and(|(_, &e)| e > start);
                            assert!(!overlaps, "two live buffers share bytes");
                            live.insert(start, end);
                        }
                        let n = buf.len().min(1 + i % 4096);
                        buf[..n].fill(0xA5);
                        buf.set_dirty_len(n);
                        live.lock().unwrap().remove(&start);
                        if i % 3 == 0 {
                            tx.send(buf).unwrap();
                        } else {
                            drop(buf);
                        }
                        if let Ok(other) = rx.lock().unwrap().try_recv() {
                            drop(other);
                        }
                        ops += 1;
                    }
                    ops
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    drop(tx);
    for buf in rx.lock().unwrap().try_iter() {
        drop(buf);
    }
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.hits + stats.misses, ops);
    assert_eq!(stats.in_cleaner, 0);
    let by_class: usize = stats.per_class.iter().map(|c| c.pooled_buffers).sum();
    assert_eq!(by_class, stats.pooled_buffers);
    assert!(stats.pooled_bytes <= stats.max_pooled_bytes);
    pool.shutdown();
    assert_eq!(
        faults.unregistered(),
        faults.registered(),
        "registrations leaked"
    );
    assert_eq!(pool.stats().pooled_bytes, 0);
    ops
}

#[test]
fn soak_5s() {
    let ops = soak(5);
    println!("soak: {ops} operations in 5 s");
}

#[test]
#[ignore = "60 s; run with --ignored soak"]
fn soak_60s() {
    let ops = soak(60);
    println!("soak: {ops} operations in 60 s");
}

#[test]
fn late_fence_holds_the_buffer_back_and_others_flow() {
    use pinpool::testing::TestFence;
    let (pool, _faults) = faulty(1);
    let mut slow = pinned(&pool, 1 << 16);
    let fence = TestFence::default();
    fence.record(&mut slow);
    drop(slow);
    // An unrelated buffer recycles while the slow one waits.
    let mut quick = pool.take(1 << 12);
    quick.fill(1);
    std::thread::spawn(move || drop(quick)).join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while pool.stats().in_cleaner > 1 {
        assert!(
            Instant::now() < deadline,
            "one slow fence held up an unrelated buffer"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        pool.stats().in_cleaner,
        1,
        "the buffer came back before its fence completed"
    );
    fence.complete();
    pool.flush();
    assert_eq!(pool.stats().in_cleaner, 0);
    assert!(pool.take(1 << 16).was_pooled());
}

/// A pool whose cleaner workers cannot start (the system is out of
/// threads) still works: drops queue without blocking, `flush` cleans on
/// the calling thread, and the next take that misses tries to start them
/// again.
#[test]
fn a_pool_whose_workers_cannot_start_cleans_on_flush() {
    let faults = Arc::new(Faults::default());
    faults.fail_spawn("pinpool-cleaner");
    let pool = Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(2)
        .build()
        .unwrap();
    let buf = pinned(&pool, 1 << 16); // registered by the flush, inline
    drop(buf);
    common::within(Duration::from_secs(10), "flush without workers", {
        let pool = pool.clone();
        move || pool.flush()
    });
    assert!(pool.take(1 << 16).was_pooled());
    assert!(faults.spawn_failures() >= 2);
    faults.allow_spawn();
    drop(pool.take(8 << 20)); // a miss: starts the workers
    std::thread::sleep(Duration::from_millis(100));
    let stats = pool.stats();
    assert_eq!(stats.in_cleaner, 0, "a worker should have cleaned the drop");
}

/// Only worker 0 of three starts (the others cannot): it must serve the
/// registration lane too (it serves only recycling beside other workers),
/// so a miss is registered and a flush returns.
#[test]
fn a_pool_with_only_some_workers_started_still_registers_misses() {
    let faults = Arc::new(Faults::default());
    faults.fail_spawn("pinpool-cleaner-1");
    faults.fail_spawn("pinpool-cleaner-2");
    let pool = Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(3)
        .build()
        .unwrap();
    drop(pool.take(1 << 16));
    common::within(Duration::from_secs(10), "flush with one worker of three", {
        let pool = pool.clone();
        move || pool.flush()
    });
    let buf = pool.take(1 << 16);
    assert!(buf.is_pinned(), "the miss was never registered");
    assert_eq!(faults.registered(), 1);
}

/// A closed pool's late event-less pinned buffer needs a device
/// synchronize, which runs on a thread of its own; if that thread cannot
/// start, the reaper runs it itself, and the buffer is still freed.
#[test]
fn a_late_synchronize_whose_thread_cannot_start_runs_on_the_reaper() {
    let faults = Arc::new(Faults::default());
    faults.fail_spawn("pinpool-late-sync");
    let pool = Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(1)
        .build()
        .unwrap();
    let buf = pinned(&pool, 1 << 16);
    drop(pool);
    let syncs = faults.synchronize_calls();
    drop(buf);
    let deadline = Instant::now() + Duration::from_secs(10);
    while faults.unregistered() < faults.registered() {
        assert!(Instant::now() < deadline, "the late buffer was never freed");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        faults.spawn_failures() >= 1,
        "no late synchronize was tried"
    );
    assert!(faults.synchronize_calls() > syncs);
    // The reaper let the closed pool go: only this handle is left.
    while Arc::strong_count(&faults) > 1 {
        assert!(
            Instant::now() < deadline,
            "the closed pool's state was kept"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Every thread start fails (`RUST_MIN_STACK` asks for a stack no system
/// gives; the test runs alone in a child process, where libtest runs it
/// on the main thread): no cleaner worker and no reaper can start. A
/// closed pool with a buffer out then keeps its state (leaks it, and says
/// so), so that the late drop finds it, instead of freeing it under the
/// buffer.
#[test]
fn a_closed_pool_whose_reaper_cannot_start_keeps_its_state_for_its_buffers() {
    const TEST: &str = "a_closed_pool_whose_reaper_cannot_start_keeps_its_state_for_its_buffers";
    if let Some(output) = common::in_child(TEST, &[("RUST_MIN_STACK", "140737488355328")]) {
        assert!(
            output.contains("could not start the reaper"),
            "the leak was not reported:\n{output}"
        );
        return;
    }
    use tracing_subscriber::util::SubscriberInitExt;
    let _log = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing_subscriber::filter::LevelFilter::ERROR)
        .finish()
        .set_default();
    let faults = Arc::new(Faults::default());
    let pool = Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(2)
        .build()
        .unwrap();
    let buf = pinned(&pool, 1 << 16); // no worker: the flush registered it
    drop(pool);
    assert!(
        faults.spawn_failures() == 0,
        "the test backend refused nothing"
    );
    assert!(
        Arc::strong_count(&faults) > 1,
        "the closed pool's state was freed while a buffer was out"
    );
    drop(buf);
    assert!(
        Arc::strong_count(&faults) > 1,
        "the closed pool's state was freed by a late drop with no reaper"
    );
    assert_eq!(faults.unregistered(), 0, "nothing frees a late buffer here");
}

/// The reaper cannot start at a pool's close; a later close (of another
/// pool) starts it, and it takes over the first pool's late buffers: they
/// are unregistered and freed, and the first pool's state is let go. Alone
/// in a child process, since the reaper is process-wide.
#[test]
fn a_reaper_that_starts_later_takes_over_pools_closed_while_it_could_not() {
    const TEST: &str = "a_reaper_that_starts_later_takes_over_pools_closed_while_it_could_not";
    if common::in_child(TEST, &[]).is_some() {
        return;
    }
    let refused = Arc::new(Faults::default());
    refused.fail_spawn("pinpool-reaper");
    let pool = Pool::builder()
        .faults(refused.clone())
        .cleaner_threads(1)
        .build()
        .unwrap();
    let event_less = pinned(&pool, 1 << 16); // needs a device synchronize
    let fenced = {
        let mut buf = pool.take(1 << 20);
        let fence = pinpool::testing::TestFence::default();
        fence.record(&mut buf);
        fence.complete();
        buf
    };
    drop(pool);
    assert_eq!(refused.spawn_failures(), 1);
    assert!(
        Arc::strong_count(&refused) > 1,
        "the closed pool's state was freed while buffers were out"
    );
    drop(event_less);
    drop(fenced);
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        Arc::strong_count(&refused) > 1,
        "freed with no reaper running"
    );
    assert_eq!(refused.unregistered(), 0);
    let other = Arc::new(Faults::default());
    drop(Pool::builder().faults(other.clone()).build().unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while Arc::strong_count(&refused) > 1 {
        assert!(
            Instant::now() < deadline,
            "the reaper never took over the first pool's late buffers"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(refused.unregistered(), refused.registered());
}

/// A copy pipeline deeper than the cleaner's recycling backlog: more
/// pinned buffers wait for their copies at once than the backlog holds
/// queued. The waiting ones are parked, not queued, so they must not fill
/// the backlog: no later drop is shed, and every buffer comes back pinned.
#[test]
fn copies_in_flight_past_the_recycling_backlog_keep_their_pinned_buffers() {
    use pinpool::testing::TestFence;
    // Past the recycling backlog (4096 buffers).
    const N: usize = 5000;
    let faults = Arc::new(Faults::default());
    let pool = Pool::builder()
        .faults(faults)
        .cleaner_threads(2)
        .provision(false)
        .max_pooled_bytes(256 << 20)
        .thread_cache_bytes(0)
        .build()
        .unwrap();
    pool.reserve(0, &[(4096, N)]).unwrap();
    pool.flush();
    assert_eq!(pool.stats().pooled_buffers, N);
    let mut bufs: Vec<_> = (0..N).map(|_| pool.take(4096)).collect();
    assert!(bufs.iter().all(|b| b.is_pinned() && b.was_pooled()));
    let fence = TestFence::default();
    for buf in &mut bufs {
        fence.record(buf);
    }
    // Dropped in batches the cleaner parks as they come (a batch never
    // fills the queue on its own).
    while !bufs.is_empty() {
        let rest = bufs.split_off(bufs.len().saturating_sub(500));
        drop(rest);
        std::thread::sleep(Duration::from_millis(50));
    }
    fence.complete();
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.zeroing_skipped, 0, "drops were shed: {stats:#?}");
    assert_eq!(stats.pooled_buffers, N, "{stats:#?}");
    assert_eq!(stats.pinned_bytes, (N * 4096) as u64);
}
