//! The device-synchronize fallback for pinned buffers dropped
//! without events. The contract: "memory whose copies are not known to have
//! finished is leaked (counted), never unregistered or unmapped". With the
//! fault backend's `hold_synchronize`, a device synchronize that has not
//! returned means the copies are not known to have finished, so no
//! unregistration may happen while it is held.
#![cfg(feature = "testing")]

mod adversarial_util;

use std::time::Duration;

use adversarial_util::{eventually, faulty, within};
use pinpool::testing::TestFence;

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

/// A pinned, event-less buffer released because the zeroing backlog is
/// full still waits for a device synchronize that started after its drop
/// (seen failing before the fix: the release branch took no note of the
/// synchronizes started, so an earlier one counted).
#[test]
fn zero_backlog_release_of_eventless_pinned_buffer_skips_the_device_sync() {
    const BIG: usize = 80 << 20; // above the 64 MiB zero backlog of a small cap
    let (pool, faults) = faulty(1);
    // Pin the big buffer (its first trip registers it) and a small one.
    drop(pool.take(BIG));
    drop(pool.take(1 << 16));
    pool.flush();
    let big = pool.take(BIG);
    assert!(
        big.is_pinned(),
        "the big buffer was pinned on its first trip"
    );
    // One device synchronize completes (the small buffer, event-less).
    let small = pool.take(1 << 16);
    assert!(small.is_pinned());
    drop(small);
    pool.flush();
    assert!(faults.synchronize_calls() >= 1);
    // A small cap: the zero backlog limit is now 64 MiB, below the big
    // buffer's dirty prefix, so its drop takes the "release" branch.
    pool.set_max_pooled_bytes(1 << 20);
    faults.hold_synchronize();
    let unregistered_before = faults.unregistered();
    drop(big); // event-less pinned: needs a synchronize that starts now
    std::thread::sleep(Duration::from_millis(300));
    let unregistered_while_held = faults.unregistered() - unregistered_before;
    let syncs_while_held = faults.synchronize_calls();
    faults.release();
    let skipped = pool.stats().zeroing_skipped;
    within(Duration::from_secs(10), "flush", move || pool.flush());
    assert_eq!(skipped, 1, "the drop took the zero-backlog branch");
    let _ = syncs_while_held;
    assert_eq!(
        unregistered_while_held, 0,
        "a pinned buffer dropped without events was unregistered while every \
         device synchronize was still held (stale sync_gen note)"
    );
}

/// "One slow event must not hold up unrelated buffers": a device
/// synchronize for one event-less buffer blocks the worker running it; a
/// second event-less buffer of that device waits parked instead of
/// blocking another worker, which stays free for a buffer whose own copy
/// has finished (seen failing before the fix: both workers blocked).
#[test]
fn a_slow_device_sync_holds_up_every_worker() {
    let (pool, faults) = faulty(2);
    // Pin two small buffers and a 1 MiB one.
    let bufs: Vec<_> = (0..2).map(|_| pool.take(1 << 16)).collect();
    let big = pool.take(1 << 20);
    drop(bufs);
    drop(big);
    pool.flush();
    let bufs: Vec<_> = (0..2).map(|_| pool.take(1 << 16)).collect();
    let mut fenced = pool.take(1 << 20);
    assert!(bufs.iter().all(|b| b.is_pinned()) && fenced.is_pinned());
    let fence = TestFence::default();
    fence.record(&mut fenced);
    fence.complete(); // its copy is done: it is ready to recycle
    faults.hold_synchronize();
    drop(bufs); // two event-less pinned buffers: two workers wanted
    std::thread::sleep(Duration::from_millis(50));
    let before = pool.stats().recycled;
    drop(fenced); // 1 MiB dirty: goes to the cleaner, which should recycle it
    let recycled = eventually(Duration::from_millis(500), || {
        pool.stats().recycled > before
    });
    faults.release();
    within(Duration::from_secs(10), "flush", move || pool.flush());
    assert!(
        recycled,
        "a buffer whose copy had finished waited behind a device synchronize \
         of unrelated buffers (every worker was blocked)"
    );
}
