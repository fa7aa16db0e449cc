//! Closing a pool (dropping its last handle) while a large buffer waits
//! in the cleaner's parking for its copy. Its own test binary: the failure
//! it shows ends in a use after free.
//!
//! The close drains the cleaner on the closing thread. A parked buffer
//! whose copy finishes meanwhile is zeroed there; above the chunk size that
//! means chunk jobs on the lanes, which the drain must run too (seen
//! failing before the fix: they were left on the lanes, the buffer was
//! never unregistered, and its job outlived the pool's caches).
#![cfg(feature = "testing")]

mod adversarial_util;

use std::time::Duration;

use adversarial_util::{eventually, faulty};
use pinpool::testing::TestFence;

#[test]
fn closing_with_a_parked_large_buffer_loses_it() {
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
