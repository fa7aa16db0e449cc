//! Borrowing against the contract's exact lengths: "`take(min)` returns an
//! all-zero buffer whose `len()` is its size class ... powers of two with
//! `SizeClasses::PowersOfTwo` (the seed's exact lengths: `take(3).len() ==
//! 4`)". A take served by a larger idle class's buffer shows its own
//! class's length; `capacity()` tells the bytes it occupies (seen failing
//! before the fix: with a 100% slack, `take(3)` came back 8 bytes long).
#![cfg(feature = "testing")]

mod adversarial_util;

use pinpool::{BackendKind, Pool, SizeClasses};

fn pool(classes: SizeClasses) -> Pool {
    Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(1)
        .size_classes(classes)
        .provision(false)
        .build()
        .unwrap()
}

/// With powers-of-two classes a 100% slack lets every class borrow the next
/// one: take(3) may come back 8 bytes long (with 25% no pow2 class could
/// borrow at all).
#[test]
fn pow2_take_keeps_the_seeds_exact_length() {
    let pool = pool(SizeClasses::PowersOfTwo);
    drop(pool.take(8));
    pool.flush();
    let buf = pool.take(3);
    assert_eq!(
        buf.len(),
        4,
        "take(3) on a pow2 pool returned a borrowed {}-byte buffer",
        buf.len()
    );
    assert!(
        buf.was_pooled() && buf.capacity() == 8,
        "the idle 8-byte buffer was borrowed"
    );
    drop(buf);
    pool.flush();
    let again = pool.take(8);
    assert!(
        again.was_pooled(),
        "the borrowed buffer went back to its own class"
    );
    assert_eq!((again.len(), again.capacity()), (8, 8));
}

/// The default (fine) classes are powers of two below a page: the same
/// happens there, e.g. take(3) -> 8 bytes, take(2048) -> 4096.
#[test]
fn fine_sub_page_take_keeps_its_class_length() {
    let pool = pool(SizeClasses::Fine);
    drop(pool.take(4096));
    pool.flush();
    let buf = pool.take(2048);
    assert!(
        buf.was_pooled() && buf.capacity() == 4096,
        "the idle 4096-byte buffer was borrowed"
    );
    assert_eq!(
        buf.len(),
        2048,
        "take(2048) returned a borrowed {}-byte buffer",
        buf.len()
    );
}

/// The seed's usage pattern: copy_from_slice of exactly the class length.
#[test]
fn pow2_copy_of_the_class_length_does_not_panic() {
    let pool = pool(SizeClasses::PowersOfTwo);
    drop(pool.take(8));
    pool.flush();
    let mut buf = pool.take(3);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        buf.copy_from_slice(&[1, 2, 3, 4]);
    }));
    assert!(
        r.is_ok(),
        "copy_from_slice(&[1,2,3,4]) into take(3) panicked (len {})",
        buf.len()
    );
}

/// Control (passes): with the old 25% slack no pow2 class can borrow.
#[test]
fn control_pow2_with_25_percent_slack_keeps_exact_length() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(1)
        .size_classes(SizeClasses::PowersOfTwo)
        .provision(false)
        .borrow_slack(25)
        .build()
        .unwrap();
    drop(pool.take(8));
    pool.flush();
    assert_eq!(pool.take(3).len(), 4);
}
