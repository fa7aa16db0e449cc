//! Borrowing: a take that finds its class empty may be served by an idle
//! buffer of a slightly larger class. Against the contract's exact lengths
//! ("`take(min)` returns an all-zero buffer whose `len()` is its size class
//! ... powers of two with `SizeClasses::PowersOfTwo` (the seed's exact
//! lengths: `take(3).len() == 4`)"), a borrowed buffer shows its own
//! class's length; `capacity()` tells the bytes it occupies (seen failing
//! before the fix: with a 100% slack, `take(3)` came back 8 bytes long).

#[cfg(feature = "testing")]
use std::collections::HashSet;
#[cfg(feature = "testing")]
use std::sync::{Arc, Mutex};
#[cfg(feature = "testing")]
use std::time::{Duration, Instant};

#[cfg(feature = "testing")]
use pinpool::testing::Faults;
use pinpool::{BackendKind, Pool, SizeClasses};

#[cfg(feature = "testing")]
use crate::common::{all_zero, faulty_with_classes, state_freed, within};

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

/// A borrowed buffer shows its requested class's length, keeps its
/// capacity, and its take and drop balance in the counts; a buffer of the
/// larger class taken afterwards (the same block, reused from the owner's
/// lists) shows the full length and is all zero.
#[cfg(feature = "testing")]
#[test]
fn borrowed_buffer_shows_its_class_and_balances() {
    let (pool, faults) = faulty_with_classes(1, SizeClasses::PowersOfTwo);
    let mut takes = 0u64;
    // A pinned 8 KiB buffer, ready.
    drop(pool.take(8192));
    takes += 1;
    pool.flush();
    let mut borrowed = 0;
    for round in 0..50 {
        let mut b = pool.take(4096);
        takes += 1;
        assert_eq!(b.len(), 4096, "round {round}");
        assert!(all_zero(&b), "round {round}: borrowed buffer not zero");
        if b.capacity() == 8192 {
            borrowed += 1;
        }
        assert_eq!(b.dirty_len(), 4096, "round {round}");
        b.set_dirty_len(1 << 20);
        assert_eq!(
            b.dirty_len(),
            4096,
            "round {round}: dirty past the shown length"
        );
        b.fill(0xEE);
        assert_eq!(b.typed::<u64>().len(), 512);
        drop(b);
        pool.flush();
        let mut c = pool.take(8192);
        takes += 1;
        assert_eq!(
            c.len(),
            8192,
            "round {round}: an 8 KiB take shows {}",
            c.len()
        );
        assert!(all_zero(&c), "round {round}: 8 KiB buffer not zero");
        c[..].fill(1);
        drop(c);
        pool.flush();
    }
    assert!(borrowed > 0, "no take borrowed");
    let s = pool.stats();
    assert_eq!(s.hits + s.misses, takes, "{s:?}");
    assert_eq!(s.in_cleaner, 0, "{s:?}");
    drop(pool);
    assert!(
        state_freed(&faults, Duration::from_secs(5)),
        "pool with nothing out kept its state: the close counted a buffer out ({} refs)",
        Arc::strong_count(&faults)
    );
}

/// Flushes, then checks the statistics of a quiet pool.
#[cfg(feature = "testing")]
fn check_quiet(pool: &Pool, what: &str) {
    let p = pool.clone();
    within(Duration::from_secs(10), "flush", move || p.flush());
    let s = pool.stats();
    assert_eq!(s.in_cleaner, 0, "{what}");
    assert!(
        s.pooled_bytes <= s.max_pooled_bytes,
        "{what}: {} pooled over cap {}",
        s.pooled_bytes,
        s.max_pooled_bytes
    );
    let by_device: usize = s.per_device.iter().map(|d| d.pooled_bytes).sum();
    assert_eq!(
        by_device, s.pooled_bytes,
        "{what}: estimate vs per-device sums"
    );
    let bufs: usize = s.per_class.iter().map(|c| c.pooled_buffers).sum();
    assert_eq!(bufs, s.pooled_buffers, "{what}: per-class buffers");
}

