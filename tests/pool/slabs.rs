//! Sub-page slabs: buffers shorter than a page carved from one-page slabs
//! registered once. Run on the fault-injecting backend (which "pins" every
//! buffer and counts the calls) unless said otherwise.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use pinpool::testing::{Faults, TestFence};
use pinpool::{BackendKind, PinnedBuffer, Pool, SizeClasses};

use crate::common::{all_zero, eventually};

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

fn faulty_with(
    f: impl FnOnce(pinpool::PoolBuilder) -> pinpool::PoolBuilder,
) -> (Pool, Arc<Faults>) {
    let faults = Arc::new(Faults::default());
    // Provisioning off: these tests count buffers exactly, and
    // provisioning pins more when a slow run lets a tick see demand.
    let pool = f(Pool::builder()
        .regions(false)
        .faults(faults.clone())
        .cleaner_threads(2)
        .provision(false))
    .build()
    .unwrap();
    (pool, faults)
}

fn faulty() -> (Pool, Arc<Faults>) {
    faulty_with(|b| b)
}

/// Footprint of a sub-page class of length `len`.
fn footprint(len: usize) -> usize {
    if len < page() {
        len.next_multiple_of(256)
    } else {
        len.next_multiple_of(page())
    }
}

/// A miss of `size`, written, dropped and flushed: its slab is registered
/// and carved.
fn one_slab(pool: &Pool, size: usize) {
    let mut head = pool.take(size);
    assert!(!head.was_pooled() && !head.is_pinned());
    head.fill(0xAB);
    drop(head);
    pool.flush();
}

/// Checks that `bufs` are pairwise disjoint and that none straddles a
/// page (a copy may not span two registrations; a slab is one page).
fn assert_disjoint_within_pages(bufs: &[PinnedBuffer]) {
    let mut ranges: Vec<(usize, usize)> = bufs
        .iter()
        .map(|b| (b.as_ptr() as usize, b.as_ptr() as usize + b.capacity()))
        .collect();
    ranges.sort();
    for w in ranges.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "buffers overlap: {:x?} and {:x?}",
            w[0],
            w[1]
        );
    }
    for &(s, e) in &ranges {
        if e - s <= page() {
            assert_eq!(
                s / page(),
                (e - 1) / page(),
                "a sub-page buffer straddles two pages: {s:x}..{e:x}"
            );
        }
    }
}

#[test]
fn sub_page_buffers_share_one_registration_of_one_page() {
    let (pool, faults) = faulty();
    one_slab(&pool, 1024);
    assert_eq!(faults.registered(), 1);
    let stats = pool.stats();
    assert_eq!(stats.pinned_bytes, page() as u64, "one page pinned");
    let per_slab = page() / 1024;
    assert_eq!(stats.pooled_buffers, per_slab, "the slab was carved whole");
    assert_eq!(stats.pooled_bytes, page(), "each buffer occupies 1 KiB");

    let mut bufs: Vec<_> = (0..per_slab).map(|_| pool.take(1024)).collect();
    let mut starts = BTreeSet::new();
    for (i, buf) in bufs.iter_mut().enumerate() {
        assert!(buf.was_pooled() && buf.is_pinned(), "buffer {i}");
        assert_eq!((buf.len(), buf.capacity()), (1024, 1024));
        assert!(buf.iter().all(|&b| b == 0), "buffer {i} is not zeroed");
        starts.insert(buf.as_ptr() as usize);
        buf.fill(i as u8 + 1);
    }
    let (first, last) = (*starts.first().unwrap(), *starts.last().unwrap());
    assert_eq!(starts.len(), per_slab, "two buffers share an address");
    assert_eq!(first % page(), 0, "the slab is page-aligned");
    assert_eq!(last + 1024 - first, page(), "the buffers tile one page");
    for (i, buf) in bufs.iter().enumerate() {
        assert!(buf.iter().all(|&b| b == i as u8 + 1), "buffers overlap");
    }
    assert_eq!(faults.registered(), 1, "a sibling was registered again");
    assert_eq!(pool.stats().misses, 1);
    drop(bufs);
    pool.shutdown();
    assert_eq!(faults.unregistered(), 1, "the slab is unregistered once");
    assert_eq!(pool.stats().pinned_bytes, 0);
}

#[test]
fn a_slab_goes_back_only_when_all_of_its_buffers_are_freed() {
    let (pool, faults) = faulty();
    one_slab(&pool, 2048);
    let held = pool.take(2048);
    assert!(held.was_pooled());
    pool.clear();
    assert_eq!(pool.stats().pooled_buffers, 0);
    assert_eq!(
        faults.unregistered(),
        0,
        "unregistered while a buffer of it was in use"
    );
    assert_eq!(pool.stats().pinned_bytes, page() as u64);
    drop(held);
    pool.flush();
    pool.clear();
    assert_eq!(faults.unregistered(), 1, "the slab stayed registered");
    assert_eq!(pool.stats().pinned_bytes, 0);
    assert_eq!(pool.stats().leaked_bytes, 0);
}

#[test]
fn lowering_the_cap_frees_a_slabs_buffers_one_by_one() {
    let (pool, faults) = faulty();
    one_slab(&pool, 1024);
    pool.set_max_pooled_bytes(2048);
    let stats = pool.stats();
    assert!(stats.pooled_bytes <= 2048, "{} pooled", stats.pooled_bytes);
    assert_eq!(faults.unregistered(), 0, "the rest of the slab is pooled");
    pool.set_max_pooled_bytes(0);
    assert_eq!(faults.unregistered(), 1);
    assert_eq!(pool.stats().pinned_bytes, 0);
}

