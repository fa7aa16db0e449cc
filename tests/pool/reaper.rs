//! A closed pool's late buffers go to the reaper, one process-wide thread.
//! An event-less pinned one needs a device synchronize first, which runs
//! on a spawned thread (one per device at a time), so one closed pool's
//! slow synchronize holds up no other's late buffers; a failure is handed
//! to the next late buffer asking.

use std::sync::Arc;
use std::time::Duration;

use pinpool::testing::{Faults, TestFence};
use pinpool::{PinnedBuffer, Pool};

use crate::common::{eventually, faulty, within};

/// A pinned buffer dropped (without events) after the last pool handle is
/// gone goes to the reaper, which must synchronize the device before it
/// unregisters the buffer, as the cleaner would (seen failing before the
/// fix: the reaper looked only at fences and unregistered at once).
#[test]
fn late_eventless_pinned_buffer_is_not_unregistered_before_a_device_sync() {
    let (pool, faults) = faulty(1);
    drop(pool.take(1 << 16));
    pool.flush();
    let buf = pool.take(1 << 16);
    assert!(buf.is_pinned() && buf.was_pooled());
    drop(pool); // closes: `buf` is outstanding, the reaper keeps the pool
    faults.hold_synchronize();
    let syncs_before = faults.synchronize_calls();
    drop(buf); // late: a raw copy (no recorded event) may still read it
    std::thread::sleep(Duration::from_millis(300));
    let unregistered_while_held = faults.unregistered();
    let syncs_while_held = faults.synchronize_calls() - syncs_before;
    faults.release();
    // Eventually it must be released one way or another.
    assert!(
        eventually(Duration::from_secs(5), || faults.unregistered()
            == faults.registered()),
        "the late buffer was never released"
    );
    assert_eq!(
        unregistered_while_held, 0,
        "the reaper unregistered (and unmapped) an event-less pinned buffer \
         without a device synchronize ({syncs_while_held} synchronize calls \
         completed meanwhile): a copy may still be reading it"
    );
}

fn one_worker_pool(faults: &Arc<Faults>) -> Pool {
    Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(1)
        .build()
        .unwrap()
}

/// A pooled (pinned) buffer of `pool`.
fn pinned_one(pool: &Pool) -> pinpool::PinnedBuffer {
    drop(pool.take(1 << 16));
    pool.flush();
    let buf = pool.take(1 << 16);
    assert!(buf.is_pinned() && buf.was_pooled());
    buf
}

/// The reaper is one process-wide thread. A late event-less pinned buffer
/// needs a device synchronize, which runs off the reaper's thread, so one
/// closed pool's slow synchronize holds up no other closed pool's late
/// buffers (seen failing before the fix: pool B's buffer, its fence
/// complete, waited behind pool A's held synchronize).
#[test]
fn one_pools_slow_late_sync_holds_up_another_pools_late_buffers() {
    let fa = Arc::new(Faults::default());
    let fb = Arc::new(Faults::default());
    let a = one_worker_pool(&fa);
    let b = one_worker_pool(&fb);
    let buf_a = pinned_one(&a);
    let mut buf_b = pinned_one(&b);
    // B's buffer has an event that has already completed: nothing to wait for.
    let fence = TestFence::default();
    fence.record(&mut buf_b);
    fence.complete();
    drop(a);
    drop(b);
    // A's device is busy (a long kernel, say): its synchronize does not return.
    fa.hold_synchronize();
    drop(buf_a); // late, event-less: the reaper synchronizes A's device
    std::thread::sleep(Duration::from_millis(100));
    drop(buf_b); // late, its copy finished: should be unregistered at once
    let retired = eventually(Duration::from_secs(3), || {
        fb.unregistered() == fb.registered()
    });
    fa.release();
    let later = eventually(Duration::from_secs(5), || {
        fb.unregistered() == fb.registered()
    });
    assert!(later, "pool B's late buffer was never retired");
    assert!(
        retired,
        "pool B's late buffer (its fence complete) waited 3 s behind pool A's \
         held device synchronize on the shared reaper thread"
    );
}

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
fn pinned_on(pool: &Pool, device: usize, n: usize) -> Vec<PinnedBuffer> {
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
    let mut bufs = pinned_on(&pool, 0, 2);
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
    let bufs = pinned_on(&pool, 0, 16);
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
        let mut bufs = pinned_on(&pool, 0, 12);
        bufs.extend(pinned_on(&pool, 1, 12));
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
