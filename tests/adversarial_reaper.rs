//! The reaper is one process-wide thread. A late event-less pinned buffer
//! needs a device synchronize, which runs off the reaper's thread, so one
//! closed pool's slow synchronize holds up no other closed pool's late
//! buffers (seen failing before the fix: pool B's buffer, its fence
//! complete, waited behind pool A's held synchronize).
#![cfg(feature = "testing")]

mod adversarial_util;

use std::sync::Arc;
use std::time::Duration;

use adversarial_util::eventually;
use pinpool::testing::{Faults, TestFence};
use pinpool::Pool;

fn pool_with(faults: &Arc<Faults>) -> Pool {
    Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(1)
        .build()
        .unwrap()
}

/// A pooled (pinned) buffer of `pool`.
fn pinned(pool: &Pool) -> pinpool::PinnedBuffer {
    drop(pool.take(1 << 16));
    pool.flush();
    let buf = pool.take(1 << 16);
    assert!(buf.is_pinned() && buf.was_pooled());
    buf
}

#[test]
fn one_pools_slow_late_sync_holds_up_another_pools_late_buffers() {
    let fa = Arc::new(Faults::default());
    let fb = Arc::new(Faults::default());
    let a = pool_with(&fa);
    let b = pool_with(&fb);
    let buf_a = pinned(&a);
    let mut buf_b = pinned(&b);
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
