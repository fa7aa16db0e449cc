//! Buffers carved from regions (`PoolBuilder::regions`) on the fault
//! backend, which "pins": few registrations, memory moving between size
//! classes, and every region unregistered by `shutdown`, a held buffer's
//! with that buffer.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pinpool::testing::Faults;
use pinpool::Pool;

use crate::common::eventually;

fn pool_with(regions: bool) -> (Pool, Arc<Faults>) {
    built(|b| b.regions(regions))
}

/// A pool on the fault backend, two workers, no provisioning, with what
/// `settings` adds.
fn built(
    settings: impl FnOnce(pinpool::PoolBuilder) -> pinpool::PoolBuilder,
) -> (Pool, Arc<Faults>) {
    let faults = Arc::new(Faults::default());
    let builder = Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(2)
        .provision(false);
    (settings(builder).build().unwrap(), faults)
}

/// Shuts `pool` down with one carved 1 MiB buffer held, then drops it:
/// every region is unregistered by then.
fn shut_down_holding_one(pool: &Pool, faults: &Faults) {
    drop(pool.take(1 << 20));
    pool.flush();
    let mut held = pool.take(1 << 20);
    assert!(held.is_pinned());
    pool.shutdown();
    assert_eq!(
        faults.unregistered(),
        faults.registered() - 1,
        "a region with a buffer out was unregistered"
    );
    held.fill(1);
    drop(held);
    pool.flush();
    assert_eq!(faults.registered(), faults.unregistered());
}

/// Fails unless `s` shows the peak pinned within `budget`, saying
/// `context` and the statistics.
fn assert_within_budget(s: &pinpool::Stats, budget: usize, context: &str) {
    assert!(
        s.peak_pinned_bytes <= budget as u64,
        "peak pinned {} KiB under a {} KiB budget {context}: {s:#?}",
        s.peak_pinned_bytes >> 10,
        budget >> 10
    );
}

fn carving() -> (Pool, Arc<Faults>) {
    pool_with(true)
}

const SIZES: [usize; 6] = [300 << 10, 1 << 20, 2 << 20, 700 << 10, 3 << 20, 5 << 20];

#[test]
fn misses_are_met_by_one_region_and_the_next_takes_carve_from_it() {
    let (pool, faults) = carving();
    let first: Vec<_> = SIZES.iter().map(|&n| pool.take(n)).collect();
    // The first misses; later ones may already carve from a region the
    // cleaner grew for it meanwhile.
    assert!(!first[0].was_pooled() && !first[0].is_pinned());
    // Held across provisioning ticks (every 10 ms), which count the whole
    // demand at once: the regions grow for all of it, headroom included,
    // and the same demand again has no reason to grow them.
    std::thread::sleep(Duration::from_millis(100));
    drop(first);
    pool.flush();
    let stats = pool.stats();
    assert!(stats.regions >= 1, "no region: {stats:#?}");
    // Fewer registrations than misses (one region, or a few while the
    // cleaner races the takes).
    let registered = faults.registered();
    assert!(
        registered < SIZES.len() as u64,
        "{registered} registrations for {} misses",
        SIZES.len()
    );
    let total: usize = SIZES.iter().sum();
    assert!(stats.region_bytes >= total, "the region misses demand");
    let mut again: Vec<_> = SIZES.iter().map(|&n| pool.take(n)).collect();
    for b in &again {
        assert!(b.was_pooled() && b.is_pinned(), "a take missed the region");
        assert!(b.iter().all(|&x| x == 0));
    }
    for b in &mut again {
        b.fill(0xAB);
    }
    drop(again);
    pool.flush();
    assert_eq!(
        faults.registered(),
        registered,
        "registered again for the same demand"
    );
    pool.shutdown();
    assert_eq!(faults.registered(), faults.unregistered());
    assert_eq!(pool.stats().regions, 0);
}

#[test]
fn a_large_buffer_given_back_is_carved_into_smaller_classes() {
    let (pool, _faults) = carving();
    drop(pool.take(8 << 20));
    pool.flush();
    // Once back in its region the large buffer's space serves other sizes,
    // all-zero, although they were never taken before.
    let small: Vec<_> = (0..6).map(|_| pool.take(1 << 20)).collect();
    for b in &small {
        assert!(b.was_pooled() && b.is_pinned());
        assert!(b.iter().all(|&x| x == 0));
    }
    let stats = pool.stats();
    assert!(stats.carved >= 6, "{stats:#?}");
    drop(small);
    pool.shutdown();
}

/// A carved buffer held across `shutdown` keeps its region registered,
/// which goes with the buffer's return.
#[test]
fn shutdown_with_a_carved_buffer_held_unregisters_its_region_with_it() {
    let (pool, faults) = carving();
    shut_down_holding_one(&pool, &faults);
    pool.shutdown();
}

/// A pool used again after `shutdown` registers a fresh region on demand,
/// and the next `shutdown` unregisters it.
#[test]
fn a_pool_restarted_after_shutdown_unregisters_its_fresh_region() {
    let (pool, faults) = carving();
    shut_down_holding_one(&pool, &faults);
    // The pool works again, with a fresh region.
    drop(pool.take(1 << 20));
    pool.flush();
    assert!(pool.take(1 << 20).is_pinned());
    pool.shutdown();
    assert_eq!(faults.registered(), faults.unregistered());
}

fn lowered_budget(regions: bool) {
    let (pool, _f) = pool_with(regions);
    let held: Vec<_> = (0..4).map(|_| pool.take(1 << 20)).collect();
    drop(held);
    pool.flush();
    // Pin them (regions: the next takes carve), then drop them idle.
    let held: Vec<_> = (0..4).map(|_| pool.take(1 << 20)).collect();
    drop(held);
    pool.flush();
    let before = pool.stats();
    assert!(before.pinned_bytes > 0, "{before:#?}");
    pool.set_max_pinned_bytes(0);
    pool.flush();
    let after = pool.stats();
    assert_eq!(
        after.pinned_bytes, 0,
        "lowering the budget to 0 with nothing held left memory pinned: {after:#?}"
    );
    pool.shutdown();
}

/// The budget lowered to 0 with nothing held: nothing stays pinned.
#[test]
fn lowering_the_budget_to_zero_unpins_idle_buffers_without_regions() {
    lowered_budget(false);
}

/// As above with regions: the regions left wholly free go too.
#[test]
fn lowering_the_budget_to_zero_releases_wholly_free_regions() {
    lowered_budget(true);
}

/// A large and a small miss: the regions grow by what the two need, not
/// by a region each.
#[test]
fn a_large_and_a_small_miss_grow_the_regions_by_what_they_need() {
    let (pool, _f) = carving();
    let big = pool.take(8 << 20);
    let small = pool.take(4096);
    drop(big);
    drop(small);
    pool.flush();
    let s = pool.stats();
    // Demand: 8 MiB + 4 KiB, an eighth of headroom, rounded to huge pages
    // (and a 2 MiB region if the small miss comes back first). 12 MiB is
    // generous.
    assert!(
        s.region_bytes <= 12 << 20,
        "regions of {} MiB for 8 MiB + 4 KiB of demand: {s:#?}",
        s.region_bytes >> 20
    );
    pool.shutdown();
}

/// A sub-page buffer (a slab's) never shares a page with page buffers.
#[test]
fn page_buffers_own_whole_pages() {
    let (pool, _f) = carving();
    drop(pool.take(4096));
    pool.flush();
    let tiny = pool.take(100);
    let a = pool.take(4096);
    let b = pool.take(4096);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize };
    eprintln!(
        "tiny {:p} a {:p} b {:p}",
        tiny.as_ptr(),
        a.as_ptr(),
        b.as_ptr()
    );
    for buf in [&a, &b] {
        assert_eq!(
            buf.as_ptr() as usize % page,
            0,
            "a page-class buffer shares a page with a sub-page one"
        );
    }
    drop((tiny, a, b));
    pool.shutdown();
}

/// A small carved buffer held across `shutdown` goes back to its
/// unlisted region when dropped, which is then unregistered.
#[test]
fn shutdown_with_a_small_carved_buffer_held_unregisters_its_region_with_it() {
    let (pool, faults) = carving();
    drop(pool.take(4096));
    pool.flush();
    let held = pool.take(4096);
    assert!(held.is_pinned() && held.was_pooled());
    pool.shutdown();
    drop(held);
    pool.flush();
    let s = pool.stats();
    assert_eq!(
        faults.registered(),
        faults.unregistered(),
        "the held buffer's region outlived it (stats.regions {}, pinned {}): {s:#?}",
        s.regions,
        s.pinned_bytes
    );
    pool.shutdown();
}

/// A take whose class is empty never gives up a buffer `reserve` pinned
/// for its class, whether it then carves or misses: not one of a larger
/// class, which a split could use, whatever the take's size.
#[test]
fn a_take_never_gives_up_a_reserved_buffer() {
    // 2 MiB: the reserved buffer fills its region, so only a split could
    // serve the take.
    for (reserved, taken) in [(2 << 20, 300 << 10), (2 << 20, 4096)] {
        let (pool, _f) = carving();
        pool.reserve(0, &[(reserved, 1)]).unwrap();
        pool.flush();
        let before = pool.stats();
        assert_eq!(before.pooled_buffers, 1, "{before:#?}");
        let b = pool.take(taken);
        let after = pool.stats();
        assert_eq!(
            (after.pooled_buffers, after.released),
            (before.pooled_buffers, before.released),
            "a {taken}-byte take gave up the reserved buffer: {after:#?}"
        );
        drop(b);
        pool.shutdown();
    }
}

/// After a shutdown, the cleaner registers nothing until a take misses.
#[test]
fn no_region_is_registered_without_demand() {
    let (pool, faults) = carving();
    shut_down_holding_one(&pool, &faults);
    // Nothing taken since: the cleaner's sweeps should register nothing.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let s = pool.stats();
    assert_eq!(
        faults.registered(),
        faults.unregistered(),
        "a region registered with no take since shutdown: {s:#?}"
    );
    pool.shutdown();
}

/// Free extents count as pooled bytes: lowering the cap releases wholly
/// free regions until idle buffers and free extents fit, and a cap of 0
/// leaves nothing pinned once nothing is held.
#[test]
fn the_cap_bounds_idle_buffers_and_free_extents_together() {
    let (pool, faults) = carving();
    let first: Vec<_> = SIZES.iter().map(|&n| pool.take(n)).collect();
    drop(first);
    pool.flush();
    let stats = pool.stats();
    assert!(stats.free_extent_bytes > 0, "{stats:#?}");
    assert!(stats.pooled_bytes >= stats.free_extent_bytes);
    pool.set_max_pooled_bytes(4096);
    let stats = pool.stats();
    assert!(
        stats.pooled_bytes <= 4096,
        "{} bytes pooled over a 4096-byte cap: {stats:#?}",
        stats.pooled_bytes
    );
    assert_eq!((stats.regions, stats.pinned_bytes), (0, 0));
    assert_eq!(faults.registered(), faults.unregistered());
    // Under the low cap the pool still serves, and is back within it once
    // its regions have been wholly free for the cleaner's 100 ms.
    let again: Vec<_> = SIZES.iter().map(|&n| pool.take(n)).collect();
    drop(again);
    pool.flush();
    let within = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(20));
        pool.stats().pooled_bytes <= 4096
    });
    assert!(within, "{:#?}", pool.stats());
    pool.shutdown();
}

/// With a pinned budget below the smallest region (2 MiB), small page
/// buffers are still pinned: the regions grow smaller, down to the
/// buffer's own size.
#[test]
fn small_buffers_are_pinned_under_a_budget_below_the_smallest_region() {
    let (pool, _faults) = built(|b| b.regions(true).max_pinned_bytes(1 << 20));
    for _ in 0..3 {
        drop(pool.take(4096));
        pool.flush();
    }
    let b = pool.take(4096);
    let s = pool.stats();
    assert!(
        b.is_pinned() && b.was_pooled(),
        "a 4 KiB buffer was never pinned under a 1 MiB budget: {s:#?}"
    );
    drop(b);
    pool.shutdown();
}

