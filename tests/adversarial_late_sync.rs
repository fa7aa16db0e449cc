//! A closed pool's late event-less pinned buffers: their device synchronize
//! runs on a spawned thread, one per device at a time; a failure is handed
//! to the next late buffer asking.
#![cfg(feature = "testing")]

mod adversarial_util;

use std::sync::Arc;
use std::time::Duration;

use adversarial_util::{eventually, within};
use pinpool::testing::Faults;
use pinpool::{PinnedBuffer, Pool};

fn pool_with(faults: &Arc<Faults>, workers: usize, devices: usize) -> Pool {
    Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(workers)
        .devices(devices)
        .provision(false)
        .build()
        .unwrap()
}

/// `n` pooled (pinned) buffers of `pool` on `device`.
fn pinned(pool: &Pool, device: usize, n: usize) -> Vec<PinnedBuffer> {
    let first: Vec<_> = (0..n)
        .map(|_| pool.take_on(device, 1 << 16).unwrap())
        .collect();
    drop(first);
    pool.flush();
    let bufs: Vec<_> = (0..n)
        .map(|_| pool.take_on(device, 1 << 16).unwrap())
        .collect();
    assert!(bufs.iter().all(|b| b.is_pinned() && b.was_pooled()));
    bufs
}

/// Waits until `f` stops changing for `quiet`.
fn settle(limit: Duration, quiet: Duration, f: impl Fn() -> u64) -> u64 {
    let deadline = std::time::Instant::now() + limit;
    let mut last = f();
    let mut since = std::time::Instant::now();
    while std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        let now = f();
        if now != last {
            last = now;
            since = std::time::Instant::now();
        } else if since.elapsed() >= quiet {
            return now;
        }
    }
    last
}

/// x is dropped (late) while the synchronize for y is held: only a later
/// synchronize covers x, and every later one fails, so x must be leaked.
#[test]
fn late_sync_started_before_the_drop_does_not_cover_it() {
    let faults = Arc::new(Faults::default());
    let pool = pool_with(&faults, 1, 1);
    let mut bufs = pinned(&pool, 0, 2);
    let x = bufs.pop().unwrap();
    let y = bufs.pop().unwrap();
    drop(pool);
    let c0 = faults.synchronize_calls();
    faults.hold_synchronize();
    drop(y);
    std::thread::sleep(Duration::from_millis(300));
    faults.fail_synchronize(&(c0 + 2..c0 + 100_000).collect::<Vec<_>>());
    drop(x);
    std::thread::sleep(Duration::from_millis(300));
    let unregistered_while_held = faults.unregistered();
    faults.release();
    let registered = faults.registered();
    let unreg = settle(Duration::from_secs(5), Duration::from_millis(500), || {
        faults.unregistered()
    });
    assert_eq!(
        unregistered_while_held, 0,
        "unregistered while the synchronize was held"
    );
    assert_eq!(
        unreg,
        registered - 1,
        "y retired, x must be leaked ({} synchronize calls)",
        faults.synchronize_calls() - c0
    );
    assert!(
        eventually(Duration::from_secs(5), || Arc::strong_count(&faults) == 1),
        "the closed pool's state was never let go ({} refs)",
        Arc::strong_count(&faults)
    );
}

/// Every synchronize fails: each late buffer must end up leaked (none waits
/// forever, the pool's state is let go).
#[test]
fn every_late_sync_fails_all_late_buffers_end() {
    let faults = Arc::new(Faults::default());
    let pool = pool_with(&faults, 2, 1);
    let bufs = pinned(&pool, 0, 16);
    drop(pool);
    let c0 = faults.synchronize_calls();
    faults.fail_synchronize(&(c0 + 1..c0 + 100_000).collect::<Vec<_>>());
    let registered = faults.registered();
    drop(bufs);
    assert!(
        eventually(Duration::from_secs(8), || Arc::strong_count(&faults) == 1),
        "late buffers still waiting ({} refs, {} synchronize calls, {} unregistered of {})",
        Arc::strong_count(&faults),
        faults.synchronize_calls() - c0,
        faults.unregistered(),
        registered
    );
    assert_eq!(
        faults.unregistered(),
        0,
        "a buffer whose synchronize failed was unregistered"
    );
    let calls = settle(Duration::from_secs(3), Duration::from_millis(500), || {
        faults.synchronize_calls()
    });
    assert!(
        calls - c0 <= 16,
        "{} synchronize calls for 16 buffers",
        calls - c0
    );
}

/// Every other synchronize fails, buffers dropped from several threads on two
/// devices, some while synchronizes are held: everything ends, and no more
/// buffers are leaked than synchronizes failed.
#[test]
fn late_buffers_on_two_devices_with_failing_syncs_all_end() {
    within(Duration::from_secs(20), "late buffers", || {
        let faults = Arc::new(Faults::default());
        let pool = pool_with(&faults, 2, 2);
        let mut bufs = pinned(&pool, 0, 12);
        bufs.extend(pinned(&pool, 1, 12));
        drop(pool);
        let c0 = faults.synchronize_calls();
        let fails: Vec<u64> = (c0 + 1..c0 + 1000).filter(|n| n % 2 == 0).collect();
        faults.fail_synchronize(&fails);
        let registered = faults.registered();
        faults.hold_synchronize();
        let mut threads = Vec::new();
        for chunk in bufs
            .chunks_mut(6)
            .map(|c| c.iter_mut().map(|_| ()).count())
            .collect::<Vec<_>>()
        {
            let part: Vec<_> = bufs.drain(..chunk.min(bufs.len())).collect();
            threads.push(std::thread::spawn(move || {
                for b in part {
                    drop(b);
                    std::thread::sleep(Duration::from_millis(5));
                }
            }));
        }
        std::thread::sleep(Duration::from_millis(200));
        faults.release();
        for t in threads {
            t.join().unwrap();
        }
        let ok = eventually(Duration::from_secs(8), || Arc::strong_count(&faults) == 1);
        let calls = faults.synchronize_calls() - c0;
        let failed = (c0 + 1..=c0 + calls).filter(|n| n % 2 == 0).count() as u64;
        let leaked = registered - faults.unregistered();
        assert!(
            ok,
            "late buffers still waiting ({} refs, {calls} calls, {leaked} not unregistered)",
            Arc::strong_count(&faults)
        );
        assert!(
            leaked <= failed,
            "{leaked} leaked but only {failed} synchronizes failed"
        );
    });
}
