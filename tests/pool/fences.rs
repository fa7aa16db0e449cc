//! Fences: a buffer whose copy has not finished is held back while others
//! flow; one whose copy could not be waited for is leaked, never freed.

use std::time::{Duration, Instant};

use pinpool::testing::TestFence;

use crate::common::{faulty, faulty_on, pinned};

#[test]
fn late_fence_holds_the_buffer_back_and_others_flow() {
    use pinpool::testing::TestFence;
    let (pool, _faults) = faulty_on(1);
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

/// A buffer whose copies could not be waited for (the fence failed) must
/// not go back to the allocator: it is leaked, never unregistered.
#[test]
fn failed_fence_leaks_the_buffer_instead_of_freeing_it() {
    let (pool, faults) = faulty(1);
    drop(pool.take(1 << 16));
    pool.flush();
    let mut buf = pool.take(1 << 16);
    assert!(buf.is_pinned());
    let fence = TestFence::default();
    fence.record(&mut buf);
    drop(buf);
    fence.fail();
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.fence_failures, 1);
    assert_eq!(stats.pooled_buffers, 0);
    assert_eq!(
        faults.unregistered(),
        0,
        "memory a copy may still read was unregistered"
    );
}