/// Lowering the cap just below what is pooled: releasing one wholly free
/// region is enough, so no idle buffer is evicted.
#[test]
fn the_cap_releases_a_free_region_rather_than_evict_an_idle_buffer() {
    let (pool, _f) = carving();
    pool.reserve(0, &[(1 << 20, 1)]).unwrap();
    pool.flush();
    drop(pool.take(4096));
    pool.flush();
    let before = pool.stats();
    assert_eq!(before.pooled_buffers, 1, "{before:#?}");
    pool.set_max_pooled_bytes(before.pooled_bytes - 4096);
    let after = pool.stats();
    assert_eq!(
        (after.evictions - before.evictions, after.pooled_buffers),
        (0, 1),
        "an idle (reserved) buffer was evicted although releasing one wholly free region met the cap"
    );
    pool.shutdown();
}

/// One small carved buffer held keeps its 2 MiB region's free extents,
/// which alone exceed a 1 MiB cap: idle buffers (here a sub-page one), far
/// below the cap themselves, are not evicted for nothing.
#[test]
fn the_cap_never_evicts_idle_buffers_that_cannot_bring_it_under() {
    let (pool, _f) = carving();
    drop(pool.take(4096));
    pool.flush();
    let held = pool.take(4096);
    assert!(held.is_pinned() && held.was_pooled());
    drop(pool.take(100));
    pool.flush();
    assert!(
        pool.take(100).was_pooled(),
        "setup: sub-page buffer not pooled"
    );
    pool.flush();
    let before = pool.stats();
    pool.set_max_pooled_bytes(1 << 20);
    std::thread::sleep(std::time::Duration::from_millis(100));
    let after = pool.stats();
    eprintln!(
        "before: pooled {} free {} buffers {} ev {}; after: pooled {} free {} buffers {} ev {}",
        before.pooled_bytes,
        before.free_extent_bytes,
        before.pooled_buffers,
        before.evictions,
        after.pooled_bytes,
        after.free_extent_bytes,
        after.pooled_buffers,
        after.evictions
    );
    let b = pool.take(100);
    assert!(
        b.was_pooled(),
        "an idle sub-page buffer ({} pooled buffers before) was evicted under a cap it was far below: {after:#?}",
        before.pooled_buffers
    );
    drop((b, held));
    pool.shutdown();
}

/// Demand met partly by a region grown while misses were still out: a take
/// that carves then counts with them, so that the regions grow to hold
/// the misses too once they come back, and the same demand again is met.
#[test]
fn a_take_carving_while_misses_are_out_counts_them_as_demand() {
    let (pool, _faults) = carving();
    let a = pool.take(1 << 20);
    assert!(!a.was_pooled());
    // The provisioning tick grows the regions by the miss's shortfall,
    // while the miss is still out. (Not `trim`, whose release of wholly
    // free regions could take one the periodic tick grew meanwhile.)
    assert!(
        eventually(Duration::from_secs(10), || pool.stats().regions > 0),
        "the tick did not grow the regions"
    );
    let grown = pool.stats().region_bytes;
    assert!(grown >= 1 << 20, "{:#?}", pool.stats());
    let b = pool.take(grown);
    assert!(b.was_pooled(), "the grown region was not carved");
    met_again(&pool, (a, b));
}

/// A miss noted while the regions grow for an earlier one (its
/// registration still running) is demand the growth did not size for:
/// the regions grow for it too once it comes back (it waits, parked, for
/// the running growth to end), before a flush returns.
#[test]
fn a_miss_during_a_growth_still_makes_the_regions_grow() {
    let (pool, faults) = carving();
    let a = pool.take(1 << 20);
    assert!(!a.was_pooled());
    faults.hold_register();
    // The provisioning tick grows the regions for `a`, and blocks in the
    // registration. (Not `trim`, whose release of wholly free regions
    // could take the one the periodic tick grows.)
    assert!(
        eventually(Duration::from_secs(10), || faults.register_calls() > 0),
        "the tick did not grow the regions"
    );
    let b = pool.take(3 << 20);
    assert!(!b.was_pooled(), "no region is listed yet");
    faults.release();
    met_again(&pool, (a, b));
}

/// Drops `held` and flushes, then takes the same sizes again: each must be
/// met by the regions. Shuts `pool` down.
fn met_again(pool: &Pool, held: (pinpool::PinnedBuffer, pinpool::PinnedBuffer)) {
    let sizes = (held.0.len(), held.1.len());
    drop(held);
    pool.flush();
    let again = (pool.take(sizes.0), pool.take(sizes.1));
    assert!(
        again.0.was_pooled() && again.1.was_pooled(),
        "the same demand missed again: {:#?}",
        pool.stats()
    );
    drop(again);
    pool.shutdown();
}

/// The ready buffers of `size` bytes pooled in their class.
fn pooled_of(pool: &Pool, size: usize) -> usize {
    let stats = pool.stats();
    stats
        .per_class
        .iter()
        .find(|c| c.size == size)
        .map_or(0, |c| c.pooled_buffers)
}

/// Buffers kept in their class while it was in demand go back to their
/// region once it is not, well before the idle trim: the class does not
/// hold region memory that other sizes could carve.
#[test]
fn idle_buffers_of_a_class_no_longer_in_demand_go_back_to_their_region() {
    const SIZE: usize = 1 << 20;
    let (pool, _faults) = carving();
    // Many takes of one size at once, again and again: the class is hot,
    // and its buffers wait in it for the next takes.
    let kept = eventually(Duration::from_secs(10), || {
        let held: Vec<_> = (0..16).map(|_| pool.take(SIZE)).collect();
        drop(held);
        pool.flush();
        pooled_of(&pool, SIZE) > 0
    });
    assert!(
        kept,
        "no buffer was kept in its hot class: {:#?}",
        pool.stats()
    );
    // No take of it any more: within a few ticks (the idle trim is 30 s
    // away) every buffer is back in its region, coalesced.
    assert!(
        eventually(Duration::from_secs(5), || pooled_of(&pool, SIZE) == 0),
        "idle buffers stayed in their cold class: {:#?}",
        pool.stats()
    );
    let stats = pool.stats();
    assert_eq!(stats.free_extent_bytes, stats.region_bytes, "{stats:#?}");
    pool.shutdown();
}

/// A prover's burst (twenty 1 MiB buffers taken at once, written, held
/// 2 ms and dropped, every 15 ms or so: some 1,300 takes a second, below a
/// staging loop's) does not make its class hot: its buffers go back to
/// their region (where other sizes carve them), not kept idle in the
/// class. Beside it another thread drops a written 64 KiB buffer every
/// millisecond, so that the cleaner ticks every 10 ms or so (alone, the
/// bursts wake it once each, and every tick counted a whole burst over
/// 15 ms). Sampled every millisecond, ten or more idle buffers of the
/// class in at most one sample in twenty. Counted over one tick (10 ms),
/// a burst made its class hot for the tick that held it: 158-186 samples
/// of 420-428 in three runs.
#[test]
fn bursts_of_takes_below_a_staging_loops_rate_do_not_make_a_class_hot() {
    const SIZE: usize = 1 << 20;
    let (pool, faults) = carving();
    let stop = AtomicBool::new(false);
    let (kept, samples) = (AtomicUsize::new(0), AtomicUsize::new(0));
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let mut b = pool.take(64 << 10);
                b[..4096].fill(1);
                b.set_dirty_len(4096);
                drop(b);
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        s.spawn(|| {
            // From the fourth burst or so.
            std::thread::sleep(Duration::from_millis(50));
            while !stop.load(Ordering::Relaxed) {
                samples.fetch_add(1, Ordering::Relaxed);
                kept.fetch_add(usize::from(pooled_of(&pool, SIZE) >= 10), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        for _ in 0..40 {
            let held: Vec<_> = (0..20)
                .map(|_| {
                    let mut b = pool.take(SIZE);
                    b[..128 << 10].fill(1);
                    b.set_dirty_len(128 << 10);
                    b
                })
                .collect();
            std::thread::sleep(Duration::from_millis(2));
            drop(held);
            std::thread::sleep(Duration::from_millis(13));
        }
        stop.store(true, Ordering::Relaxed);
    });
    let stats = pool.stats();
    pool.shutdown();
    assert_eq!(faults.registered(), faults.unregistered());
    let (kept, samples) = (kept.into_inner(), samples.into_inner());
    assert!(
        kept * 20 <= samples,
        "ten or more idle 1 MiB buffers in {kept} of {samples} samples: {stats:#?}"
    );
}

/// Carved buffers dropped and still in the cleaner (waiting for a device
/// synchronize) are not demand: misses taken meanwhile for the same sizes
/// do not make the regions grow by what the cleaner holds (else a cleaner
/// that falls behind pins more and more).
#[test]
#[cfg_attr(
    pinpool_asan,
    ignore = "a timing bound (a provisioning tick within 200 ms of the drops): AddressSanitizer's \
              slowdown breaks it (it grew by the whole demand once, the tick late)"
)]
fn buffers_waiting_in_the_cleaner_do_not_make_the_regions_grow() {
    const SIZE: usize = 4 << 20;
    const N: usize = 8;
    let (pool, faults) = carving();
    // Held across provisioning ticks, which count the whole demand at once
    // (see the first test).
    let first: Vec<_> = (0..N).map(|_| pool.take(SIZE)).collect();
    std::thread::sleep(Duration::from_millis(100));
    drop(first);
    pool.flush();
    let carved: Vec<_> = (0..N).map(|_| pool.take(SIZE)).collect();
    assert!(carved.iter().all(|b| b.was_pooled()), "{:#?}", pool.stats());
    let grown = pool.stats().region_bytes;
    // Event-less pinned buffers wait for a device synchronize: held.
    faults.hold_synchronize();
    drop(carved);
    // Past a provisioning tick (every 10 ms; some 20 of them, for a loaded
    // machine), which counts what takes hold: a miss noted before it
    // counts the dropped buffers as still held.
    std::thread::sleep(Duration::from_millis(200));
    // The same demand again, while the cleaner holds the memory: misses,
    // held across a few provisioning ticks, then dropped.
    let missed: Vec<_> = (0..N).map(|_| pool.take(SIZE)).collect();
    assert!(missed.iter().any(|b| !b.was_pooled()));
    std::thread::sleep(Duration::from_millis(100));
    drop(missed);
    std::thread::sleep(Duration::from_millis(100));
    let while_held = pool.stats().region_bytes;
    faults.release();
    pool.flush();
    // Once the misses came back too, and a few ticks later.
    std::thread::sleep(Duration::from_millis(50));
    let after = pool.stats().region_bytes;
    for bytes in [while_held, after] {
        assert!(
            bytes < grown + N * SIZE / 2,
            "the regions grew from {grown} to {bytes} bytes for a demand of {} bytes",
            N * SIZE
        );
    }
    pool.shutdown();
}

/// A take that finds enough free bytes but no extent large enough (the
/// free space lies between buffers still held) makes the regions grow by
/// a region that holds it: the same take again is met, although the bytes
/// in use never passed what the regions hold.
#[test]
fn a_miss_for_want_of_one_large_extent_grows_a_region_that_holds_it() {
    const MIB: usize = 1 << 20;
    // Eight sizes of eight classes: none is hot, so each buffer goes back
    // to its region when dropped, and the layout is the takes' order.
    let sizes: Vec<usize> = (0..8).map(|k| MIB + k * (MIB / 8)).collect();
    let (pool, _faults) = carving();
    // Held across provisioning ticks, which count the whole demand at once
    // (see the first test): the regions then hold all eight.
    let first: Vec<_> = sizes.iter().map(|&n| pool.take(n)).collect();
    std::thread::sleep(Duration::from_millis(100));
    drop(first);
    pool.flush();
    let mut held: Vec<_> = sizes.iter().map(|&n| pool.take(n)).collect();
    assert!(held.iter().all(|b| b.was_pooled()), "{:#?}", pool.stats());
    // Every other one back: narrow holes between the ones still held.
    let mut kept = Vec::new();
    for (i, b) in held.drain(..).enumerate() {
        if i % 2 == 1 {
            kept.push(b);
        }
    }
    pool.flush();
    let before = pool.stats();
    let wide = 3 * MIB;
    assert!(
        before.largest_free_extent < wide && before.free_extent_bytes >= wide,
        "the set-up wants free bytes in narrow extents: {before:#?}"
    );
    let miss = pool.take(wide);
    assert!(!miss.was_pooled(), "{:#?}", pool.stats());
    drop(miss);
    pool.flush();
    let again = pool.take(wide);
    assert!(
        again.was_pooled(),
        "the same take missed again: {:#?}",
        pool.stats()
    );
    drop((again, kept));
    pool.shutdown();
}