#[test]
fn a_failed_slab_registration_frees_the_slab() {
    let (pool, faults) = faulty();
    faults.fail_register(&[1]);
    one_slab(&pool, 1024);
    let stats = pool.stats();
    assert_eq!(stats.registration_failures, 1);
    assert_eq!((stats.pooled_buffers, stats.pinned_bytes), (0, 0));
    one_slab(&pool, 1024); // a miss again: nothing of the first slab is pooled
    assert_eq!(faults.registered(), 1, "the next slab registers");
    assert_eq!(pool.stats().pooled_buffers, page() / 1024);
    pool.shutdown();
    assert_eq!(faults.unregistered(), 1);
    assert_eq!(pool.stats().leaked_bytes, 0);
}

#[test]
fn a_failed_slab_unregistration_leaks_the_slab_once() {
    let (pool, faults) = faulty();
    faults.fail_unregister(&[1]);
    one_slab(&pool, 1024);
    pool.clear();
    let stats = pool.stats();
    assert_eq!(stats.unregister_failures, 1);
    assert_eq!(stats.leaked_bytes, page() as u64);
}

#[test]
fn reserving_sub_page_buffers_pins_whole_slabs_and_pools_the_count() {
    let (pool, faults) = faulty();
    let per_slab = page() / 1024;
    pool.reserve(0, &[(1000, per_slab + 2)]).unwrap();
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.pooled_buffers, per_slab + 2, "the count asked for");
    assert_eq!(stats.pooled_bytes, (per_slab + 2) * 1024);
    assert_eq!(faults.registered(), 2, "two slabs");
    assert_eq!(stats.pinned_bytes, 2 * page() as u64);
    let bufs: Vec<_> = (0..per_slab + 2).map(|_| pool.take(1000)).collect();
    assert!(bufs.iter().all(|b| b.was_pooled() && b.len() == 1024));
    assert!(!pool.take(1000).was_pooled());
}

#[test]
fn the_host_backend_hands_out_exact_sub_page_lengths() {
    let pool = Pool::builder().backend(BackendKind::Host).build().unwrap();
    for (asked, len) in [(1, 1), (3, 4), (300, 512), (1024, 1024), (2049, 4096)] {
        let buf = pool.take(asked);
        assert_eq!((buf.len(), buf.capacity()), (len, len), "take({asked})");
        assert!(buf.iter().all(|&b| b == 0));
    }
}

/// Every sub-page class: one registration per slab, siblings zeroed,
/// disjoint, inside the slab's page, pinned; the whole slab comes back on
/// shutdown (registered == unregistered, pinned bytes 0).
#[test]
fn every_sub_page_class_carves_disjoint_zeroed_pinned_siblings() {
    let (pool, faults) = faulty();
    let mut slabs = 0;
    let mut len = 1;
    while len < page() {
        one_slab(&pool, len);
        slabs += 1;
        assert_eq!(
            faults.registered(),
            slabs,
            "len {len}: one registration per slab"
        );
        let per_slab = page() / footprint(len);
        let mut bufs: Vec<_> = (0..per_slab).map(|_| pool.take(len)).collect();
        for (i, b) in bufs.iter().enumerate() {
            assert!(
                b.was_pooled() && b.is_pinned(),
                "len {len}: buffer {i} not a pinned hit"
            );
            assert_eq!(b.len(), len);
            assert!(all_zero(b), "len {len}: buffer {i} not zero");
        }
        assert_disjoint_within_pages(&bufs);
        let base = bufs.iter().map(|b| b.as_ptr() as usize).min().unwrap();
        assert_eq!(base % page(), 0, "len {len}: the slab is page-aligned");
        for (i, b) in bufs.iter_mut().enumerate() {
            b.fill(i as u8 + 1);
        }
        for (i, b) in bufs.iter().enumerate() {
            assert!(
                b.iter().all(|&x| x == i as u8 + 1),
                "len {len}: buffers overlap"
            );
        }
        let extra = pool.take(len);
        assert!(
            !extra.was_pooled(),
            "len {len}: more buffers than a slab holds"
        );
        drop(extra);
        drop(bufs);
        pool.flush();
        // Reused: zero again.
        let again: Vec<_> = (0..per_slab).map(|_| pool.take(len)).collect();
        assert!(
            again.iter().all(|b| all_zero(b)),
            "len {len}: reuse not zeroed"
        );
        drop(again);
        pool.flush();
        slabs += 1; // the extra miss made a second slab
        assert_eq!(
            faults.registered(),
            slabs,
            "len {len}: a sibling registered again"
        );
        len *= 2;
    }
    pool.shutdown();
    let stats = pool.stats();
    assert_eq!(
        faults.unregistered(),
        faults.registered(),
        "every slab unregistered once"
    );
    assert_eq!(stats.pinned_bytes, 0);
    assert_eq!(stats.leaked_bytes, 0);
    assert_eq!(stats.pooled_bytes, 0);
}

/// A reserve's blocks count as drops (`count_returned`) without takes;
/// the closing pool computes `outstanding = taken - drops`. Take a
/// reserved buffer, hold it across the pool's close, drop it late: the
/// pool's state must still be alive for the late drop, and the reaper must
/// unregister the buffer. (A whole-page buffer: no slab is involved.)
#[test]
fn reserved_page_buffer_held_across_close_comes_back_to_the_reaper() {
    let (pool, faults) = faulty();
    pool.reserve(0, &[(page(), 1)]).unwrap();
    pool.flush();
    let buf = pool.take(page());
    assert!(buf.was_pooled());
    drop(pool);
    std::thread::sleep(Duration::from_millis(50));
    if Arc::strong_count(&faults) == 1 {
        // Dropping it now would read the freed pool (a use after free
        // that aborts the test binary): forget it and fail.
        std::mem::forget(buf);
        panic!("the closed pool's state was freed while one of its buffers is still out");
    }
    drop(buf);
    assert!(
        eventually(Duration::from_secs(5), || faults.unregistered() == 1),
        "a late reserved buffer was never unregistered"
    );
}

