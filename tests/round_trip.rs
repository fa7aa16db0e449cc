//! Take, write, drop, take again: sizes, zeroing, dirty length, reuse.

mod common;
use common::{all_zero, host_pool};

#[test]
fn take_rounds_up_to_powers_of_two_and_zero_fills() {
    let pool = pinpool::Pool::builder()
        .backend(pinpool::BackendKind::Host)
        .size_classes(pinpool::SizeClasses::PowersOfTwo)
        .build()
        .unwrap();
    for (min, len) in [
        (0, 1),
        (1, 1),
        (3, 4),
        (1024, 1024),
        (1025, 2048),
        (5 << 20, 8 << 20),
    ] {
        let buf = pool.take(min);
        assert_eq!(buf.len(), len, "take({min})");
        assert!(all_zero(&buf), "take({min}) not zeroed");
        assert!(!buf.is_pinned(), "the host backend never pins");
    }
}

#[test]
fn fine_classes_are_at_most_an_eighth_over_above_a_page() {
    let pool = host_pool(1);
    for (min, len) in [
        (0, 1),
        (3, 4),
        (4096, 4096),
        (4097, 4608),
        (5 << 20, 5 << 20),
        ((5 << 20) + 1, (5 << 20) + (512 << 10)),
    ] {
        let buf = pool.take(min);
        assert_eq!(buf.len(), len, "take({min})");
        assert!(all_zero(&buf), "take({min}) not zeroed");
    }
}

#[test]
fn recycled_buffer_is_reused_and_rezeroed() {
    let pool = host_pool(1);
    let mut buf = pool.take(8192);
    let ptr = buf.as_ptr();
    buf.fill(0xAB);
    drop(buf);
    pool.flush();
    let buf = pool.take(8192);
    assert_eq!(buf.as_ptr(), ptr, "a pool hit reuses the allocation");
    assert!(all_zero(&buf), "recycled buffer not re-zeroed");
    let stats = pool.stats();
    assert_eq!((stats.hits, stats.misses), (1, 1));
    assert_eq!(stats.recycled, 1);
    assert_eq!(stats.bytes_zeroed, 8192);
}

#[test]
fn dirty_len_limits_rezeroing_and_is_clamped() {
    let pool = host_pool(1);
    let mut buf = pool.take(1 << 16);
    buf[..100].fill(7);
    buf.set_dirty_len(100);
    assert_eq!(buf.dirty_len(), 100);
    drop(buf);
    pool.flush();
    assert_eq!(pool.stats().bytes_zeroed, 100);

    let mut buf = pool.take(1 << 16);
    assert!(all_zero(&buf));
    buf.fill(9);
    buf.set_dirty_len(usize::MAX);
    assert_eq!(buf.dirty_len(), 1 << 16, "past the end clamps to len()");
    drop(buf);
    pool.flush();
    assert!(all_zero(&pool.take(1 << 16)));
}

#[test]
fn large_buffers_are_cleaned_in_chunks_completely() {
    let pool = host_pool(1);
    let mut buf = pool.take(64 << 20);
    buf.fill(0x5A);
    let ptr = buf.as_ptr();
    drop(buf);
    pool.flush();
    let buf = pool.take(64 << 20);
    assert_eq!(buf.as_ptr(), ptr);
    assert!(
        all_zero(&buf),
        "some chunk of a large buffer was not re-zeroed"
    );
}

#[test]
fn global_free_functions_work() {
    let mut buf = pinpool::take(3);
    assert_eq!(buf.len(), 4);
    buf[0] = 1;
    drop(buf);
    pinpool::Pool::global().flush();
    assert!(all_zero(&pinpool::take(4)));
    pinpool::clear();
    pinpool::set_max_pooled_bytes(pinpool::DEFAULT_MAX_POOLED_BYTES);
    let mut region = vec![0u8; 4096];
    // SAFETY: `region` is live until after unregister_region.
    let pinned = unsafe { pinpool::register_region(region.as_mut_ptr(), region.len()) };
    if pinned {
        // SAFETY: registered just above; nothing is copying from it.
        unsafe { pinpool::unregister_region(region.as_mut_ptr()) };
    }
    assert_eq!(
        pinned,
        pinpool::Pool::global().backend() == pinpool::BackendKind::Cuda
    );
}

#[test]
fn typed_views_cover_whole_elements() {
    let pool = host_pool(1);
    let mut buf = pool.take(10); // 16 bytes
    buf.typed_mut::<u64>()[1] = u64::MAX;
    assert_eq!(buf.typed::<u64>().len(), 2);
    assert_eq!(
        buf.typed::<[u8; 3]>().len(),
        5,
        "the 1-byte tail is left out"
    );
    assert!(buf[..8].iter().all(|&b| b == 0) && buf[8..].iter().all(|&b| b == 0xFF));
}

#[test]
fn an_empty_class_borrows_an_idle_buffer_of_a_slightly_larger_one() {
    let pool = pinpool::Pool::builder()
        .backend(pinpool::BackendKind::Host)
        .build()
        .unwrap();
    // A 9 MiB buffer pooled; an 8 MiB take may borrow it (12.5% larger).
    drop(pool.take(9 << 20));
    pool.flush();
    let buf = pool.take(8 << 20);
    assert!(buf.was_pooled());
    assert_eq!(buf.len(), 8 << 20, "the take shows its own class's length");
    assert_eq!(buf.capacity(), 9 << 20, "the buffer keeps its class");
    drop(buf);
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.borrowed, 1);
    assert!(
        pool.take(9 << 20).was_pooled(),
        "it went back to its own class"
    );
    // Beyond the slack: a 4 MiB take does not borrow the 9 MiB buffer.
    pool.flush();
    assert!(!pool.take(4 << 20).was_pooled());
    let strict = pinpool::Pool::builder()
        .backend(pinpool::BackendKind::Host)
        .borrow_slack(0)
        .build()
        .unwrap();
    drop(strict.take(9 << 20));
    strict.flush();
    assert!(!strict.take(8 << 20).was_pooled(), "borrowing off");
}