/// Demand held steady just past 8/9 of what the regions hold, under a cap
/// on idle bytes below what growing ahead of demand would add free: with
/// nothing taken or dropped, the regions settle (no region grown ahead
/// only for the cap to release it once wholly free, again and again).
#[test]
fn growing_ahead_does_not_fight_the_caps_release() {
    const MIB: usize = 1 << 20;
    let (pool, faults) = carving();
    // One 32 MiB miss, back: a region of 32 MiB and an eighth (36 MiB).
    drop(pool.take(32 * MIB));
    pool.flush();
    assert!(
        eventually(Duration::from_secs(10), || pool.stats().regions > 0),
        "{:#?}",
        pool.stats()
    );
    // Held: 33 MiB carved from it, and 33 MiB and an eighth passes 36 MiB.
    let held = (pool.take(32 * MIB), pool.take(MIB));
    assert!(
        held.0.was_pooled() && held.1.was_pooled(),
        "{:#?}",
        pool.stats()
    );
    // Idle bytes and free extents may be 4 MiB: the 3 MiB left in the
    // first region fit, a region grown ahead does not.
    pool.set_max_pooled_bytes(4 * MIB);
    std::thread::sleep(Duration::from_millis(300));
    let (before, s0) = (faults.registered(), pool.stats());
    std::thread::sleep(Duration::from_millis(1000));
    let (after, s1) = (faults.registered(), pool.stats());
    assert!(
        after - before <= 1,
        "{} registrations (and {} regions released) in 1 s with nothing taken or dropped: \
         the tick grows ahead and the cap releases it, again and again: {s1:#?}",
        after - before,
        s1.regions_released - s0.regions_released
    );
    drop(held);
    pool.shutdown();
}

/// A reserved buffer idle in a class that is no longer hot stays in it,
/// and keeps none of the class's other idle buffers from going back to
/// their region.
#[test]
#[ignore = "timing-bound set-up: it stalls the provisioning tick in a held registration, and on \
            a slow run (AddressSanitizer on 2 cores) the reserved buffer's carve can wait behind \
            that growth's lock, failing the set-up; run with --ignored"]
fn a_reserved_buffer_does_not_keep_a_cold_classs_buffers_from_their_region() {
    crate::common::within(Duration::from_secs(60), "the cooling test", cooling);
}

fn cooling() {
    const SIZE: usize = 64 << 10;
    let (pool, faults) = carving();
    // Room in the regions for 64 buffers of the class, so that nothing
    // below needs them to grow (the growth lock is held below).
    let roomy = eventually(Duration::from_secs(10), || {
        let held: Vec<_> = (0..64).map(|_| pool.take(SIZE)).collect();
        let all = held.iter().all(|b| b.was_pooled());
        drop(held);
        pool.flush();
        all
    });
    assert!(
        roomy,
        "setup: the regions did not grow: {:#?}",
        pool.stats()
    );
    // The class hot, its buffers carved and kept in it.
    let warm = eventually(Duration::from_secs(10), || {
        let held: Vec<_> = (0..16).map(|_| pool.take(SIZE)).collect();
        drop(held);
        pool.flush();
        pooled_of(&pool, SIZE) >= 8
    });
    assert!(
        warm,
        "setup: no buffer kept in its hot class: {:#?}",
        pool.stats()
    );
    // Hold 16, keep the class hot from another thread, and stall the
    // tick (worker 0) in a registration: a large miss held makes it grow
    // the regions, held by the fault backend. The class stays
    // marked hot meanwhile.
    let held: Vec<_> = (0..16).map(|_| pool.take(SIZE)).collect();
    assert!(held.iter().all(|b| b.was_pooled()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hot = {
        let (pool, stop) = (pool.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                drop(pool.take(SIZE));
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(30));
    faults.hold_register();
    let calls = faults.register_calls();
    let miss = pool.take(64 << 20);
    assert!(!miss.was_pooled());
    assert!(
        eventually(Duration::from_secs(10), || faults.register_calls() > calls),
        "setup: the tick did not grow the regions"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    hot.join().unwrap();
    // The 16 go to their hot class's stack, then a reserved buffer on top
    // of them (carved by worker 1 from the regions' free extents). Not a
    // flush: it would wait for the growth held in its registration.
    drop(held);
    eventually(Duration::from_secs(10), || pooled_of(&pool, SIZE) >= 16);
    let kept = pooled_of(&pool, SIZE);
    assert!(
        kept >= 16,
        "setup: the class was cold already: {:#?}",
        pool.stats()
    );
    pool.reserve(0, &[(SIZE, 1)]).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || pooled_of(&pool, SIZE) > kept),
        "setup: the reserved buffer was not pooled: {:#?}",
        pool.stats()
    );
    faults.release();
    drop(miss);
    pool.flush();
    // No take of the class any more: within a few ticks only the reserved
    // buffer is left in it.
    let cooled = eventually(Duration::from_secs(3), || pooled_of(&pool, SIZE) <= 1);
    assert!(
        cooled,
        "{} idle buffers stayed in their cold class under a reserved one: {:#?}",
        pooled_of(&pool, SIZE) - 1,
        pool.stats()
    );
    pool.shutdown();
}

/// A buffer `reserve` asks for may pass the pinned budget by its own bytes
/// only: the regions' growth for other demand on its way stays within the
/// budget, and the reserved buffer stays pooled.
#[test]
fn a_reserved_buffer_does_not_carry_the_demands_growth_past_the_budget() {
    const MIB: usize = 1 << 20;
    let budget = 16 * MIB;
    let (pool, _faults) = built(|b| b.regions(true).max_pinned_bytes(budget));
    // A miss past the budget, held: the regions fall short by 72 MiB,
    // which the budget keeps them from growing.
    let miss = pool.take(64 * MIB);
    assert!(!miss.was_pooled());
    std::thread::sleep(Duration::from_millis(50));
    // 1 MiB reserved: within the budget.
    pool.reserve(0, &[(MIB, 1)]).unwrap();
    pool.flush();
    let s = pool.stats();
    // (The growth past the budget is then released, and the reserved
    // buffer with it: `finish` frees a pinned buffer past the budget.)
    assert!(
        s.peak_pinned_bytes <= budget as u64 && s.pooled_buffers == 1,
        "{} MiB pinned at the peak under a {} MiB budget, {} reserved buffers pooled of 1: {s:#?}",
        s.peak_pinned_bytes >> 20,
        budget >> 20,
        s.pooled_buffers
    );
    drop(miss);
    pool.shutdown();
}

/// Demand the pinned budget keeps the regions from meeting is not retried
/// at every tick once the pool is idle: no skipped registration is counted
/// again and again.
#[test]
fn a_shortfall_the_budget_forbids_is_not_retried_every_tick() {
    const MIB: usize = 1 << 20;
    let (pool, _faults) = built(|b| b.regions(true).max_pinned_bytes(16 * MIB));
    let miss = pool.take(64 * MIB);
    assert!(!miss.was_pooled());
    drop(miss);
    pool.flush();
    std::thread::sleep(Duration::from_millis(100));
    let before = pool.stats().registrations_skipped;
    std::thread::sleep(Duration::from_millis(500));
    let s = pool.stats();
    assert!(
        s.registrations_skipped - before <= 2,
        "{} registrations skipped in 500 ms by an idle pool: {s:#?}",
        s.registrations_skipped - before
    );
    pool.shutdown();
}

/// While one cleaner worker waits in a region's registration, the other
/// keeps recycling: misses coming back meanwhile do not wait for that
/// growth (it takes their demand), so a dirty pinned buffer dropped then
/// is ready again before the registration ends.
#[test]
fn recycling_goes_on_while_a_region_registers() {
    let (pool, faults) = carving();
    drop(pool.take(1 << 20));
    pool.flush();
    let mut carved = pool.take(1 << 20);
    assert!(carved.is_pinned(), "not carved from the first region");
    faults.hold_register();
    let calls = faults.register_calls();
    // Demand past the region, held: the provisioning tick grows the
    // regions for it and blocks in the registration.
    let misses: Vec<_> = (0..4).map(|_| pool.take(4 << 20)).collect();
    assert!(misses.iter().all(|m| !m.was_pooled()));
    let growing = eventually(Duration::from_secs(10), || faults.register_calls() > calls);
    // The misses come back while it registers; time for the other worker
    // to take them up.
    drop(misses);
    std::thread::sleep(Duration::from_millis(50));
    let recycled = pool.stats().recycled;
    carved.fill(1);
    drop(carved);
    let ready = eventually(Duration::from_secs(3), || pool.stats().recycled > recycled);
    faults.release();
    assert!(growing, "no growth for the misses");
    assert!(
        ready,
        "a dropped buffer waited for a registration: {:#?}",
        pool.stats()
    );
    pool.shutdown();
}

/// A flush waits for a growth of the regions under way when it starts
/// (held here in its registration), and returns once it has ended.
#[test]
fn a_flush_waits_for_a_growth_under_way() {
    let (pool, faults) = carving();
    faults.hold_register();
    let held = pool.take(MIB_);
    assert!(
        eventually(Duration::from_secs(10), || faults.register_calls() > 0),
        "setup: no growth for the held miss"
    );
    let flushing = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.flush())
    };
    let blocked = !eventually(Duration::from_millis(300), || flushing.is_finished());
    faults.release();
    flushing.join().unwrap();
    drop(held);
    pool.shutdown();
    assert!(blocked, "the flush returned while a growth was under way");
}

/// A burst of misses whose first buffer comes back at once, while the rest
/// of the burst still arrives (takes 200 us apart, well inside the 2 ms
/// the demand must stop rising for): the regions grow once, when the burst
/// has settled, for all of it, not for the first miss back and then again
/// for the rest. A run that a loaded machine stretched (a gap between
/// takes past 1 ms) proves nothing and is run again, up to five times;
/// five stretched runs give no verdict. (Before a returned miss waited for
/// the demand to settle: two registrations.)
#[test]
#[cfg_attr(
    pinpool_asan,
    ignore = "timing-bound: takes 200 us apart, which AddressSanitizer's slowdown stretches"
)]
fn a_miss_back_during_a_burst_grows_the_regions_once_for_all_of_it() {
    for attempt in 1.. {
        let (pool, faults) = carving();
        drop(pool.take(MIB_));
        let mut held = Vec::new();
        let (mut last, mut widest) = (Instant::now(), Duration::ZERO);
        for _ in 0..15 {
            while last.elapsed() < Duration::from_micros(200) {
                std::hint::spin_loop();
            }
            held.push(pool.take(MIB_));
            widest = widest.max(last.elapsed());
            last = Instant::now();
        }
        drop(held);
        pool.flush();
        let registered = faults.registered();
        pool.shutdown();
        if widest > Duration::from_millis(1) {
            // Stretched past what the test can judge (a gap near the 2 ms
            // settling time splits the burst by design): again, and if
            // every run was stretched, no verdict rather than a false one.
            if attempt < 5 {
                continue;
            }
            eprintln!("every run stretched (widest gap {widest:?}): no verdict");
            break;
        }
        assert_eq!(
            registered, 1,
            "a burst of 16 misses, the first back at once, registered {registered} regions \
             (widest gap between takes {widest:?})"
        );
        break;
    }
}