/// As above with a slab of reserved buffers (one head counted as a drop,
/// `per_slab` buffers out), their late drops spaced out so that the reaper
/// settles the count (`taken - drops` = per_slab - 1) before the last one
/// arrives.
#[test]
fn reserved_slab_buffers_dropped_late_one_by_one_all_come_back() {
    let (pool, faults) = faulty();
    let per_slab = page() / 1024;
    pool.reserve(0, &[(1024, per_slab)]).unwrap();
    pool.flush();
    let mut bufs: Vec<_> = (0..per_slab).map(|_| pool.take(1024)).collect();
    assert!(bufs.iter().all(|b| b.was_pooled()));
    drop(pool);
    let last = bufs.pop().unwrap();
    for b in bufs {
        drop(b);
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(100));
    // The backend (and the `Faults` handle it keeps) lives in the pool's
    // state, which must stay alive while a buffer of the pool is out: the
    // late drop below goes through that state.
    if Arc::strong_count(&faults) == 1 {
        // Dropping it now would read the freed pool (a use after free
        // that aborts the test binary): forget it and fail.
        std::mem::forget(last);
        panic!("the closed pool's state was freed while one of its buffers is still out");
    }
    drop(last);
    assert!(
        eventually(Duration::from_secs(5), || faults.unregistered() == 1),
        "the slab of late reserved buffers was never unregistered ({} unregistered)",
        faults.unregistered()
    );
}

/// A sibling whose copies are not known to have finished (its device
/// synchronize fails) is leaked, keeping its share: the slab stays pinned
/// for good. `leaked_bytes` must then account for what stays pinned once
/// everything else is cleared (for whole-page buffers a leaked pinned
/// buffer leaves `pinned_bytes == leaked_bytes`).
#[test]
fn a_leaked_sibling_is_counted_as_the_slab_it_keeps_pinned() {
    let (pool, faults) = faulty();
    one_slab(&pool, 1024);
    let mut sib = pool.take(1024);
    assert!(sib.was_pooled() && sib.is_pinned());
    sib.fill(1);
    faults.fail_synchronize(&[1]);
    drop(sib); // pinned, no fences: a device synchronize, which fails
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.fence_failures, 1, "the synchronize failure leaks it");
    pool.clear();
    let stats = pool.stats();
    assert_eq!(stats.pooled_buffers, 0);
    assert_eq!(
        faults.unregistered(),
        0,
        "a leaked share keeps the slab registered"
    );
    assert!(
        stats.pinned_bytes <= stats.leaked_bytes,
        "pinned_bytes {} stay pinned for good but only {} counted as leaked",
        stats.pinned_bytes,
        stats.leaked_bytes
    );
}

/// The same for whole-page buffers, as the reference of the invariant
/// above.
#[test]
fn a_leaked_page_buffer_is_counted_as_what_it_keeps_pinned() {
    let (pool, faults) = faulty();
    one_slab(&pool, page());
    let mut b = pool.take(page());
    assert!(b.is_pinned());
    b.fill(1);
    faults.fail_synchronize(&[1]);
    drop(b);
    pool.flush();
    pool.clear();
    let stats = pool.stats();
    assert_eq!(stats.pinned_bytes, page() as u64);
    assert!(stats.pinned_bytes <= stats.leaked_bytes);
}

/// A sibling with a copy in flight (a pending fence) holds its slab through
/// clear, a cap of 0 and trim: the slab must not be unregistered (or
/// unmapped: the held sibling's bytes stay readable and writable) until
/// the fence completes.
#[test]
fn a_sibling_in_flight_keeps_its_slab_through_clear_cap_and_trim() {
    let (pool, faults) = faulty_with(|b| b.idle_trim(Duration::from_millis(1)));
    one_slab(&pool, 512);
    let mut held = pool.take(512); // in use, never dropped until the end
    held.fill(9);
    let mut inflight = pool.take(512);
    inflight.fill(3);
    let fence = TestFence::default();
    fence.record(&mut inflight);
    drop(inflight);
    pool.clear();
    pool.set_max_pooled_bytes(0);
    std::thread::sleep(Duration::from_millis(5));
    pool.trim();
    assert_eq!(
        faults.unregistered(),
        0,
        "unregistered while siblings are in use"
    );
    assert!(
        held.iter().all(|&b| b == 9),
        "a held sibling's bytes changed"
    );
    held.fill(10);
    drop(held);
    // Not `flush`: it would wait for the fenced buffer too.
    assert!(eventually(Duration::from_secs(5), || pool
        .stats()
        .in_cleaner
        == 1));
    pool.clear();
    assert_eq!(
        faults.unregistered(),
        0,
        "unregistered while a copy reads a sibling"
    );
    assert_eq!(pool.stats().pinned_bytes, page() as u64);
    fence.complete();
    pool.flush();
    pool.clear();
    assert_eq!(faults.unregistered(), 1);
    let stats = pool.stats();
    assert_eq!((stats.pinned_bytes, stats.leaked_bytes), (0, 0));
    assert_eq!(stats.pooled_bytes, 0);
}

/// A closed pool: the pooled siblings are freed at close, a sibling with a
/// copy in flight goes to the reaper late; the slab is unregistered only
/// after its fence completes, exactly once.
#[test]
fn a_closed_pools_late_sibling_unregisters_the_slab_after_its_fence() {
    let (pool, faults) = faulty();
    one_slab(&pool, 1024);
    let mut a = pool.take(1024);
    let mut b = pool.take(1024);
    a.fill(1);
    b.fill(2);
    let fence = TestFence::default();
    fence.record(&mut a);
    drop(a); // parked in the cleaner at close: goes to the reaper
    drop(pool);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        faults.unregistered(),
        0,
        "unregistered with siblings out and in flight"
    );
    assert!(b.iter().all(|&x| x == 2));
    drop(b); // late, pinned, event-less: a late device synchronize
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        faults.unregistered(),
        0,
        "unregistered while a copy reads a sibling"
    );
    fence.complete();
    assert!(
        eventually(Duration::from_secs(5), || faults.unregistered() == 1),
        "the slab was never unregistered"
    );
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(faults.unregistered(), 1, "unregistered twice");
    assert_eq!(faults.unregister_calls(), 1);
}

