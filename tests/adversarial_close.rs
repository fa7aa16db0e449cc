//! Adversarial: closing a pool (dropping its last handle) while a large
//! buffer waits in the cleaner's parking for its copy. Its own test binary:
//! the failure it shows ends in a use after free.
//!
//! `Shared::close` runs `Cleaner::drain_inline`, which pops queued jobs and
//! then polls the parked buffers once. A parked buffer whose copy finished
//! meanwhile is `prepare`d there; above `CHUNK` (4 MiB) of dirty bytes that
//! means pushing `Job::Chunk`s onto the lanes, which nobody drains any
//! more. The buffer is then neither in `take_parked`, nor pooled, nor
//! counted as outstanding; when the pool's `Shared` is dropped, its
//! `caches` (declared before `cleaner`) are freed first, and the chunk
//! job's `Returned::drop` writes into them.
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