/// A miss that comes back while another worker's growth of its set is
/// registering waits for that growth to end, then grows the set for
/// itself: a flush after its drop returns with its demand met (with
/// another miss still held, once its demand has stopped rising).
#[test]
fn a_miss_back_during_a_growth_is_met_after_a_flush() {
    /// The settling time of a set's demand before a growth (`GROWTH_SETTLE`).
    const GROWTH_SETTLE: Duration = Duration::from_millis(2);
    let (pool, faults) = carving();
    let a = pool.take(1 << 20);
    assert!(!a.was_pooled());
    faults.hold_register();
    // The provisioning tick grows the regions for `a`, held in the
    // registration.
    assert!(
        eventually(Duration::from_secs(10), || faults.register_calls() > 0),
        "the tick did not grow the regions"
    );
    let b = pool.take(3 << 20);
    assert!(!b.was_pooled(), "no region is listed yet");
    // Past the settling time of `b`'s demand: its return grows the set
    // (no burst under way), once the running growth lets it.
    std::thread::sleep(GROWTH_SETTLE * 10);
    drop(b);
    // Time for a worker to take `b` up while the growth still registers.
    std::thread::sleep(Duration::from_millis(50));
    faults.release();
    pool.flush();
    let again = pool.take(3 << 20);
    assert!(
        again.was_pooled(),
        "the miss back during a growth was not met after a flush: {:#?}",
        pool.stats()
    );
    drop((a, again));
    pool.shutdown();
}

/// A mebibyte, for the growth tests below.
const MIB_: usize = 1 << 20;

/// Five 1 MiB misses at once (a demand of 5 MiB, 5.625 MiB with its
/// headroom): the growth covers the whole demand, so the same five takes
/// after a flush are met.
#[test]
fn rounding_down_never_cuts_below_the_demand() {
    let (pool, faults) = carving();
    let held: Vec<_> = (0..5).map(|_| pool.take(MIB_)).collect();
    // The first misses; later ones may carve from a region the cleaner
    // grew for it meanwhile.
    assert!(!held[0].was_pooled());
    drop(held);
    pool.flush();
    let grown = pool.stats().region_bytes;
    let again: Vec<_> = (0..5).map(|_| pool.take(MIB_)).collect();
    let missed = again.iter().filter(|b| !b.was_pooled()).count();
    assert!(
        missed == 0 && grown >= 5 * MIB_,
        "{missed} of 5 takes missed after a flush; regions grown to {} KiB for a 5 MiB demand \
         ({} registrations)",
        grown >> 10,
        faults.registered()
    );
    drop(again);
    pool.shutdown();
    assert_eq!(faults.registered(), faults.unregistered());
}

/// A working set that ramps up steadily (one more 256 KiB buffer held
/// every ~1 ms, for ~400 ms): its peak rises more often than every
/// `GROWTH_SETTLE`, and no miss comes back, yet the regions grow while the
/// ramp lasts (a run of rises holds growth back for a bounded time only).
#[test]
#[ignore = "timing-bound: on a loaded 2-core box the cleaner falls behind the ramp (8 of 400 \
            takes hit in one run beside three other test runs); run with --ignored"]