/// A late sibling whose late synchronize fails is abandoned; the others
/// come back; the slab must never be unregistered (a copy may read it).
#[test]
fn a_closed_pools_abandoned_sibling_keeps_the_slab_registered() {
    let (pool, faults) = faulty();
    one_slab(&pool, 1024);
    let mut a = pool.take(1024);
    let b = pool.take(1024);
    a.fill(1);
    drop(pool);
    faults.fail_synchronize(&[1]);
    drop(a);
    std::thread::sleep(Duration::from_millis(100));
    drop(b);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        faults.unregister_calls(),
        0,
        "a slab with an abandoned sibling was unregistered"
    );
}

/// A head whose registration panics: the worker catches it, the slab is
/// freed (never registered), the pool serves on with a fresh slab.
#[test]
fn a_panicking_slab_registration_frees_the_slab_and_the_pool_serves_on() {
    let (pool, faults) = faulty_with(|b| b.cleaner_threads(1));
    faults.panic_register(&[1]);
    one_slab(&pool, 256);
    assert!(eventually(Duration::from_secs(5), || pool
        .stats()
        .worker_panics
        == 1));
    let stats = pool.stats();
    assert_eq!(
        (stats.pooled_buffers, stats.pinned_bytes, stats.pooled_bytes),
        (0, 0, 0)
    );
    assert_eq!(stats.in_cleaner, 0);
    one_slab(&pool, 256);
    assert_eq!(faults.registered(), 1);
    assert_eq!(pool.stats().pooled_buffers, page() / 256);
    let bufs: Vec<_> = (0..page() / 256).map(|_| pool.take(256)).collect();
    assert!(bufs.iter().all(|b| b.was_pooled() && all_zero(b)));
    assert_disjoint_within_pages(&bufs);
    drop(bufs);
    pool.shutdown();
    assert_eq!(faults.unregistered(), 1);
    assert_eq!(pool.stats().pinned_bytes, 0);
}

/// A cap smaller than a slab: the siblings that do not fit are released
/// at once; the pooled bytes stay under the cap; nothing stays pinned
/// once the cap goes to 0; the estimate does not drift.
#[test]
fn a_cap_below_one_slab_keeps_pooled_bytes_under_it_and_the_count_exact() {
    let (pool, faults) = faulty();
    pool.set_max_pooled_bytes(1024);
    one_slab(&pool, 256);
    let stats = pool.stats();
    assert!(
        stats.pooled_bytes <= 1024,
        "{} pooled over a 1024 cap",
        stats.pooled_bytes
    );
    assert_eq!(
        stats.pooled_bytes,
        stats.pooled_buffers * 256,
        "estimate vs count"
    );
    assert_eq!(faults.registered(), 1);
    for _ in 0..20 {
        let bufs: Vec<_> = (0..6).map(|_| pool.take(256)).collect();
        assert!(bufs.iter().all(|b| all_zero(b)));
        assert_disjoint_within_pages(&bufs);
        drop(bufs);
        pool.flush();
        let stats = pool.stats();
        assert!(
            stats.pooled_bytes <= 1024,
            "{} pooled over a 1024 cap",
            stats.pooled_bytes
        );
        assert_eq!(
            stats.pooled_bytes,
            stats.pooled_buffers * 256,
            "estimate vs count"
        );
    }
    pool.set_max_pooled_bytes(0);
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.pooled_bytes, 0);
    assert_eq!(
        stats.pinned_bytes, 0,
        "slabs stayed pinned with nothing pooled"
    );
    assert_eq!(faults.registered(), faults.unregistered());
    assert_eq!(stats.leaked_bytes, 0);
}

/// A cap of 0 from the start: the head still registers its slab, but
/// nothing is pooled and the slab is unregistered at once.
#[test]
fn a_zero_cap_pins_nothing_for_good() {
    let (pool, faults) = faulty();
    pool.set_max_pooled_bytes(0);
    for _ in 0..5 {
        one_slab(&pool, 1024);
    }
    let stats = pool.stats();
    assert_eq!(stats.pooled_bytes, 0);
    assert_eq!(stats.pinned_bytes, 0);
    assert_eq!(faults.registered(), faults.unregistered());
}

/// Live buffers across threads, by start address: no two may overlap.
#[derive(Default)]
struct Live(std::sync::Mutex<BTreeMap<usize, usize>>);

impl Live {
    fn insert(&self, b: &PinnedBuffer) {
        let (s, e) = (b.as_ptr() as usize, b.as_ptr() as usize + b.capacity());
        let mut m = self.0.lock().unwrap();
        if let Some((&ps, &pe)) = m.range(..=s).next_back() {
            assert!(
                pe <= s,
                "handed out twice / overlapping: {ps:x}..{pe:x} and {s:x}..{e:x}"
            );
        }
        if let Some((&ns, &ne)) = m.range(s..).next() {
            assert!(
                e <= ns,
                "handed out twice / overlapping: {s:x}..{e:x} and {ns:x}..{ne:x}"
            );
        }
        m.insert(s, e);
    }
    fn remove(&self, b: &PinnedBuffer) {
        self.0.lock().unwrap().remove(&(b.as_ptr() as usize));
    }
}

