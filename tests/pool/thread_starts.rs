//! Threads that cannot start: cleaner workers (the pool cleans on flush and
//! tries again later), some of them (the one started serves every lane),
//! a late synchronize's thread (the reaper runs it), and the reaper itself
//! (a closed pool keeps its state for its buffers until a later close
//! starts it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pinpool::testing::Faults;
use pinpool::Pool;

use crate::common::{eventually, in_child, pinned, within};

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
    within(Duration::from_secs(10), "flush without workers", {
        let pool = pool.clone();
        move || pool.flush()
    });
    assert!(pool.take(1 << 16).was_pooled());
    assert!(faults.spawn_failures() >= 2);
    faults.allow_spawn();
    drop(pool.take(8 << 20)); // a miss: starts the workers
                              // No flush: only a worker can clean the drop (the regions grow for
                              // it first, which took more than 100 ms once on a slow box).
    let cleaned = eventually(Duration::from_secs(10), || pool.stats().in_cleaner == 0);
    assert!(
        cleaned,
        "a worker should have cleaned the drop: {:#?}",
        pool.stats()
    );
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
    within(Duration::from_secs(10), "flush with one worker of three", {
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
    if let Some(output) = in_child(
        module_path!(),
        TEST,
        &[("RUST_MIN_STACK", "140737488355328")],
    ) {
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
    if in_child(module_path!(), TEST, &[]).is_some() {
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