fn a_steady_ramp_still_makes_the_regions_grow() {
    let (pool, _faults) = carving();
    let mut held = Vec::new();
    let mut regions_at = None;
    for i in 0..400 {
        held.push(pool.take(256 << 10));
        if regions_at.is_none() && pool.stats().regions > 0 {
            regions_at = Some(i);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let hits = held.iter().filter(|b| b.was_pooled()).count();
    let s = pool.stats();
    drop(held);
    pool.shutdown();
    assert!(
        hits > 100,
        "{hits} of 400 takes hit over a ~400 ms ramp; first region at take {regions_at:?}; \
         regions {} ({} KiB)",
        s.regions,
        s.region_bytes >> 10
    );
}

/// A small buffer `reserve` asks for, which needs the regions to grow,
/// while they fall short by a 64 MiB miss the budget forbids: the reserved
/// growth passes the budget by its own bytes only, never by the miss's
/// shortfall.
#[test]
fn a_small_reserved_buffer_does_not_carry_a_large_shortfall_past_the_budget() {
    let budget = 16 * MIB_;
    let (pool, _faults) = built(|b| b.regions(true).max_pinned_bytes(budget));
    let miss = pool.take(64 * MIB_);
    assert!(!miss.was_pooled());
    // At once: the sweep leaves the 64 MiB shortfall alone while the
    // demand is rising (`GROWTH_SETTLE`), so the reserve's growth takes it.
    pool.reserve(0, &[(64 << 10, 1)]).unwrap();
    pool.flush();
    let s = pool.stats();
    drop(miss);
    pool.shutdown();
    assert_within_budget(&s, budget, "");
}

/// A miss parked for another worker's growth, then the pool shut down
/// while that growth is still held: shutdown waits, and once released
/// every registration is undone, and nothing stays pinned.
#[test]
fn shutdown_with_a_miss_parked_for_a_growth() {
    let (pool, faults) = carving();
    let a = pool.take(MIB_);
    faults.hold_register();
    assert!(eventually(Duration::from_secs(10), || faults
        .register_calls()
        > 0));
    let b = pool.take(3 * MIB_);
    assert!(!b.was_pooled());
    std::thread::sleep(Duration::from_millis(10));
    drop(b);
    std::thread::sleep(Duration::from_millis(50));
    let pool2 = pool.clone();
    let shut = std::thread::spawn(move || pool2.shutdown());
    std::thread::sleep(Duration::from_millis(100));
    faults.release();
    shut.join().unwrap();
    drop(a);
    pool.flush();
    pool.shutdown();
    let s = pool.stats();
    assert_eq!(faults.registered(), faults.unregistered(), "{s:#?}");
    assert_eq!(s.pinned_bytes, 0, "{s:#?}");
    assert_eq!(s.regions, 0, "{s:#?}");
}

/// The same, with the last handle dropped (close) after the growth ends,
/// parked buffer handed to the reaper or finished inline.
#[test]
fn clear_and_flush_with_a_miss_parked_for_a_growth() {
    let (pool, faults) = carving();
    let a = pool.take(MIB_);
    faults.hold_register();
    assert!(eventually(Duration::from_secs(10), || faults
        .register_calls()
        > 0));
    let b = pool.take(3 * MIB_);
    std::thread::sleep(Duration::from_millis(10));
    drop(b);
    std::thread::sleep(Duration::from_millis(50));
    // clear concurrently with the parked buffer and the held growth: no
    // deadlock.
    let p = pool.clone();
    let clearing = std::thread::spawn(move || {
        for _ in 0..20 {
            p.clear();
        }
    });
    let p = pool.clone();
    let flushing = std::thread::spawn(move || p.flush());
    // The growth stays held until `release` below, so the clears finish
    // only if they do not wait for it (on a loaded machine, under
    // AddressSanitizer, 20 clears took more than 100 ms).
    assert!(
        eventually(Duration::from_secs(10), || clearing.is_finished()),
        "clear blocked on a held growth"
    );
    assert!(
        !flushing.is_finished(),
        "a flush returned before the parked miss was done"
    );
    faults.release();
    clearing.join().unwrap();
    flushing.join().unwrap();
    let again = pool.take(3 * MIB_);
    assert!(again.was_pooled(), "{:#?}", pool.stats());
    drop((a, again));
    pool.shutdown();
    assert_eq!(faults.registered(), faults.unregistered());
}

/// The running growth fails (every call of it) while a miss is parked for
/// it: the parked miss, re-polled, grows the regions for both.
#[test]
fn a_failed_growth_with_a_miss_parked() {
    let (pool, faults) = carving();
    let a = pool.take(MIB_);
    faults.fail_register(&[1, 2, 3, 4, 5, 6, 7, 8]);
    faults.hold_register();
    assert!(eventually(Duration::from_secs(10), || faults
        .register_calls()
        > 0));
    let b = pool.take(3 * MIB_);
    std::thread::sleep(Duration::from_millis(10));
    drop(b);
    std::thread::sleep(Duration::from_millis(50));
    faults.release();
    pool.flush();
    let calls = faults.register_calls();
    let again = pool.take(3 * MIB_);
    assert!(
        again.was_pooled() || calls <= 8,
        "after {calls} registration calls: {:#?}",
        pool.stats()
    );
    drop((a, again));
    pool.shutdown();
    assert_eq!(faults.registered(), faults.unregistered());
}

/// A small miss back grows the regions while a 1 MiB miss is still out:
/// the growth is for both, so the 1 MiB take after a flush is met. (On
/// fresh pools, several times: a provisioning tick between the two flushes
/// can re-note the demand and hide the loss.)
#[test]
fn a_small_misses_growth_covers_a_large_miss_still_out() {
    let mut failures = Vec::new();
    for attempt in 0..6 {
        let (pool, _faults) = carving();
        let large = pool.take(MIB_);
        let small = pool.take(64 << 10);
        assert!(!large.was_pooled() && !small.was_pooled());
        drop(small);
        pool.flush();
        drop(large);
        pool.flush();
        let again = pool.take(MIB_);
        if !again.was_pooled() {
            let s = pool.stats();
            failures.push(format!(
                "attempt {attempt}: the 1 MiB take missed after a flush; {} regions, {} KiB, \
                 {} KiB free",
                s.regions,
                s.region_bytes >> 10,
                s.free_extent_bytes >> 10
            ));
        }
        drop(again);
        pool.shutdown();
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A long-lived miss held while a burst of other buffers misses and comes
/// back: the burst's last miss back grows the regions for it (the held miss
/// does not hold that growth back), so the same burst after a flush is
/// met.
#[test]
fn a_miss_held_elsewhere_does_not_defeat_flush_then_take() {
    let (pool, _faults) = carving();
    let long_lived = pool.take(8 * MIB_);
    assert!(!long_lived.was_pooled());
    // Let the regions grow for it (settled, tick).
    assert!(eventually(Duration::from_secs(10), || pool
        .stats()
        .region_bytes
        >= 9 * MIB_));
    let grown = pool.stats().region_bytes;
    // A burst past what is free, dropped at once.
    let n = grown / MIB_ + 2;
    let burst: Vec<_> = (0..n).map(|_| pool.take(MIB_)).collect();
    // Most of it misses (on a loaded box the regions may grow for part of
    // it while it is taken).
    let missed = burst.iter().filter(|b| !b.was_pooled()).count();
    drop(burst);
    pool.flush();
    let again: Vec<_> = (0..n).map(|_| pool.take(MIB_)).collect();
    let missed_again = again.iter().filter(|b| !b.was_pooled()).count();
    let s = pool.stats();
    drop(again);
    drop(long_lived);
    pool.shutdown();
    assert_eq!(
        missed_again,
        0,
        "{missed_again} of {n} missed again after a flush ({missed} the first time); \
         regions {} KiB",
        s.region_bytes >> 10
    );
}

/// Small and large misses and reserves on many threads while
/// registrations are held: no deadlock around the growth lock (reserves
/// wait for it, misses pass it by), and everything is released once the
/// registrations are.
#[test]
fn small_and_large_growth_do_not_deadlock() {
    let (pool, faults) = carving();
    faults.hold_register();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let pool = pool.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    let size = if (i + t) % 2 == 0 { 64 << 10 } else { 2 * MIB_ };
                    let b = pool.take(size);
                    if i % 10 == t {
                        let _ = pool.reserve(0, &[(size, 1)]);
                    }
                    drop(b);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    faults.release();
    for t in threads {
        t.join().unwrap();
    }
    let p = pool.clone();
    let flushed = std::thread::spawn(move || p.flush());
    assert!(
        eventually(Duration::from_secs(20), || flushed.is_finished()),
        "flush hung: {:#?}",
        pool.stats()
    );
    pool.shutdown();
    assert_eq!(faults.registered(), faults.unregistered());
}

/// The last handle dropped (close) while a miss is parked for a held
/// growth: the close waits for the grower, the parked miss is finished
/// or handed to the reaper, and every registration is undone.
#[test]
fn close_with_a_miss_parked_for_a_growth() {
    let (pool, faults) = carving();
    let a = pool.take(MIB_);
    faults.hold_register();
    assert!(eventually(Duration::from_secs(10), || faults
        .register_calls()
        > 0));
    let b = pool.take(3 * MIB_);
    let c = pool.take(100 << 10);
    std::thread::sleep(Duration::from_millis(10));
    drop((b, c));
    std::thread::sleep(Duration::from_millis(50));
    drop(a);
    let closing = std::thread::spawn(move || drop(pool));
    std::thread::sleep(Duration::from_millis(50));
    faults.release();
    closing.join().unwrap();
    assert!(
        eventually(Duration::from_secs(10), || faults.registered()
            == faults.unregistered()),
        "{} registered, {} unregistered",
        faults.registered(),
        faults.unregistered()
    );
}

/// Every registration fails while misses are parked for the (failing)
/// growth: flush still returns, and nothing stays registered.
#[test]
fn parked_misses_with_every_registration_failing() {
    let (pool, faults) = carving();
    faults.fail_register(&(1..=200).collect::<Vec<_>>());
    let a = pool.take(MIB_);
    faults.hold_register();
    assert!(eventually(Duration::from_secs(10), || faults
        .register_calls()
        > 0));
    let small: Vec<_> = (0..4).map(|_| pool.take(100 << 10)).collect();
    let large: Vec<_> = (0..4).map(|_| pool.take(2 * MIB_)).collect();
    std::thread::sleep(Duration::from_millis(10));
    drop((small, large));
    std::thread::sleep(Duration::from_millis(30));
    let p = pool.clone();
    let flushing = std::thread::spawn(move || p.flush());
    std::thread::sleep(Duration::from_millis(30));
    faults.release();
    assert!(
        eventually(Duration::from_secs(10), || flushing.is_finished()),
        "flush hung: {:#?}",
        pool.stats()
    );
    drop(a);
    pool.shutdown();
    assert_eq!(faults.registered(), faults.unregistered());
    assert_eq!(pool.stats().pinned_bytes, 0);
}

/// A burst of `n` takes of `size` bytes, whose demand passes the pinned
/// `budget`, held, dropped and flushed; then one take of `size` at a time:
/// the regions still grow within the budget (a growth the budget refuses
/// is retried smaller, down to the buffer), so that such a take is met.
fn a_burst_past_the_budget_is_met_within_it(size: usize, n: usize, budget: usize) {
    let (pool, faults) = built(|b| b.regions(true).max_pinned_bytes(budget));
    let burst: Vec<_> = (0..n).map(|_| pool.take(size)).collect();
    // The first misses; later ones may carve from a region the cleaner
    // grew for it meanwhile.
    assert!(!burst[0].was_pooled());
    std::thread::sleep(Duration::from_millis(50));
    drop(burst);
    pool.flush();
    let met = eventually(Duration::from_secs(3), || {
        let b = pool.take(size);
        let hit = b.was_pooled();
        drop(b);
        pool.flush();
        hit
    });
    let s = pool.stats();
    pool.shutdown();
    assert!(
        met,
        "a lone {size}-byte take never met under a {budget}-byte budget after {n} of them: \
         {} registrations, {} skipped, pinned {} bytes",
        faults.registered(),
        s.registrations_skipped,
        s.pinned_bytes
    );
}

/// 16 MiB of 1 MiB takes under an 8 MiB budget.
#[test]
fn a_demand_past_the_budget_still_grows_within_it() {
    a_burst_past_the_budget_is_met_within_it(MIB_, 16, 8 * MIB_);
}

/// A burst of misses on device 0, dropped, then `other` (more work for
/// the cleaner's registrations), then a flush, twenty times on fresh
/// pools: how often the same burst on device 0 then missed.
fn burst_then_other_work(other: impl Fn(&Pool)) -> (usize, usize) {
    let mut failures = 0;
    let attempts = 20;
    for _ in 0..attempts {
        let (pool, _faults) = built(|b| b.regions(true).devices(2));
        let n = 12;
        let burst: Vec<_> = (0..n).map(|_| pool.take_on(0, MIB_).unwrap()).collect();
        drop(burst);
        other(&pool);
        pool.flush();
        let again: Vec<_> = (0..n).map(|_| pool.take_on(0, MIB_).unwrap()).collect();
        if again.iter().any(|b| !b.was_pooled()) {
            failures += 1;
            let s = pool.stats();
            eprintln!(
                "missed {} of {n}; regions {} ({} KiB, {} KiB free), registered {}",
                again.iter().filter(|b| !b.was_pooled()).count(),
                s.regions,
                s.region_bytes >> 10,
                s.free_extent_bytes >> 10,
                _faults.registered()
            );
        }
        drop(again);
        pool.shutdown();
    }
    (failures, attempts)
}

/// Buffers reserved on device 1 after a burst of misses on device 0: the
/// burst's growth does not wait for them, and the same burst after a flush
/// is met.
#[test]
fn other_devices_registrations_do_not_defer_a_bursts_growth() {
    let (control, attempts) = burst_then_other_work(|_| {});
    let (failures, _) = burst_then_other_work(|pool| {
        pool.reserve(1, &[(MIB_, 32)]).unwrap();
    });
    // At most two: a registration backlog the reserve fills sheds a miss
    // now and then (by design), and its demand is then grown for by the
    // sweep, after the flush. (Before the burst's growth stopped waiting
    // for other registrations: 3 to 12 of 20.)
    assert!(
        failures <= 2,
        "{failures} of {attempts} bursts on device 0 missed again after a flush when device 1 \
         reserved buffers meanwhile (control without the reserve: {control} of {attempts})"
    );
}

/// Small buffers reserved on device 0 after a burst of large misses there:
/// the burst's growth does not wait for them, and the same burst after a
/// flush is met.
#[test]
fn reserve_jobs_do_not_defer_a_bursts_growth() {
    let (failures, attempts) = burst_then_other_work(|pool| {
        pool.reserve(0, &[(64 << 10, 32)]).unwrap();
    });
    // At most two, as above. (Before the burst's growth stopped waiting
    // for other registrations: 20 of 20.)
    assert!(
        failures <= 2,
        "{failures} of {attempts} bursts missed again after a flush when small buffers were \
         reserved meanwhile"
    );
}

/// Twelve 1 MiB misses and one 64 KiB miss, the large ones back first:
/// the regions grown for them hold all thirteen, so all are met after a
/// flush.
#[test]
fn a_small_miss_after_a_burst_of_large_ones_leaves_them_their_share() {
    let mut failures = Vec::new();
    for _ in 0..10 {
        let (pool, faults) = carving();
        let large: Vec<_> = (0..12).map(|_| pool.take(MIB_)).collect();
        let small = pool.take(64 << 10);
        drop(large);
        std::thread::sleep(Duration::from_millis(5));
        drop(small);
        pool.flush();
        let again: Vec<_> = (0..12).map(|_| pool.take(MIB_)).collect();
        let small_again = pool.take(64 << 10);
        let missed = again.iter().filter(|b| !b.was_pooled()).count()
            + usize::from(!small_again.was_pooled());
        if missed > 0 {
            let s = pool.stats();
            failures.push(format!(
                "{missed} of 13 missed; {} regions ({} KiB, {} KiB free), {} registrations",
                s.regions,
                s.region_bytes >> 10,
                s.free_extent_bytes >> 10,
                faults.registered()
            ));
        }
        drop((again, small_again));
        pool.shutdown();
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A small miss back while an 8 MiB miss past the pinned budget is out:
/// the growth falls back to what the budget allows, and the small take is
/// met.
#[test]
fn a_growth_past_the_budget_falls_back_to_what_it_allows() {
    small_miss_back_past_the_budget(Duration::ZERO);
}

/// As above, with both misses held past a few provisioning sweeps first:
/// a sweep that took the shortfall the budget forbids (it cannot meet even
/// the 8 MiB miss) and was refused left nothing for the small miss to grow
/// by when it came back, and it was freed (the next take missed again).
#[test]
fn a_shortfall_the_budget_forbids_is_left_to_the_misses_out() {
    small_miss_back_past_the_budget(Duration::from_millis(50));
}

/// An 8 MiB and a 64 KiB miss under a 4 MiB budget, both held for `held`,
/// then the small one dropped and flushed: a take of its size is met,
/// within the budget.
fn small_miss_back_past_the_budget(held: Duration) {
    let budget = 4 * MIB_;
    let (pool, faults) = built(|b| b.regions(true).max_pinned_bytes(budget));
    let large = pool.take(8 * MIB_);
    let small = pool.take(64 << 10);
    assert!(!large.was_pooled() && !small.was_pooled());
    std::thread::sleep(held);
    drop(small);
    pool.flush();
    let again = pool.take(64 << 10);
    let hit = again.was_pooled();
    let s = pool.stats();
    drop((again, large));
    pool.shutdown();
    assert!(
        hit && s.peak_pinned_bytes <= budget as u64,
        "small take met: {hit}; peak pinned {} KiB under {} KiB; {} registrations, {} skipped",
        s.peak_pinned_bytes >> 10,
        budget >> 10,
        faults.registered(),
        s.registrations_skipped
    );
}

/// 2 MiB of 64 KiB takes under a 1 MiB budget.
#[test]
fn a_small_demand_past_the_budget_still_grows_within_it() {
    a_burst_past_the_budget_is_met_within_it(64 << 10, 32, MIB_);
}

/// A set grown in steps, its earlier regions wholly free at each growth,
/// folds them into the region it registers: its memory stays in one
/// region, so a buffer larger than any single growth still finds one
/// extent that holds it, and the pinned bytes never hold the old and new
/// regions at once.
#[test]
fn a_growth_folds_the_sets_wholly_free_regions_into_its_region() {
    let (pool, faults) = carving();
    let mut grown = 0;
    for size in [8usize << 20, 16 << 20, 32 << 20] {
        let b = pool.take(size);
        assert!(!b.was_pooled(), "{size} bytes carved before their growth");
        drop(b);
        pool.flush();
        let stats = pool.stats();
        assert_eq!(stats.regions, 1, "a region per growth: {stats:#?}");
        assert!(stats.region_bytes > grown + size / 2, "{stats:#?}");
        grown = stats.region_bytes;
        assert!(
            stats.peak_pinned_bytes <= grown as u64,
            "old and new regions pinned at once: {stats:#?}"
        );
    }
    // 8 + 16 + 32 MiB and their headroom in one region: a buffer longer
    // than the last growth alone carves from it.
    let large = pool.take(48 << 20);
    assert!(large.was_pooled() && large.is_pinned());
    assert!(large.iter().all(|&x| x == 0));
    drop(large);
    pool.shutdown();
    assert_eq!(faults.registered(), faults.unregistered());
}

/// A small reservation under a pinned budget smaller than the smallest
/// region: the regions grown for it stay within the budget (the
/// reservation was admitted against it), and the reserved buffer is
/// pinned.
#[test]
fn a_small_reserve_under_a_budget_pins_within_it() {
    let budget = MIB_;
    let (pool, _faults) = built(|b| b.regions(true).max_pinned_bytes(budget));
    pool.reserve(0, &[(64 << 10, 1)]).unwrap();
    pool.flush();
    let b = pool.take(64 << 10);
    let s = pool.stats();
    let met = b.was_pooled() && b.is_pinned();
    drop(b);
    pool.shutdown();
    assert!(
        met && s.peak_pinned_bytes <= budget as u64,
        "reserved buffer met: {met}; peak pinned {} KiB under a {} KiB budget",
        s.peak_pinned_bytes >> 10,
        budget >> 10
    );
}

/// One region, wholly free, grown for an 8 MiB miss; its length.
fn one_free_region(pool: &Pool) -> usize {
    drop(pool.take(8 * MIB_));
    pool.flush();
    let s = pool.stats();
    assert_eq!(s.regions, 1, "{s:#?}");
    assert_eq!(s.free_extent_bytes, s.region_bytes, "{s:#?}");
    s.region_bytes
}

/// A 64 KiB buffer reserved within the pinned budget, while the regions
/// have a free extent that holds it: the budget is not passed, and the
/// reserved buffer is pooled.
#[test]
fn a_small_reserve_within_the_budget_is_carved_within_it() {
    let (pool, _faults) = built(|b| b.regions(true));
    drop(pool.take(7 * MIB_));
    pool.flush();
    let s = pool.stats();
    let region = s.region_bytes;
    assert!(
        s.regions == 1 && region > 7 * MIB_ && region < 9 * MIB_,
        "{s:#?}"
    );
    let budget = region + MIB_;
    pool.set_max_pinned_bytes(budget);
    pool.reserve(0, &[(64 << 10, 1)]).unwrap();
    pool.flush();
    let s = pool.stats();
    pool.shutdown();
    assert!(
        s.peak_pinned_bytes <= budget as u64 && s.pooled_buffers == 1,
        "peak pinned {} KiB under a {} KiB budget, {} pooled: {s:#?}",
        s.peak_pinned_bytes >> 10,
        budget >> 10,
        s.pooled_buffers
    );
}

/// The registration of a growth that folds the set's one region fails:
/// the memory the set held is registered again on its own, so the take it
/// met before the failed growth is still met after it.
#[test]
fn a_failed_growth_keeps_the_regions_it_folded() {
    let (pool, faults) = carving();
    let before = one_free_region(&pool);
    faults.fail_register(&[2]);
    drop(pool.take(16 * MIB_));
    pool.flush();
    let s = pool.stats();
    let b = pool.take(8 * MIB_);
    let met = b.was_pooled() && b.is_pinned();
    drop(b);
    pool.shutdown();
    assert_eq!(faults.registered(), faults.unregistered());
    assert!(
        met && s.registration_failures == 1,
        "the {} MiB region pooled before the failed growth is gone ({} regions, {} MiB, {} \
         registration failures)",
        before >> 20,
        s.regions,
        s.region_bytes >> 20,
        s.registration_failures
    );
}

/// One small miss, back: the regions grow once for it, and an idle pool
/// registers nothing more.
#[test]
fn an_idle_pool_registers_nothing_after_a_small_miss() {
    let (pool, faults) = carving();
    drop(pool.take(4096));
    pool.flush();
    let after_flush = faults.registered();
    std::thread::sleep(Duration::from_millis(100));
    let s = pool.stats();
    pool.shutdown();
    assert_eq!(
        (after_flush, faults.registered()),
        (1, 1),
        "registrations after the flush, then 100 ms idle: {s:#?}"
    );
}

/// The pinned budget lowered to nothing while a growth waits in its
/// registration: once that registration returns, the region it made,
/// wholly free, is released, and nothing stays pinned.
#[test]
fn a_growth_registered_past_a_budget_lowered_meanwhile_is_released() {
    for _ in 0..3 {
        let (pool, faults) = carving();
        faults.hold_register();
        drop(pool.take(8 * MIB_));
        assert!(eventually(Duration::from_secs(5), || faults
            .register_calls()
            >= 1));
        pool.set_max_pinned_bytes(0);
        faults.release();
        pool.flush();
        let released = eventually(Duration::from_secs(2), || pool.stats().pinned_bytes == 0);
        let s = pool.stats();
        pool.shutdown();
        assert!(
            released,
            "{} KiB pinned under a budget of 0: {s:#?}",
            s.pinned_bytes >> 10
        );
    }
}

/// A 8 MiB class kept hot (a staging loop) holds idle buffers in its
/// stack; the regions' free extents are then used up by 128 KiB takes, and
/// one more 128 KiB take is made. That small take must not give up an idle
/// buffer of the hot 8 MiB class to carve itself from its space: every
/// 8 MiB buffer the class held is still there for the staging loop
/// afterwards.
///
/// The loop and the small takes run on one thread, so that the counts
/// around the last small take are exact. A class taken at less than 1,600
/// a second over the 50 ms or more before a provisioning tick is cold at
/// that tick, and a cold class gives its idle buffers up (to the small
/// take, or back to their region), as it should: an attempt gives a
/// verdict only where the loop took at 2,000 a second or more over every
/// span of 40 to 190 ms that ends in its last 60 ms (a span that ends at
/// the loop's end counted to the last small take's end), so that no tick
/// can have found the class cold, and that held an idle buffer of it. It
/// fails if the small take was served from the pool while no extent was
/// free and the regions did not grow (an idle buffer's space). Up to eight
/// attempts, until three gave a verdict.
#[test]
#[cfg_attr(
    pinpool_asan,
    ignore = "timing-bound: a class is hot at 1,600 takes a second; under AddressSanitizer on 2 \
              cores the set-up's loop took 4 buffers of 8 MiB every 7 ms and the class never \
              kept one"
)]
fn a_small_take_leaves_a_hot_classs_idle_buffers_whole() {
    const LARGE: usize = 8 * MIB_;
    const SMALL: usize = 128 << 10;
    const MS: Duration = Duration::from_millis(1);
    // Whether the loop, which took at `takes` (in order), took at 2,000 a
    // second or more over every span of 40 to 190 ms ending in its last
    // 60 ms, a span ending at its end counted to `done`.
    let steady = |takes: &[Instant], done: Instant| {
        let end = *takes.last().unwrap();
        let from = |t: Instant| takes.partition_point(|&x| x < t);
        (0..=60).all(|back| {
            let y = end - back * MS;
            let to = if back == 0 { done } else { y };
            (40..=190).all(|len| {
                let Some(x) = y.checked_sub(len * MS) else {
                    return false;
                };
                let n = (from(y + MS) - from(x)) as u128;
                n * 1_000_000 >= 2_000 * (to - x).as_micros()
            })
        })
    };
    let (mut failures, mut verdicts, mut no_verdict) = (Vec::new(), 0, Vec::new());
    for attempt in 0..8 {
        if verdicts == 3 {
            break;
        }
        let (pool, _faults) = carving();
        // Warm up: the class hot, its buffers kept idle in it.
        let kept = eventually(Duration::from_secs(10), || {
            for _ in 0..20 {
                let held: Vec<_> = (0..4).map(|_| pool.take(LARGE)).collect();
                drop(held);
            }
            pool.flush();
            pooled_of(&pool, LARGE) >= 3
        });
        if !kept {
            // The set-up's takes came slower than a hot class's on a
            // loaded machine.
            no_verdict.push(format!(
                "attempt {attempt}: the class kept nothing in 10 s of set-up"
            ));
            pool.shutdown();
            continue;
        }
        // The loop, with the free extents used up by small buffers between
        // its takes (the regions may grow meanwhile: again until none is
        // left), then 200 ms of the loop alone.
        let (mut takes, mut small) = (Vec::new(), Vec::new());
        let mut used_up = None;
        let start = Instant::now();
        while used_up.is_none_or(|at: Instant| at.elapsed() < 200 * MS)
            && start.elapsed() < Duration::from_secs(2)
        {
            drop(pool.take(LARGE));
            takes.push(Instant::now());
            // (Statistics cost more than a take: not read once used up.)
            let free = match used_up {
                None => pool.stats().free_extent_bytes,
                Some(_) => 0,
            };
            if free >= SMALL {
                small.extend((0..(free / SMALL).min(8)).map(|_| pool.take(SMALL)));
                used_up = None;
            } else if used_up.is_none() {
                used_up = Some(Instant::now());
            }
        }
        let s1 = pool.stats();
        let idle = pooled_of(&pool, LARGE);
        small.push(pool.take(SMALL));
        let s2 = pool.stats();
        let idle_after = pooled_of(&pool, LARGE);
        let done = Instant::now();
        // The staging loop's demand again: as many as the class held idle.
        let again: Vec<_> = (0..idle).map(|_| pool.take(LARGE)).collect();
        let missed = again.iter().filter(|b| !b.was_pooled()).count();
        let pause = done - *takes.last().unwrap();
        // Served from the pool with no free extent and no growth: from the
        // space of an idle buffer given up. (Buffers the cleaner brings
        // back meanwhile could make up for one lost in the counts.)
        let carved_from_idle =
            small.last().unwrap().was_pooled() && s2.region_bytes == s1.region_bytes;
        if !steady(&takes, done) || s1.free_extent_bytes >= SMALL || idle == 0 {
            no_verdict.push(format!(
                "attempt {attempt}: the loop took {} times in {:?}, slower than 2,000 a second \
                 over some span near its end ({pause:?} to the small take's end), or {} KiB \
                 free before the small take, or {idle} idle",
                takes.len(),
                *takes.last().unwrap() - takes[0],
                s1.free_extent_bytes >> 10
            ));
        } else {
            verdicts += 1;
            if missed > 0 || idle_after < idle || carved_from_idle {
                failures.push(format!(
                    "attempt {attempt}: the 8 MiB class held {idle} idle, {idle_after} after one \
                     more 128 KiB take (served from the pool with no free extent nor growth: \
                     {carved_from_idle}); {missed} of {idle} 8 MiB takes then missed. Before the \
                     small take: free {} KiB, largest free {} KiB; after it: free {} KiB, \
                     largest free {} KiB",
                    s1.free_extent_bytes >> 10,
                    s1.largest_free_extent >> 10,
                    s2.free_extent_bytes >> 10,
                    s2.largest_free_extent >> 10,
                ));
            }
        }
        drop(again);
        drop(small);
        pool.shutdown();
    }
    assert!(failures.is_empty(), "{failures:#?}");
    if verdicts == 0 {
        eprintln!("no verdict: the loop was too slow around every small take: {no_verdict:#?}");
    }
}

/// As `regions::growing_ahead_does_not_fight_the_caps_release`, with one
/// 4 KiB miss held for the whole test (a buffer taken before any region
/// existed, kept for the program's life). The regions are not short of
/// anything the 4 KiB miss needs, and the demand is steady: the regions
/// must settle under the cap, not grow ahead and be released by the cap
/// again and again (a miss out lets a growth pass the cap's room only for
/// what the regions need).
#[test]
fn a_small_miss_held_does_not_make_growth_ahead_fight_the_cap() {
    let (pool, faults) = carving();
    let small_miss = pool.take(4096);
    assert!(!small_miss.was_pooled());
    drop(pool.take(32 * MIB_));
    pool.flush();
    assert!(
        eventually(Duration::from_secs(10), || pool.stats().regions > 0),
        "{:#?}",
        pool.stats()
    );
    std::thread::sleep(Duration::from_millis(100));
    let grown = pool.stats().region_bytes;
    // Hold 1 MiB buffers until the demand and its eighth pass what the
    // regions hold (all carved: nothing missing).
    let mut held = vec![pool.take(32 * MIB_)];
    while (held.len() - 1 + 32) * MIB_ * 9 / 8 <= grown {
        held.push(pool.take(MIB_));
    }
    assert!(
        held.iter().all(|b| b.was_pooled()),
        "set-up: a take missed: {:#?}",
        pool.stats()
    );
    // No room under the cap for anything grown ahead.
    let s = pool.stats();
    pool.set_max_pooled_bytes(s.pooled_bytes.max(s.free_extent_bytes));
    std::thread::sleep(Duration::from_millis(300));
    let (before, s0) = (faults.registered(), pool.stats());
    std::thread::sleep(Duration::from_millis(1000));
    let (after, s1) = (faults.registered(), pool.stats());
    let result = (
        after - before,
        s1.regions_released - s0.regions_released,
        s1.max_pooled_bytes,
    );
    drop(held);
    drop(small_miss);
    pool.shutdown();
    assert!(
        result.0 <= 1,
        "{} registrations and {} regions released in 1 s with nothing taken or dropped (cap {} \
         KiB, regions grown to {} KiB before): growth ahead and the cap's release fight: {s1:#?}",
        result.0,
        result.1,
        result.2 >> 10,
        grown >> 10
    );
}

/// A 64 MiB miss held and a 64 KiB miss, on fresh pools built with
/// `settings`; `before` runs before the small miss comes back. The small
/// miss back grows the regions first; then the large one comes back; after
/// a flush, a 64 MiB take must be met. The failures, five attempts.
fn a_small_misses_growth_then_a_large_take(
    settings: impl Fn(pinpool::PoolBuilder) -> pinpool::PoolBuilder,
    before: impl Fn(&Faults),
) -> Vec<String> {
    let mut failures = Vec::new();
    for attempt in 0..5 {
        let (pool, faults) = built(&settings);
        let large = pool.take(64 * MIB_);
        let small = pool.take(64 << 10);
        assert!(!large.was_pooled() && !small.was_pooled());
        before(&faults);
        drop(small);
        pool.flush();
        let s0 = pool.stats();
        drop(large);
        pool.flush();
        let again = pool.take(64 * MIB_);
        let s1 = pool.stats();
        if !again.was_pooled() {
            failures.push(format!(
                "attempt {attempt}: the 64 MiB take missed after a flush; after the small miss's \
                 growth: {} regions, {} KiB, {} failed registrations; at the end: {} regions, \
                 {} KiB, largest free {} KiB, peak pinned {} KiB, {} registrations, {} skipped",
                s0.regions,
                s0.region_bytes >> 10,
                s0.registration_failures,
                s1.regions,
                s1.region_bytes >> 10,
                s1.largest_free_extent >> 10,
                s1.peak_pinned_bytes >> 10,
                faults.registered(),
                s1.registrations_skipped,
            ));
        }
        drop(again);
        pool.shutdown();
    }
    failures
}

/// Under a 70 MiB pinned budget (room for 64 MiB and the small one, not
/// for 64 MiB and its eighth): the small miss's growth keeps what the
/// large one needs when the budget refuses what it wants.
#[test]
fn a_small_misses_growth_under_a_budget_keeps_a_large_misss_extent() {
    let failures = a_small_misses_growth_then_a_large_take(
        |b| b.regions(true).max_pinned_bytes(70 * MIB_),
        |_| {},
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Without a budget, the small miss's growth failing its first
/// registration: the retry (half as large, or the small buffer) must still
/// leave room for the 64 MiB miss still out.
#[test]
fn a_small_misses_retried_growth_keeps_a_large_misss_extent() {
    let failures = a_small_misses_growth_then_a_large_take(
        |b| b.regions(true),
        |faults| faults.fail_register(&[faults.register_calls() + 1]),
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Two devices whose regions grow at once, each growth within the budget
/// alone: together they must stay within it too (the budget bounds every
/// pinned byte; registrations under way are admitted against it together).
#[test]
fn two_devices_growing_at_once_stay_within_the_budget() {
    let budget = 12 * MIB_;
    let (pool, faults) = built(|b| b.regions(true).devices(2).max_pinned_bytes(budget));
    faults.hold_register();
    drop(pool.take_on(0, 8 * MIB_).unwrap());
    assert!(eventually(Duration::from_secs(5), || faults
        .register_calls()
        >= 1));
    drop(pool.take_on(1, 8 * MIB_).unwrap());
    // Refused by the budget (the fix): the second call never comes.
    let both = eventually(Duration::from_millis(300), || faults.register_calls() >= 2);
    faults.release();
    pool.flush();
    let s = pool.stats();
    pool.shutdown();
    let calls = format!(
        "{} registration calls at once: {both}",
        faults.register_calls()
    );
    assert_within_budget(&s, budget, &calls);
}

/// Two `reserve` calls back to back, each within a 12 MiB budget alone:
/// together they must not pin past it (the second is an error, or the
/// bytes stay within it). Regions off and on.
#[test]
fn two_reserves_back_to_back_stay_within_the_budget() {
    let mut failures = Vec::new();
    for regions in [false, true] {
        let budget = 12 * MIB_;
        let (pool, _f) = built(|b| b.regions(regions).max_pinned_bytes(budget));
        let first = pool.reserve(0, &[(8 * MIB_, 1)]);
        let second = pool.reserve(0, &[(8 * MIB_, 1)]);
        pool.flush();
        let s = pool.stats();
        pool.shutdown();
        if s.peak_pinned_bytes > budget as u64 {
            failures.push(format!(
                "regions {regions}: reserve 8 MiB: {first:?}, again: {second:?}; peak pinned {} KiB \
                 under a {} KiB budget",
                s.peak_pinned_bytes >> 10,
                budget >> 10
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A 64 MiB miss held past a provisioning tick under a 70 MiB budget (room
/// for 64 MiB, not for 64 MiB and its eighth): the tick's growth, refused
/// at 72 MiB, must not swallow the shortfall; once the miss is back and
/// flushed, a 64 MiB take is met.
#[test]
fn a_tick_growth_refused_by_the_budget_still_meets_the_held_miss() {
    let mut failures = Vec::new();
    for attempt in 0..3 {
        let (pool, faults) = built(|b| b.regions(true).max_pinned_bytes(70 * MIB_));
        let large = pool.take(64 * MIB_);
        assert!(!large.was_pooled());
        std::thread::sleep(Duration::from_millis(200));
        let s0 = pool.stats();
        drop(large);
        pool.flush();
        let again = pool.take(64 * MIB_);
        let s1 = pool.stats();
        if !again.was_pooled() {
            failures.push(format!(
                "attempt {attempt}: the 64 MiB take missed after a flush; while held: {} skipped, \
                 {} regions; at the end: {} regions, {} KiB, {} registrations, {} skipped",
                s0.registrations_skipped,
                s0.regions,
                s1.regions,
                s1.region_bytes >> 10,
                faults.registered(),
                s1.registrations_skipped,
            ));
        }
        // A staging loop that holds its 64 MiB buffer past a tick each time:
        // how many of its next rounds miss too (each starting once the
        // last buffer is back: the budget has no room for two).
        drop(again);
        pool.flush();
        let mut rounds_missed = 0;
        for _ in 0..4 {
            let b = pool.take(64 * MIB_);
            rounds_missed += usize::from(!b.was_pooled());
            std::thread::sleep(Duration::from_millis(100));
            drop(b);
            pool.flush();
        }
        if rounds_missed > 0 {
            failures.push(format!(
                "attempt {attempt}: {rounds_missed} of 4 later held rounds missed"
            ));
        }
        pool.shutdown();
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// What a `reserve` admitted against the pinned budget is taken over by
/// its registration, or given back when its memory comes from regions
/// pinned already: after each reserve has registered, another fits in
/// whatever the budget has left (an admission held for good would shrink
/// the budget by every reserve's bytes). Regions off and on.
#[test]
fn reserve_admissions_are_settled_once_registered() {
    let mut failures = Vec::new();
    for regions in [false, true] {
        let budget = 20 * MIB_;
        let (pool, _f) = built(|b| b.regions(regions).max_pinned_bytes(budget));
        if regions {
            // Regions pinned ahead of the reserves, with room to carve.
            drop(pool.take(8 * MIB_));
            pool.flush();
        }
        for round in 0..8 {
            let pinned = pool.stats().pinned_bytes;
            let room = budget as u64 - pinned;
            let ask = (2 * MIB_) as u64;
            let out = pool.reserve(0, &[(2 * MIB_, 1)]);
            pool.flush();
            if room >= ask + MIB_ as u64 && out.is_err() {
                failures.push(format!(
                    "regions {regions}, round {round}: {} KiB pinned of a {} KiB budget, a 2 MiB \
                     reserve refused: {out:?}",
                    pinned >> 10,
                    budget >> 10
                ));
            }
        }
        let s = pool.stats();
        pool.shutdown();
        if s.peak_pinned_bytes > budget as u64 {
            failures.push(format!(
                "regions {regions}: peak pinned {} KiB under a {} KiB budget",
                s.peak_pinned_bytes >> 10,
                budget >> 10
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A gate on one tracing event: the thread that emits an event whose
/// message contains `needle` signals `hit` and waits until `open`.
struct Gate {
    needle: &'static str,
    state: Arc<(std::sync::Mutex<(bool, bool)>, std::sync::Condvar)>,
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Gate {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Find(&'static str, bool);
        impl tracing::field::Visit for Find {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" && format!("{v:?}").contains(self.0) {
                    self.1 = true;
                }
            }
        }
        let mut find = Find(self.needle, false);
        event.record(&mut find);
        if !find.1 {
            return;
        }
        let (lock, cv) = &*self.state;
        let mut st = lock.lock().unwrap();
        if st.0 {
            return; // only the first
        }
        st.0 = true;
        cv.notify_all();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !st.1 && Instant::now() < deadline {
            st = cv.wait_timeout(st, Duration::from_millis(10)).unwrap().0;
        }
    }
}

/// A reserve's region registration fails and is retried smaller. The first
/// attempt took the reserve's share over and the failure settled it; the
/// retry must be admitted within the budget: a registration admitted in
/// between (a miss on the other device) may take the room the share held
/// (a retry admitted past the budget pinned 5 MiB under 4 MiB). The
/// window is held open with a tracing layer on the worker's "registering
/// a region failed" warning, in a child process (the layer is global).
#[test]
fn reserve_retried_smaller_after_a_failed_registration_stays_within_the_budget() {
    const TEST: &str =
        "reserve_retried_smaller_after_a_failed_registration_stays_within_the_budget";
    if crate::common::in_child(module_path!(), TEST, &[]).is_some() {
        return;
    }
    use tracing_subscriber::layer::SubscriberExt;
    let state = Arc::new((
        std::sync::Mutex::new((false, false)),
        std::sync::Condvar::new(),
    ));
    let gate = Gate {
        needle: "registering a region failed",
        state: state.clone(),
    };
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(gate)).unwrap();
    let budget = 4 * MIB_;
    let (pool, faults) = built(|b| b.devices(2).regions(true).max_pinned_bytes(budget));
    faults.fail_register(&[1]);
    // Admitted 1 MiB; its region (2 MiB, REGION_MIN) fails to register.
    pool.reserve(0, &[(MIB_, 1)]).unwrap();
    let (lock, cv) = &*state;
    {
        let mut st = lock.lock().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !st.0 && Instant::now() < deadline {
            st = cv.wait_timeout(st, Duration::from_millis(10)).unwrap().0;
        }
        assert!(st.0, "the reserve's registration did not fail");
    }
    // The window: the reserve's share is settled, its retry not yet claimed.
    let miss = pool.take_on(1, 3 * MIB_).unwrap();
    drop(miss);
    let grown = eventually(Duration::from_secs(5), || {
        pool.stats().pinned_bytes >= 4 * MIB_ as u64
    });
    {
        let mut st = lock.lock().unwrap();
        st.1 = true;
        cv.notify_all();
    }
    pool.flush();
    let s = pool.stats();
    eprintln!(
        "grown on device 1 in the window: {grown}; pinned {} KiB, peak {} KiB, registrations {}, failures {}",
        s.pinned_bytes >> 10,
        s.peak_pinned_bytes >> 10,
        s.registrations,
        s.registration_failures
    );
    assert_within_budget(&s, budget, "");
}

/// One `reserve` of five 1 KiB buffers (two slabs: 4 + 1) under a 6 KiB
/// budget with nothing pinned: admitted at 5 KiB (the buffers'
/// footprints), it registered two whole pages, 8 KiB: the admission must
/// count the slabs it will register, as the budget bounds every pinned
/// byte.
#[test]
fn slab_reserve_is_admitted_at_what_it_pins() {
    let mut failures = Vec::new();
    for regions in [false, true] {
        let budget = 6 << 10;
        let (pool, _faults) = built(|b| b.regions(regions).max_pinned_bytes(budget));
        let out = pool.reserve(0, &[(1024, 5)]);
        pool.flush();
        let s = pool.stats();
        if s.peak_pinned_bytes > budget as u64 {
            failures.push(format!(
                "regions {regions}: reserve(1 KiB x 5) -> {out:?}; peak pinned {} bytes under a {budget} byte budget",
                s.peak_pinned_bytes
            ));
        }
        pool.shutdown();
    }
    // Regions: a 2.25 MiB buffer's region is rounded to whole huge pages
    // (4 MiB) under a 3 MiB budget.
    let budget = 3 * MIB_;
    let (pool, _faults) = built(|b| b.regions(true).max_pinned_bytes(budget));
    let out = pool.reserve(0, &[(9 * MIB_ / 4, 1)]);
    pool.flush();
    let s = pool.stats();
    if s.peak_pinned_bytes > budget as u64 {
        failures.push(format!(
            "regions true: reserve(2.25 MiB) -> {out:?}; peak pinned {} KiB under a {} KiB budget",
            s.peak_pinned_bytes >> 10,
            budget >> 10
        ));
    }
    pool.shutdown();
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The error of a reserve refused because an earlier reserve, not yet
/// registered, holds the room: its figures (`pinned`, `budget`) must
/// explain the refusal (`bytes + pinned > budget`; they said 0 of 12 MiB
/// pinned for an 8 MiB reserve).
#[test]
fn a_refused_reserve_says_why() {
    let budget = 12 * MIB_;
    let (pool, faults) = built(|b| b.max_pinned_bytes(budget));
    faults.hold_register();
    pool.reserve(0, &[(8 * MIB_, 1)]).unwrap();
    let second = pool.reserve(0, &[(8 * MIB_, 1)]);
    faults.release();
    pool.flush();
    let err = second.expect_err("the budget has no room for both");
    eprintln!("{err:?}: {err}");
    match err {
        pinpool::Error::ReservePastPinnedBudget {
            bytes,
            pinned,
            budget,
        } => assert!(
            bytes as u64 + pinned > budget,
            "the error's figures do not explain the refusal: {err}"
        ),
        other => panic!("{other:?}"),
    }
}

/// After a flush, everything the budget has left (`budget` minus what is
/// pinned) must be admitted to one more `reserve`: a share never settled
/// (claimed for good) makes it fail. Returns an error message if not.
fn probe_room(pool: &Pool, budget: usize, what: &str) -> Result<(), String> {
    pool.flush();
    let s = pool.stats();
    if s.worker_panics > 0 {
        return Err(format!(
            "{what}: {} worker panics (a debug assertion?)",
            s.worker_panics
        ));
    }
    let pinned = s.pinned_bytes as usize;
    if pinned > budget {
        return Err(format!(
            "{what}: {pinned} bytes pinned under a {budget} byte budget"
        ));
    }
    let room = budget - pinned;
    let mut ask = Vec::new();
    if room / MIB_ > 0 {
        ask.push((MIB_, room / MIB_));
    }
    if room % MIB_ / 4096 > 0 {
        ask.push((4096, room % MIB_ / 4096));
    }
    if room % 4096 / 256 > 0 {
        ask.push((256, room % 4096 / 256));
    }
    if ask.is_empty() {
        return Ok(());
    }
    match pool.reserve(0, &ask) {
        Ok(()) => Ok(()),
        Err(e) => Err(format!(
            "{what}: {pinned} of {budget} bytes pinned, a reserve of the {room} bytes left \
             ({ask:?}) refused: {e}"
        )),
    }
}

/// Runs `case` on a fresh pool of the fault backend with a pinned budget
/// of `budget` (and what `settings` adds), regions off and on, once for
/// each of `variants`; then, each time, `probe_room`: the admissions
/// `case`'s reserves made must all be settled. `case` returns what it saw,
/// for the failure's message.
fn reserves_settle<V: std::fmt::Debug + Copy>(
    budget: usize,
    variants: &[V],
    settings: impl Fn(pinpool::PoolBuilder) -> pinpool::PoolBuilder,
    case: impl Fn(&Arc<Pool>, &Faults, V) -> String,
) {
    let mut failures = Vec::new();
    for regions in [false, true] {
        for &variant in variants {
            let (pool, faults) = built(|b| settings(b.regions(regions).max_pinned_bytes(budget)));
            let pool = Arc::new(pool);
            let saw = case(&pool, &faults, variant);
            let what = format!("regions {regions}, {variant:?}: {saw}");
            if let Err(e) = probe_room(&pool, budget, &what) {
                failures.push(e);
            }
            pool.shutdown();
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A reserve whose registration fails (regions off and on): the share is
/// given back (the budget is whole again).
#[test]
fn reserve_whose_registration_fails_gives_its_share_back() {
    reserves_settle(
        16 * MIB_,
        &[MIB_, 2 * MIB_, 3 * MIB_],
        |b| b,
        |pool, faults, size| {
            faults.fail_register(&[1, 2, 3, 4]);
            format!("{:?}", pool.reserve(0, &[(size, 1)]))
        },
    );
}

/// A reserve whose registration panics (regions off and on).
#[test]
fn reserve_whose_registration_panics_gives_its_share_back() {
    let mut failures = Vec::new();
    for regions in [false, true] {
        let budget = 16 * MIB_;
        let (pool, faults) = built(|b| b.regions(regions).max_pinned_bytes(budget));
        faults.panic_register(&[1]);
        let out = pool.reserve(0, &[(2 * MIB_, 1)]);
        pool.flush();
        // The ticket closes as the job unwinds, before the worker counts
        // the panic: wait for the count.
        eventually(Duration::from_secs(2), || pool.stats().worker_panics == 1);
        let panics = pool.stats().worker_panics;
        if panics != 1 {
            failures.push(format!(
                "regions {regions}: {panics} worker panics (1 injected)"
            ));
        }
        // The probe's own check of panics would trip on the injected one.
        let s = pool.stats();
        let room = budget - s.pinned_bytes as usize;
        if let Err(e) = pool.reserve(0, &[(MIB_, room / MIB_)]) {
            failures.push(format!(
                "regions {regions}: {out:?}; {room} bytes left refused: {e}"
            ));
        }
        pool.shutdown();
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Sub-page classes: a slab's head carries the share of its buffers, its
/// registration is the whole slab; with its registration failing too.
#[test]
fn slab_reserve_settles() {
    reserves_settle(
        8 * MIB_,
        &[false, true],
        |b| b,
        |pool, faults, fail| {
            if fail {
                faults.fail_register(&[1]);
            }
            format!(
                "{:?}",
                pool.reserve(0, &[(256, 3), (1024, 9), (64 << 10, 2)])
            )
        },
    );
}

/// A reserve on the second device (regions off and on).
#[test]
fn reserve_on_another_device_settles() {
    reserves_settle(
        16 * MIB_,
        &[()],
        |b| b.devices(2),
        |pool, _, ()| {
            let a = pool.reserve(1, &[(3 * MIB_, 1), (MIB_, 2)]);
            let b = pool.reserve(0, &[(2 * MIB_, 1)]);
            format!("{a:?} {b:?}")
        },
    );
}

/// Reserves queued behind a held registration while the pool is cleared
/// (`false`), and while it shuts down (`true`).
#[test]
fn reserves_queued_through_clear_and_shutdown_settle() {
    reserves_settle(
        16 * MIB_,
        &[false, true],
        |b| b,
        |pool, faults, shut| {
            faults.hold_register();
            pool.reserve(0, &[(2 * MIB_, 1)]).unwrap();
            pool.reserve(0, &[(MIB_, 3)]).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            let other = {
                let pool = pool.clone();
                std::thread::spawn(move || if shut { pool.shutdown() } else { pool.clear() })
            };
            std::thread::sleep(Duration::from_millis(20));
            faults.release();
            other.join().unwrap();
            String::new()
        },
    );
}

/// The budget lowered while a reserve waits for its registration, then
/// raised again.
#[test]
fn reserve_through_a_lowered_budget_settles() {
    reserves_settle(
        16 * MIB_,
        &[()],
        |b| b,
        |pool, faults, ()| {
            faults.hold_register();
            pool.reserve(0, &[(4 * MIB_, 1)]).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            pool.set_max_pinned_bytes(MIB_);
            faults.release();
            pool.flush();
            pool.set_max_pinned_bytes(16 * MIB_);
            String::new()
        },
    );
}

/// Free extents count as pooled bytes in the total and in each device's
/// figure alike.
#[test]
fn each_devices_pooled_bytes_count_its_free_extents() {
    let (pool, _faults) = built(|b| b.regions(true).devices(2));
    for device in 0..2 {
        drop(pool.take_on(device, 1 << 20).unwrap());
        let held = pool.take_on(device, 3 << 20).unwrap();
        drop(held);
    }
    pool.flush();
    let stats = pool.stats();
    assert!(stats.free_extent_bytes > 0, "{stats:#?}");
    let by_device: usize = stats.per_device.iter().map(|d| d.pooled_bytes).sum();
    assert_eq!(by_device, stats.pooled_bytes, "{stats:#?}");
}

/// Once the pool is quiet, idle buffers and free extents together fit the
/// cap, even where an idle buffer of a class in steady use keeps its region
/// partly carved.
#[test]
fn a_quiet_pool_fits_the_cap_with_a_hot_class_in_a_region() {
    let (pool, _faults) = built(|b| b.regions(true));
    // A staging loop: the class is hot, its clean buffers go back to it.
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        let buf = pool.take(64 << 10);
        drop(buf);
    }
    pool.flush();
    pool.set_max_pooled_bytes(256 << 10);
    std::thread::sleep(Duration::from_millis(300));
    pool.flush();
    let stats = pool.stats();
    assert!(stats.pooled_bytes <= 256 << 10, "{stats:#?}");
}

/// Steps that each hold more than a given cap, a pause between them longer
/// than the 100 ms after which wholly free regions past the cap go: the
/// regions keep what the cap allows, so that the takes of each step hit
/// up to it, rather than growing one region for the whole step that the
/// cap then releases whole (no take ever hitting, a registration of the
/// whole step every step).
#[test]
fn steps_past_a_given_cap_keep_what_it_allows() {
    const MIB: usize = 1 << 20;
    let (pool, faults) = carving();
    pool.set_max_pooled_bytes(4 * MIB);
    let mut hits = Vec::new();
    for _ in 0..5 {
        let held: Vec<_> = (0..8).map(|_| pool.take(MIB)).collect();
        hits.push(held.iter().filter(|b| b.was_pooled()).count());
        drop(held);
        pool.flush();
        std::thread::sleep(Duration::from_millis(250));
    }
    steps_kept_what_the_cap_allows(pool, &faults, &hits, 4 * MIB);
}

/// Asserts that every step after the first hit 3 times or more (`hits`,
/// per step) and that `pool` pools at most `cap` bytes, quiet; then shuts
/// it down.
fn steps_kept_what_the_cap_allows(pool: Pool, faults: &Faults, hits: &[usize], cap: usize) {
    let s = pool.stats();
    assert!(
        hits[1..].iter().all(|&h| h >= 3),
        "hits per step: {hits:?} ({} registrations): {s:#?}",
        faults.registered()
    );
    assert!(
        s.pooled_bytes <= cap,
        "{} bytes pooled past the cap, quiet: {s:#?}",
        s.pooled_bytes
    );
    pool.shutdown();
}

/// A buffer larger than what a given cap leaves the regions room for: the
/// growth for it is not cut at the cap (a region that cannot hold it would
/// be pinned for nothing, and the buffer would miss again), so it is
/// carved from the second take on, with one registration; and under a
/// pinned budget too tight for both, likewise.
#[test]
fn a_buffer_past_a_given_caps_room_gets_a_region_that_holds_it() {
    const MIB: usize = 1 << 20;
    for budget in [None, Some(7 * MIB)] {
        let (pool, faults) = built(|b| {
            let b = b.regions(true).max_pooled_bytes(5 * MIB);
            match budget {
                Some(bytes) => b.max_pinned_bytes(bytes),
                None => b,
            }
        });
        let mut pooled = Vec::new();
        for _ in 0..8 {
            let b = pool.take(5 * MIB);
            pooled.push(b.was_pooled());
            std::thread::sleep(Duration::from_millis(20));
            drop(b);
            pool.flush();
        }
        let s = pool.stats();
        assert!(
            pooled[1..].iter().all(|&p| p) && faults.registered() == 1,
            "budget {budget:?}: takes of 5 MiB pooled {pooled:?}, {} registrations: {s:#?}",
            faults.registered()
        );
        pool.shutdown();
    }
}

/// As `steps_past_a_given_cap_keep_what_it_allows`, on two devices that
/// share the cap: the regions released for the excess are chosen among
/// both devices' together, so the region within the cap stays, on
/// whichever device it grew.
#[test]
fn steps_on_two_devices_past_a_given_cap_keep_what_it_allows() {
    const MIB: usize = 1 << 20;
    let (pool, faults) = built(|b| b.regions(true).devices(2).max_pooled_bytes(4 * MIB));
    let mut hits = Vec::new();
    for _ in 0..5 {
        let on =
            |device| -> Vec<_> { (0..8).map(|_| pool.take_on(device, MIB).unwrap()).collect() };
        let (first, second) = (on(0), on(1));
        let pooled = |v: &Vec<pinpool::PinnedBuffer>| v.iter().filter(|b| b.was_pooled()).count();
        hits.push(pooled(&first) + pooled(&second));
        drop(first);
        pool.flush();
        drop(second);
        pool.flush();
        std::thread::sleep(Duration::from_millis(250));
    }
    steps_kept_what_the_cap_allows(pool, &faults, &hits, 4 * MIB);
}