/// Many threads take sub-page buffers of mixed classes, check they come
/// back zero and disjoint from every other live buffer, write a tag,
/// check the tag survived, and drop them on their own or another thread,
/// while a meddler clears, trims, moves the cap and flushes.
fn stress(pool: Pool, faults: Option<Arc<Faults>>) {
    const THREADS: usize = 4;
    const ROUNDS: usize = 3000;
    let live = Arc::new(Live::default());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel::<(PinnedBuffer, u8)>();
    let rx = Arc::new(std::sync::Mutex::new(rx));
    let start = Arc::new(Barrier::new(THREADS + 1));
    let mut handles = Vec::new();
    for t in 0..THREADS {
        let (pool, live, tx, rx, start) = (
            pool.clone(),
            live.clone(),
            tx.clone(),
            rx.clone(),
            start.clone(),
        );
        handles.push(std::thread::spawn(move || {
            start.wait();
            let sizes = [1usize, 3, 100, 256, 300, 512, 1000, 1024, 2048, 4096];
            let mut held: Vec<(PinnedBuffer, u8)> = Vec::new();
            for i in 0..ROUNDS {
                let size = sizes[(i * 7 + t * 3) % sizes.len()];
                let mut b = pool.take(size);
                assert!(b.len() >= size);
                assert!(
                    all_zero(&b),
                    "thread {t} round {i}: take({size}) not zeroed (pinned {})",
                    b.is_pinned()
                );
                live.insert(&b);
                let tag = (t * 50 + i % 50 + 1) as u8;
                b.fill(tag);
                if i % 3 == 0 {
                    b.set_dirty_len(b.len() / 2 + 1);
                    let n = b.len() / 2 + 1;
                    b[n..].fill(0);
                    b[..n].fill(tag);
                }
                held.push((b, tag));
                if held.len() > 6 {
                    let (b, tag) = held.remove(i % held.len());
                    let n = b.dirty_len();
                    assert!(
                        b[..n].iter().all(|&x| x == tag),
                        "thread {t}: a live buffer was overwritten"
                    );
                    live.remove(&b);
                    if i % 4 == 0 {
                        tx.send((b, tag)).unwrap(); // dropped by another thread
                    } else {
                        drop(b);
                    }
                }
                if let Ok((b, tag)) = rx.lock().unwrap().try_recv() {
                    let n = b.dirty_len();
                    assert!(
                        b[..n].iter().all(|&x| x == tag),
                        "a live buffer was overwritten"
                    );
                    drop(b);
                }
            }
            for (b, _) in held {
                live.remove(&b);
                drop(b);
            }
        }));
    }
    drop(tx);
    let meddler = {
        let (pool, stop) = (pool.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match i % 6 {
                    0 => pool.clear(),
                    1 => pool.set_max_pooled_bytes(3000),
                    2 => pool.set_max_pooled_bytes(1 << 30),
                    3 => pool.trim(),
                    4 => pool.flush(),
                    _ => {
                        let s = pool.stats();
                        assert!(s.pooled_bytes <= (1 << 30));
                    }
                }
                i += 1;
                std::thread::sleep(Duration::from_micros(300));
            }
        })
    };
    start.wait();
    for h in handles {
        h.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    meddler.join().unwrap();
    while let Ok((b, _)) = rx.lock().unwrap().try_recv() {
        drop(b);
    }
    pool.flush();
    let stats = pool.stats();
    assert!(stats.pooled_bytes <= stats.max_pooled_bytes);
    // The estimate and the walk of the shards are read one after the
    // other, and the cleaner may still provision (pool) buffers after the
    // flush: they agree once it settles, unless the estimate drifted.
    let per_dev =
        |s: &pinpool::Stats| -> usize { s.per_device.iter().map(|d| d.pooled_bytes).sum() };
    let agree = crate::common::eventually(Duration::from_secs(5), || {
        let s = pool.stats();
        s.pooled_bytes == per_dev(&s)
    });
    let stats = pool.stats();
    assert!(
        agree,
        "the cap's estimate drifted from the pooled buffers: {} against {}",
        stats.pooled_bytes,
        per_dev(&stats)
    );
    pool.shutdown();
    let stats = pool.stats();
    assert_eq!(
        (stats.pooled_bytes, stats.pooled_buffers, stats.in_cleaner),
        (0, 0, 0)
    );
    assert_eq!(stats.leaked_bytes, 0);
    if let Some(f) = faults {
        assert_eq!(stats.pinned_bytes, 0, "{stats:?}");
        assert_eq!(
            f.registered(),
            f.unregistered(),
            "registered vs unregistered"
        );
        assert_eq!(f.unregister_calls(), f.unregistered());
    }
}

#[test]
fn stress_sub_page_buffers_on_the_fault_backend() {
    let (pool, faults) = faulty();
    stress(pool, Some(faults));
}

#[test]
fn stress_sub_page_buffers_on_the_host_backend() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(2)
        .build()
        .unwrap();
    stress(pool, None);
}

#[test]
fn stress_sub_page_buffers_powers_of_two_no_borrowing() {
    let (pool, faults) = faulty_with(|b| b.size_classes(SizeClasses::PowersOfTwo).borrow_slack(0));
    stress(pool, Some(faults));
}