/// Borrowing at the default 100% slack under churn: every hand-out is
/// all-zero, at least as long as asked, never handed to two holders at
/// once; after quiescence the pooled bytes fit the cap and agree with the
/// per-device sums, and registrations balance unregistrations once
/// everything is cleared.
#[cfg(feature = "testing")]
#[test]
fn borrowing_oracle_under_churn() {
    let faults = Arc::new(Faults::default());
    let pool = Pool::builder()
        .regions(false)
        .faults(faults.clone())
        .cleaner_threads(2)
        .devices(2)
        .max_pooled_bytes(6 << 20)
        .provision(false)
        .build()
        .unwrap();
    let live: Arc<Mutex<HashSet<usize>>> = Arc::default();
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut round = 0;
    while Instant::now() < deadline {
        std::thread::scope(|s| {
            for t in 0..3usize {
                let (pool, live) = (&pool, &live);
                s.spawn(move || {
                    let mut held = Vec::new();
                    for i in 0..300usize {
                        let k = (i * 7 + t * 13 + round) % 23;
                        let min = 1 + (k * 37_123) % (1 << 20) + if k % 3 == 0 { 3 } else { 0 };
                        let device = (i + t) % 2;
                        let mut b = pool.take_on(device, min).unwrap();
                        assert!(b.len() >= min, "len {} < {min}", b.len());
                        assert!(all_zero(&b), "take_on({device}, {min}): non-zero bytes in a {}-byte buffer (pooled {})", b.len(), b.was_pooled());
                        assert!(live.lock().unwrap().insert(b.as_ptr() as usize), "handed out twice");
                        // Write everywhere up to what dirty says: sometimes
                        // the whole (possibly borrowed) buffer, sometimes a
                        // prefix of the request.
                        let dirty = match i % 3 { 0 => b.len(), 1 => min, _ => min.min(100) };
                        b[..dirty].fill(0xA5);
                        b.set_dirty_len(dirty);
                        held.push(b);
                        if held.len() > 4 {
                            let b = held.swap_remove(i % 4);
                            live.lock().unwrap().remove(&(b.as_ptr() as usize));
                            drop(b);
                        }
                        if i % 97 == 0 {
                            pool.flush();
                        }
                    }
                    for b in held {
                        live.lock().unwrap().remove(&(b.as_ptr() as usize));
                        drop(b);
                    }
                });
            }
        });
        check_quiet(&pool, &format!("round {round}"));
        round += 1;
    }
    let s = pool.stats();
    assert!(s.borrowed > 0, "no borrowing happened");
    pool.clear();
    let p = pool.clone();
    within(Duration::from_secs(10), "flush", move || p.flush());
    let s = pool.stats();
    assert_eq!(s.pooled_bytes, 0);
    assert_eq!(s.leaked_bytes, 0);
    assert_eq!(
        faults.registered(),
        faults.unregistered(),
        "registrations vs unregistrations after clear"
    );
}

/// A take served by borrowing counts at the class that lent its buffer:
/// in that class's hits and, at that class's size (the buffer's capacity),
/// in the bytes taken, as the bytes in use count it.
#[test]
fn a_borrowed_take_counts_at_the_class_that_lent_it() {
    let (pool, _faults) = faulty_with_classes(1, SizeClasses::PowersOfTwo);
    drop(pool.take(8192));
    pool.flush();
    let b = pool.take(4096);
    assert_eq!((b.len(), b.capacity()), (4096, 8192), "it borrowed");
    let s = pool.stats();
    assert_eq!(s.borrowed, 1, "{s:?}");
    assert_eq!(s.taken_bytes, 8192 + 8192, "{s:?}");
    assert_eq!(s.in_use_bytes, 8192, "{s:?}");
    let class = |size: usize| {
        s.per_class
            .iter()
            .find(|c| c.size == size)
            .map_or((0, 0), |c| (c.hits, c.misses))
    };
    assert_eq!(class(8192), (1, 1), "{s:?}");
    assert_eq!(class(4096), (0, 0), "{s:?}");
}
