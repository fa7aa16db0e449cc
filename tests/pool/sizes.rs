//! Sizes: a take rounds up to its size class and is never empty; sizes and
//! devices out of range are errors or clear panics.

use pinpool::{BackendKind, Error, Pool, SizeClasses, MAX_CLASS_SIZE};

use crate::common::{all_zero, host_pool};

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
fn oversized_requests_are_errors() {
    let pool = host_pool(1);
    for size in [MAX_CLASS_SIZE + 1, usize::MAX] {
        match pool.try_take(size) {
            Err(Error::SizeTooLarge { requested, max }) => {
                assert_eq!((requested, max), (size, MAX_CLASS_SIZE));
            }
            other => panic!("try_take({size}) gave {other:?}"),
        }
    }
}

#[test]
#[should_panic(expected = "more than the largest size class")]
fn take_of_usize_max_panics_clearly() {
    let _ = host_pool(1).take(usize::MAX);
}

/// Zero and huge sizes: never an empty buffer, clear errors and panics.
#[test]
fn zero_and_huge_sizes() {
    for classes in [SizeClasses::Fine, SizeClasses::PowersOfTwo] {
        let pool = Pool::builder()
            .backend(BackendKind::Host)
            .size_classes(classes)
            .cleaner_threads(1)
            .build()
            .unwrap();
        let b = pool.take(0);
        assert!(!b.is_empty(), "take(0) handed out an empty buffer");
        assert!(all_zero(&b));
        drop(b);
        assert_eq!(pool.take(3).len(), 4);
        assert!(pool.take(4097).len() >= 4097);
        for bad in [MAX_CLASS_SIZE + 1, usize::MAX, usize::MAX / 2] {
            assert!(pool.try_take(bad).is_err(), "try_take({bad})");
            let p = pool.clone();
            let msg =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(p.take(bad))))
                    .expect_err("take of a size above the largest class must panic");
            let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(msg.contains("pinpool"), "unclear panic: {msg:?}");
        }
        // The largest class cannot be mapped here: a clear error, no panic.
        match pool.try_take(MAX_CLASS_SIZE) {
            Ok(b) => assert_eq!(b.len(), MAX_CLASS_SIZE),
            Err(e) => assert!(
                matches!(e, pinpool::Error::AllocationFailed { .. }),
                "not a clear allocation error: {e}"
            ),
        }
        pool.flush();
        assert_eq!(pool.stats().in_cleaner, 0);
    }
}

#[test]
fn sizes_at_the_edges() {
    let pool = host_pool(1);
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