/// Two devices: a slab belongs to its head's device; its siblings serve
/// only that device, and each slab is unregistered once.
#[test]
fn slabs_stay_on_their_device() {
    let (pool, faults) = faulty_with(|b| b.devices(2));
    let mut head = pool.take_on(1, 1024).unwrap();
    head.fill(5);
    drop(head);
    pool.flush();
    assert_eq!(faults.registered(), 1);
    let stats = pool.stats();
    assert_eq!(stats.per_device[1].pooled_buffers, page() / 1024);
    assert_eq!(stats.per_device[0].pooled_buffers, 0);
    let other = pool.take_on(0, 1024).unwrap();
    assert!(
        !other.was_pooled(),
        "device 0 got a buffer of device 1's slab"
    );
    let bufs: Vec<_> = (0..page() / 1024)
        .map(|_| pool.take_on(1, 1024).unwrap())
        .collect();
    assert!(bufs
        .iter()
        .all(|b| b.was_pooled() && b.device() == 1 && all_zero(b)));
    assert_disjoint_within_pages(&bufs);
    drop(bufs);
    drop(other);
    pool.shutdown();
    assert_eq!(faults.registered(), 2);
    assert_eq!(faults.unregistered(), 2);
    assert_eq!(pool.stats().pinned_bytes, 0);
}

/// Borrowing: a take of 512 served by an idle 1 KiB sibling writes only
/// its 512 bytes; the sibling goes back to its class, zero.
#[test]
fn a_borrowed_sibling_goes_back_zeroed_to_its_class() {
    let (pool, faults) = faulty();
    one_slab(&pool, 1024);
    let mut b = pool.take(512);
    assert!(b.was_pooled(), "no borrow");
    assert_eq!((b.len(), b.capacity()), (512, 1024));
    b.fill(0xEE);
    drop(b);
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.borrowed, 1);
    assert_eq!(stats.pooled_buffers, page() / 1024);
    assert_eq!(stats.pooled_bytes, page());
    let bufs: Vec<_> = (0..page() / 1024).map(|_| pool.take(1024)).collect();
    assert!(bufs.iter().all(|b| b.was_pooled() && all_zero(b)));
    drop(bufs);
    pool.shutdown();
    assert_eq!(faults.unregistered(), 1);
}

/// Reserve counts: exactly the count asked, per class, the slabs they
/// need, pinned bytes = whole slabs, pooled bytes = footprints; reserved
/// siblings survive an idle trim.
#[test]
fn reserve_of_several_sub_page_classes_pools_exact_counts() {
    let (pool, faults) = faulty_with(|b| b.idle_trim(Duration::from_millis(1)));
    pool.reserve(0, &[(1000, 3), (100, 20), (2048, 1)]).unwrap();
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.pooled_buffers, 24);
    assert_eq!(stats.pooled_bytes, 3 * 1024 + 20 * 256 + 2048);
    let slabs = 1 + 20usize.div_ceil(page() / 256) + 1;
    assert_eq!(faults.registered(), slabs as u64);
    assert_eq!(stats.pinned_bytes, (slabs * page()) as u64);
    std::thread::sleep(Duration::from_millis(5));
    pool.trim();
    assert_eq!(
        pool.stats().pooled_buffers,
        24,
        "reserved siblings were trimmed"
    );
    let a: Vec<_> = (0..3).map(|_| pool.take(1000)).collect();
    let b: Vec<_> = (0..20).map(|_| pool.take(100)).collect();
    let c = pool.take(2048);
    assert!(a
        .iter()
        .chain(&b)
        .chain([&c])
        .all(|x| x.was_pooled() && all_zero(x)));
    let mut all: Vec<PinnedBuffer> = a;
    all.extend(b);
    all.push(c);
    assert_disjoint_within_pages(&all);
    assert!(!pool.take(100).was_pooled());
    drop(all);
    pool.shutdown();
    assert_eq!(faults.unregistered(), faults.registered());
    assert_eq!(pool.stats().pinned_bytes, 0);
}

/// Idle trim frees unreserved siblings one by one; a slab goes back when
/// its last one goes; `trimmed_bytes` should not claim bytes that stay
/// pinned (here: a sibling is held, so nothing goes back to the OS).
#[test]
fn trimming_siblings_of_a_held_buffer_returns_nothing_and_says_so() {
    let (pool, faults) = faulty_with(|b| b.idle_trim(Duration::from_millis(1)));
    one_slab(&pool, 1024);
    let held = pool.take(1024);
    std::thread::sleep(Duration::from_millis(5));
    pool.trim();
    let stats = pool.stats();
    assert_eq!(stats.pooled_buffers, 0, "idle siblings not trimmed");
    assert_eq!(faults.unregistered(), 0);
    assert_eq!(stats.pinned_bytes, page() as u64);
    drop(held);
    pool.flush();
    std::thread::sleep(Duration::from_millis(5));
    pool.trim();
    assert_eq!(faults.unregistered(), 1);
    assert_eq!(pool.stats().pinned_bytes, 0);
    // Reported, not asserted hard: bytes trimmed vs bytes the OS got back.
    eprintln!(
        "trimmed_bytes = {} for one page returned",
        pool.stats().trimmed_bytes
    );
}

/// The host backend: a head self-cleaned by its owner many times, then
/// dropped on another thread and flushed: the siblings carved then are
/// zero and disjoint from the head.
#[test]
fn host_backend_head_reused_then_carved_gives_zeroed_siblings() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(2)
        .build()
        .unwrap();
    let mut head = pool.take(1024);
    let head_ptr = head.as_ptr() as usize;
    for i in 0..10 {
        head.fill(i + 1);
        drop(head);
        head = pool.take(1024);
        assert!(all_zero(&head));
    }
    head.fill(0x77);
    std::thread::spawn(move || drop(head)).join().unwrap();
    pool.flush();
    let bufs: Vec<_> = (0..page() / 1024 + 2).map(|_| pool.take(1024)).collect();
    for b in &bufs {
        assert!(
            all_zero(b),
            "not zero (head {})",
            b.as_ptr() as usize == head_ptr
        );
        assert!(!b.is_pinned());
    }
    assert_disjoint_within_pages(&bufs);
}

/// Cross-thread drops of every sibling of a slab at once, from many
/// threads, after `clear` took the rest: the last share unregisters the
/// slab exactly once.
#[test]
fn siblings_dropped_at_once_on_many_threads_unregister_once() {
    for round in 0..50 {
        let (pool, faults) = faulty();
        one_slab(&pool, 256);
        let bufs: Vec<_> = (0..page() / 256).map(|_| pool.take(256)).collect();
        let barrier = Arc::new(Barrier::new(bufs.len()));
        let hs: Vec<_> = bufs
            .into_iter()
            .map(|mut b| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    b.fill(1);
                    barrier.wait();
                    drop(b);
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        pool.flush();
        pool.set_max_pooled_bytes(0);
        pool.clear();
        assert_eq!(faults.unregistered(), 1, "round {round}");
        assert_eq!(faults.unregister_calls(), 1, "round {round}");
        assert_eq!(pool.stats().pinned_bytes, 0);
    }
}

/// A failing unregistration of a slab: leaked once, counted as the slab,
/// never retried, and later slabs unaffected.
#[test]
fn a_failed_slab_unregistration_does_not_disturb_the_next_slab() {
    let (pool, faults) = faulty();
    faults.fail_unregister(&[1]);
    one_slab(&pool, 1024);
    pool.clear();
    one_slab(&pool, 1024);
    pool.clear();
    let stats = pool.stats();
    assert_eq!(faults.unregister_calls(), 2);
    assert_eq!(faults.unregistered(), 1);
    assert_eq!(stats.leaked_bytes, page() as u64);
    assert_eq!(
        stats.pinned_bytes,
        page() as u64,
        "only the leaked slab stays pinned"
    );
}

/// Shutdown with a sibling held: the rest is cleared, the slab stays; the
/// pool works again; the held sibling's drop after shutdown brings the
/// slab back on the next clear.
#[test]
fn shutdown_with_a_held_sibling_then_restart() {
    let (pool, faults) = faulty();
    one_slab(&pool, 2048);
    let mut held = pool.take(2048);
    held.fill(4);
    pool.shutdown();
    assert_eq!(faults.unregistered(), 0);
    assert!(held.iter().all(|&b| b == 4));
    drop(held);
    pool.flush();
    assert_eq!(pool.stats().pooled_buffers, 1);
    let again = pool.take(2048);
    assert!(again.was_pooled() && all_zero(&again));
    drop(again);
    pool.shutdown();
    assert_eq!(faults.unregistered(), 1);
    assert_eq!(pool.stats().pinned_bytes, 0);
}

/// Many heads dropped at once, past the registration backlog (some are
/// freed by their droppers), with injected registration failures and a
/// panic: nothing leaks, nothing stays pinned, every registered slab is
/// unregistered once.
#[test]
fn a_burst_of_heads_with_failures_leaks_nothing() {
    let (pool, faults) = faulty_with(|b| b.cleaner_threads(1));
    faults.fail_register(&[2, 5, 9, 30, 31]);
    faults.panic_register(&[7]);
    let heads: Vec<_> = (0..400)
        .map(|i| {
            let mut b = pool.take([1usize, 256, 1024, 2048][i % 4]);
            b.fill(1);
            b
        })
        .collect();
    assert!(heads.iter().all(|b| !b.was_pooled()));
    // Drop from several threads at once.
    let chunks: Vec<Vec<PinnedBuffer>> = {
        let mut it = heads.into_iter();
        (0..4).map(|_| it.by_ref().take(100).collect()).collect()
    };
    let hs: Vec<_> = chunks
        .into_iter()
        .map(|c| std::thread::spawn(move || drop(c)))
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    pool.flush();
    let stats = pool.stats();
    assert!(stats.pooled_bytes <= stats.max_pooled_bytes);
    let per_dev: usize = stats.per_device.iter().map(|d| d.pooled_bytes).sum();
    assert_eq!(stats.pooled_bytes, per_dev);
    // Every pooled buffer is zero and disjoint.
    let mut all = Vec::new();
    for len in [1usize, 256, 1024, 2048] {
        loop {
            let b = pool.take(len);
            if !b.was_pooled() {
                break;
            }
            assert!(all_zero(&b));
            all.push(b);
        }
    }
    assert_disjoint_within_pages(&all);
    drop(all);
    pool.shutdown();
    let stats = pool.stats();
    assert_eq!(stats.leaked_bytes, 0);
    assert_eq!(stats.pinned_bytes, 0, "{stats:?}");
    assert_eq!(faults.registered(), faults.unregistered());
}

/// A head whose "copy" fails is leaked; its slab's mapping (a page) is
/// what is lost, and what `leaked_bytes` must count (only the counter is
/// checked: reading /proc/self/maps would be flaky).
#[test]
fn a_leaked_head_counts_its_whole_slab() {
    let (pool, _faults) = faulty();
    let mut head = pool.take(256);
    head.fill(1);
    let fence = TestFence::default();
    fence.record(&mut head);
    fence.fail();
    drop(head);
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.fence_failures, 1);
    assert_eq!(
        stats.leaked_bytes,
        page() as u64,
        "a leaked head keeps its whole slab mapped, counted as {}",
        stats.leaked_bytes
    );
}

/// With regions (the default), a slab is a page carved from a region: a
/// sub-page buffer costs no registration of its own (a registration of one
/// page stalls every stream's copies as a large one does), and a slab goes
/// back to its region once all of its buffers are freed, so that the region
/// can be released.
#[test]
fn with_regions_slabs_are_pages_carved_from_a_region() {
    let (pool, faults) = faulty_with(|b| b.regions(true));
    // Three slabs and one buffer of a fourth, at once.
    let count = 3 * (page() / 1024) + 1;
    for _ in 0..20 {
        let held: Vec<_> = (0..count).map(|_| pool.take(1000)).collect();
        drop(held);
        pool.flush();
    }
    let mut held: Vec<_> = (0..count).map(|_| pool.take(1000)).collect();
    let s = pool.stats();
    assert!(
        held.iter().all(|b| b.was_pooled() && b.is_pinned()),
        "a sub-page take missed after 20 rounds: {s:#?}"
    );
    assert_disjoint_within_pages(&held);
    for (i, b) in held.iter_mut().enumerate() {
        assert_eq!(b.capacity(), 1024);
        assert!(b.iter().all(|&x| x == 0), "buffer {i} is not zeroed");
        b.fill(i as u8);
    }
    assert!(
        s.registrations > 0 && s.registered_bytes >= s.registrations * (2 << 20),
        "a registration smaller than the smallest region: {s:#?}"
    );
    assert_eq!(s.regions_released, 0, "{s:#?}");
    drop(held);
    pool.flush();
    pool.clear();
    let s = pool.stats();
    assert_eq!(s.pinned_bytes, 0, "a slab kept its region pinned: {s:#?}");
    assert_eq!(faults.registered(), faults.unregistered());
    pool.shutdown();
}

/// With regions, the idle buffers of a sub-page class no longer taken give
/// up their slab's page, which goes back to its region with the last of
/// them, as a page class's idle buffers go back: the region is wholly free
/// again, and a cap below it releases it.
#[test]
fn with_regions_a_sub_page_class_no_longer_taken_gives_its_pages_back() {
    let (pool, faults) = faulty_with(|b| b.regions(true));
    let count = 3 * (page() / 1024) + 1;
    let met = eventually(Duration::from_secs(10), || {
        let held: Vec<_> = (0..count).map(|_| pool.take(1000)).collect();
        let all = held.iter().all(|b| b.was_pooled() && b.is_pinned());
        drop(held);
        pool.flush();
        all
    });
    assert!(met, "setup: never all carved: {:#?}", pool.stats());
    let whole = eventually(Duration::from_secs(10), || {
        let s = pool.stats();
        s.free_extent_bytes == s.region_bytes
    });
    assert!(whole, "a slab's page stayed carved: {:#?}", pool.stats());
    pool.set_max_pooled_bytes(0);
    let released = eventually(Duration::from_secs(10), || pool.stats().pinned_bytes == 0);
    assert!(released, "the region was kept: {:#?}", pool.stats());
    assert_eq!(faults.registered(), faults.unregistered());
    pool.shutdown();
}

/// With regions, misses of a hot sub-page class parked behind a growth,
/// then replaced (the head of a slab carved from a region in place of
/// each) while their class goes cold: each head goes back to its region
/// with its slab's other buffers, none of them lost, so the region goes at
/// shutdown with nothing out.
#[test]
fn with_regions_slab_heads_replaced_as_their_class_goes_cold_leave_no_region_behind() {
    // Nine to seventeen of a hundred rounds failed before the fix (the
    // head went back, its siblings were lost): forty rounds miss it about
    // one time in fifty.
    let mut failed = Vec::new();
    for round in 0..40u64 {
        let gap = Duration::from_millis(24 + round % 5 * 2);
        let faults = Arc::new(Faults::default());
        let pool = Pool::builder()
            .faults(faults.clone())
            .cleaner_threads(4)
            .provision(false)
            .build()
            .unwrap();
        // Misses of a hot 1 KiB class park behind a held region
        // registration.
        faults.hold_register();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hot = {
            let (pool, stop) = (pool.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let mut b = pool.take(1024);
                    b[0] = 1;
                    drop(b);
                    std::thread::sleep(Duration::from_micros(50));
                }
            })
        };
        std::thread::sleep(Duration::from_millis(120));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        hot.join().unwrap();
        // The class goes cold while the parked misses are replaced.
        std::thread::sleep(gap);
        faults.release();
        pool.flush();
        pool.shutdown();
        let s = pool.stats();
        if faults.registered() != faults.unregistered() {
            failed.push((round, gap, s.pinned_bytes, s.leaked_bytes));
        }
    }
    assert!(
        failed.is_empty(),
        "(round, gap, pinned bytes, leaked bytes) of rounds whose region outlived the \
         shutdown with nothing out: {failed:?}"
    );
}

/// With regions, the idle buffers of a sub-page class that went cold give
/// their pages back while the thread that dropped them stays busy with
/// other sizes (they wait in the shard, where the cleaner's sweep gives
/// them up, not in that thread's cache).
#[test]
fn with_regions_a_cold_sub_page_class_of_a_busy_thread_gives_its_pages_back() {
    let (pool, faults) = faulty_with(|b| b.regions(true));
    let pooled = |pool: &Pool| {
        pool.stats()
            .per_class
            .iter()
            .find(|c| c.size == 1024)
            .map_or(0, |c| c.pooled_buffers)
    };
    let kept = eventually(Duration::from_secs(10), || {
        let held: Vec<_> = (0..16).map(|_| pool.take(1024)).collect();
        drop(held);
        pool.flush();
        pooled(&pool) > 0
    });
    assert!(
        kept,
        "setup: nothing kept in the class: {:#?}",
        pool.stats()
    );
    let start = std::time::Instant::now();
    let mut back = false;
    while start.elapsed() < Duration::from_secs(5) && !back {
        // The same thread, busy with another size.
        let mut b = pool.take(64 << 10);
        b[..4096].fill(1);
        b.set_dirty_len(4096);
        drop(b);
        std::thread::sleep(Duration::from_millis(1));
        back = pooled(&pool) == 0;
    }
    let (s, idle) = (pool.stats(), pooled(&pool));
    pool.shutdown();
    assert_eq!(faults.registered(), faults.unregistered());
    assert!(
        back,
        "{idle} idle 1 KiB buffers stayed pooled 5 s after their class went cold \
         (free extents {} of {}): {s:#?}",
        s.free_extent_bytes, s.region_bytes
    );
}
