//! Merges: a buffer larger than any free extent, while the regions hold
//! the bytes the demand needs, gets one extent made of wholly free regions
//! moved together and registered again as one, adding no bytes; and what
//! happens when a merge moves less than planned, fails to register, or
//! meets a pinned budget with no room for the buffer's own bytes.

use std::sync::Arc;
use std::time::Duration;

use pinpool::testing::Faults;
use pinpool::Pool;

const MIB: usize = 1 << 20;

/// The set-up of `a_buffer_larger_than_any_region_gets_an_extent_made_of_free_regions`:
/// two wholly free regions of 72 MiB, each smaller than 96 MiB, together larger.
fn two_free_regions() -> (Pool, Arc<Faults>) {
    two_free_regions_with(|b| b)
}

/// A pool on the fault backend (it carves from regions and emulates
/// pinning) whose cap follows the working set, with a floor of 1 MiB.
fn following() -> (Pool, Arc<Faults>) {
    following_with(|b| b)
}

fn following_with(
    settings: impl FnOnce(pinpool::PoolBuilder) -> pinpool::PoolBuilder,
) -> (Pool, Arc<Faults>) {
    let faults = Arc::new(Faults::default());
    let pool = settings(
        Pool::builder()
            .faults(faults.clone())
            .cleaner_threads(1)
            .min_pooled_bytes(MIB),
    )
    .build()
    .unwrap();
    (pool, faults)
}

/// As `two_free_regions`, with `settings`. A burst whose misses come
/// back over a loaded box's scheduling may grow its regions in two steps
/// (three regions, the same bytes): such a pool is built again, up to five
/// times.
fn two_free_regions_with(
    settings: impl Fn(pinpool::PoolBuilder) -> pinpool::PoolBuilder,
) -> (Pool, Arc<Faults>) {
    let mut last = None;
    for _ in 0..5 {
        let (pool, faults) = following_with(&settings);
        for n in [16, 16, 32, 32] {
            step(&pool, n, false);
        }
        let s = pool.stats();
        if (s.regions, s.region_bytes) == (2, 144 * MIB) {
            return (pool, faults);
        }
        last = Some(s);
    }
    panic!("no two regions of 72 MiB in five tries: {last:#?}");
}

/// Every registration is of a region listed now, and the pinned bytes are
/// the regions' (no buffer pinned on its own, none leaked).
fn books_balance(s: &pinpool::Stats, faults: &Faults) {
    assert_eq!(
        faults.registered() - faults.unregistered(),
        s.regions as u64,
        "{s:#?}"
    );
    assert_eq!(s.pinned_bytes, s.region_bytes as u64, "{s:#?}");
}

/// Shuts `pool` down: every registration is undone.
fn shut_down_balanced(pool: Pool, faults: &Faults) {
    pool.shutdown();
    assert_eq!(faults.registered(), faults.unregistered());
}

/// One step of a workload: `n` buffers of 4 MiB, and one of 96 MiB if
/// `large`, held at once, then dropped; then a flush, and a pause longer
/// than a wholly free region waits before the cap may release it.
fn step(pool: &Pool, n: usize, large: bool) {
    let mut held: Vec<_> = (0..n).map(|_| pool.take(4 * MIB)).collect();
    if large {
        held.push(pool.take(96 * MIB));
    }
    drop(held);
    pool.flush();
    std::thread::sleep(Duration::from_millis(250));
}

/// A merge whose planned regions both fail to unregister (leaked, so
/// nothing moves, and nothing is registered): no registration failure is
/// counted, as no registration call failed.
#[test]
fn a_merge_that_moves_nothing_counts_no_registration_failure() {
    let (pool, faults) = two_free_regions();
    let next = faults.unregister_calls() + 1;
    faults.fail_unregister(&[next, next + 1]);
    let before = pool.stats();
    let calls_before = (faults.register_calls(), faults.registered());
    drop(pool.take(96 * MIB));
    pool.flush();
    let s = pool.stats();
    let failed_calls =
        (faults.register_calls() - calls_before.0) - (faults.registered() - calls_before.1);
    assert_eq!(
        s.unregister_failures - before.unregister_failures,
        2,
        "{s:#?}"
    );
    assert_eq!(
        s.registration_failures - before.registration_failures,
        failed_calls,
        "registration failures counted vs registration calls that failed: {s:#?}"
    );
}

/// A merge of which one planned region fails to unregister: the other one
/// alone is merged (registered again as it was, 72 MiB, no extent for 96
/// MiB); that is not enough, so the regions grow: after the miss and a
/// flush, the same take hits.
#[test]
fn a_merge_that_moves_too_little_still_meets_the_miss() {
    let (pool, faults) = two_free_regions();
    let next = faults.unregister_calls() + 1;
    faults.fail_unregister(&[next]);
    let miss = pool.take(96 * MIB);
    assert!(!miss.was_pooled());
    drop(miss);
    pool.flush();
    let again = pool.take(96 * MIB);
    let s = pool.stats();
    assert!(
        again.was_pooled(),
        "the same 96 MiB take missed again after a flush; {} registration calls, {} unregister calls: {s:#?}",
        faults.register_calls(),
        faults.unregister_calls(),
    );
}

/// A merge whose registration fails once: the regions it folded are
/// registered again as one 144 MiB region, which holds the buffer, so the
/// regions do not also grow by a region of the buffer's own size.
#[test]
fn a_merge_whose_registration_fails_keeps_the_regions_whole_and_adds_none() {
    let (pool, faults) = two_free_regions();
    let before = pool.stats();
    let next = faults.register_calls() + 1;
    faults.fail_register(&[next]);
    drop(pool.take(96 * MIB));
    pool.flush();
    let s = pool.stats();
    assert!(
        s.region_bytes <= before.region_bytes,
        "regions {} MiB -> {} MiB, {} regions, {} registration calls since: {s:#?}",
        before.region_bytes / MIB,
        s.region_bytes / MIB,
        s.regions,
        faults.register_calls() - next + 1,
    );
}

/// A pinned budget with room left (200 MiB, 144 MiB pinned in two wholly
/// free regions), though not for the buffer's whole footprint (its miss is
/// freed on its way back): the merge adds no bytes, so the provisioning
/// tick still makes it, and the 96 MiB buffer misses once.
#[test]
fn a_merge_needs_no_room_in_the_budget() {
    let budget = 200 * MIB;
    let (pool, faults) = two_free_regions_with(|b| b.max_pinned_bytes(budget));
    let before = pool.stats();
    for _ in 0..4 {
        drop(pool.take(96 * MIB));
        pool.flush();
        std::thread::sleep(Duration::from_millis(250));
    }
    let s = pool.stats();
    assert!(s.peak_pinned_bytes <= budget as u64, "{s:#?}");
    books_balance(&s, &faults);
    assert_eq!(
        s.misses - before.misses,
        1,
        "misses of four 96 MiB takes; regions {} MiB, {} released, {} registrations skipped: {s:#?}",
        s.region_bytes / MIB,
        s.regions_released,
        s.registrations_skipped,
    );
}

/// A given cap: a young wholly free region past it goes at the next tick
/// (no age hold).
#[test]
fn a_given_cap_releases_a_young_region() {
    let faults = Arc::new(Faults::default());
    let pool = Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(1)
        .max_pooled_bytes(8 * MIB)
        .build()
        .unwrap();
    let held: Vec<_> = (0..16).map(|_| pool.take(4 * MIB)).collect();
    drop(held);
    pool.flush();
    let held: Vec<_> = (0..16).map(|_| pool.take(4 * MIB)).collect();
    drop(held);
    pool.flush();
    std::thread::sleep(Duration::from_millis(400));
    let s = pool.stats();
    assert!(s.pooled_bytes <= 8 * MIB, "{s:#?}");
}

/// A merge whose registration fails `fails` times: once, the folded
/// regions are registered again as one 144 MiB region, which holds the
/// buffer; twice, they are freed too, and a growth meets it. Either way the
/// same take hits after a flush, the books balance, and each failed call
/// is counted.
fn a_failed_merge_is_met(fails: u64) {
    let (pool, faults) = two_free_regions();
    let next = faults.register_calls() + 1;
    faults.fail_register(&(next..next + fails).collect::<Vec<_>>());
    drop(pool.take(96 * MIB));
    pool.flush();
    let again = pool.take(96 * MIB);
    let s = pool.stats();
    assert!(again.was_pooled(), "{s:#?}");
    books_balance(&s, &faults);
    assert_eq!(s.registration_failures, fails, "{s:#?}");
    drop(again);
    shut_down_balanced(pool, &faults);
}

#[test]
fn a_kept_merge_is_listed_registered_and_hit() {
    a_failed_merge_is_met(1);
}

#[test]
fn a_merge_failing_twice_balances_its_books() {
    a_failed_merge_is_met(2);
}

/// Merges racing takes that carve from the regions planned: every buffer
/// handed out zeroed, the books balanced at the end.
#[test]
fn merges_racing_carves_keep_the_books() {
    let (pool, faults) = two_free_regions();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut k = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                k += 1;
                let size = (1 + k % 13) * 256 * 1024;
                let mut b = pool.take(size);
                if b.was_pooled() {
                    assert!(b.iter().all(|&x| x == 0), "a hit not zeroed");
                }
                b.fill(7);
                drop(b);
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        for i in 0..12 {
            let mut b = pool.take(96 * MIB + (i % 3) * 8 * MIB);
            if b.was_pooled() {
                assert!(b.iter().all(|&x| x == 0), "a large hit not zeroed");
            }
            b.fill(9);
            drop(b);
            pool.flush();
            std::thread::sleep(Duration::from_millis(30));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    pool.flush();
    let s = pool.stats();
    books_balance(&s, &faults);
    assert_eq!(s.registration_failures, 0, "{s:#?}");
    shut_down_balanced(pool, &faults);
}

/// A cap that leaves room for all but a few MiB of two wholly free
/// regions releases the one that covers the excess with the fewest bytes,
/// not whichever was listed first: the large region, which holds the
/// largest buffers, stays.
#[test]
fn the_cap_releases_the_smallest_region_that_covers_its_excess() {
    // A large region, then a second, smaller one grown for a little more
    // (built again, up to five times, where a loaded box's scheduling
    // split a growth in two).
    let (pool, large, s) = (0..5)
        .find_map(|_| {
            let pool = Pool::builder()
                .faults(Arc::new(Faults::default()))
                .cleaner_threads(1)
                .max_pooled_bytes(1 << 30)
                .build()
                .unwrap();
            step(&pool, 40, false);
            step(&pool, 40, false);
            let large = pool.stats();
            step(&pool, 48, false);
            step(&pool, 48, false);
            let s = pool.stats();
            (large.regions == 1 && s.regions == 2).then_some((pool, large.region_bytes, s))
        })
        .expect("a large region and a smaller one in five tries");
    let small = s.region_bytes - large;
    assert!(small < large, "{s:#?}");
    pool.set_max_pooled_bytes(s.region_bytes - 4 * MIB);
    let after = pool.stats();
    assert_eq!(
        after.region_bytes,
        large,
        "regions of {} and {} MiB, the cap 4 MiB short of both: {after:#?}",
        large / MIB,
        small / MIB
    );
}

/// A buffer larger than any region, in a workload whose regions hold
/// enough bytes for it: the regions make one extent for it out of wholly
/// free regions, moved together, adding no bytes, so that nothing is past
/// the cap that follows the working set once it is dropped: it misses once,
/// and neither it nor the steps between its takes miss again; the
/// regions hold no more than before.
#[test]
fn a_buffer_larger_than_any_region_gets_an_extent_made_of_free_regions() {
    let (pool, _faults) = following();
    let step = |n: usize, large: bool| step(&pool, n, large);
    // Two regions (each grown for a step of its own), each smaller than
    // the large buffer, and together larger.
    for n in [16, 16, 32, 32] {
        step(n, false);
    }
    let before = pool.stats();
    assert!(before.region_bytes >= 128 * MIB, "{before:#?}");
    for _ in 0..4 {
        step(0, true);
        step(32, false);
    }
    let stats = pool.stats();
    assert_eq!(
        stats.misses,
        before.misses + 1,
        "misses after the first take of the large buffer; regions {} MiB, then {} MiB, {} released: {stats:#?}",
        before.region_bytes / MIB,
        stats.region_bytes / MIB,
        stats.regions_released - before.regions_released,
    );
    assert!(stats.region_bytes <= before.region_bytes, "{stats:#?}");
}

/// As `a_buffer_larger_than_any_region_gets_an_extent_made_of_free_regions`,
/// where no region is wholly free (a buffer held throughout): the regions
/// grow by a region that holds the large buffer, past what the cap that
/// follows the working set leaves room for once it is dropped, and the cap
/// keeps that region (younger than an eighth of the window, it was grown
/// for a demand the window holds) until the buffer comes back: it misses
/// once, and nothing is registered or released after.
#[test]
fn a_region_grown_for_a_buffer_is_kept_for_its_next_take() {
    let (pool, faults) = following();
    let step = |n: usize, large: bool| step(&pool, n, large);
    step(16, false);
    step(16, false);
    let kept = pool.take(4 * MIB);
    assert!(kept.is_pinned());
    let first = pool.stats();
    step(0, true);
    let before = pool.stats();
    assert_eq!(before.misses, first.misses + 1, "{before:#?}");
    let registered = faults.registered();
    for _ in 0..4 {
        step(16, false);
        step(0, true);
    }
    let stats = pool.stats();
    assert_eq!(
        (stats.misses, faults.registered(), stats.regions_released),
        (before.misses, registered, before.regions_released),
        "misses, registrations and regions released after the first take of the large buffer; regions {} MiB, then {} MiB: {stats:#?}",
        before.region_bytes / MIB,
        stats.region_bytes / MIB,
    );
    drop(kept);
}

/// A budget lowered below the pinned bytes while one region is in use:
/// only the wholly free one goes, and that reaches the budget; lowered
/// below the region in use, it goes once its buffer is back.
#[test]
fn a_lowered_budget_releases_only_wholly_free_regions() {
    let (pool, faults) = two_free_regions();
    let held = pool.take(4 * MIB);
    assert!(held.was_pooled());
    pool.set_max_pinned_bytes(100 * MIB);
    let s = pool.stats();
    assert!(s.pinned_bytes <= 100 * MIB as u64, "{s:#?}");
    assert_eq!(s.regions, 1, "{s:#?}");
    pool.set_max_pinned_bytes(10 * MIB);
    drop(held);
    pool.flush();
    std::thread::sleep(Duration::from_millis(300));
    let s = pool.stats();
    assert!(s.pinned_bytes <= 10 * MIB as u64, "{s:#?}");
    books_balance(&s, &faults);
}

/// A cap that follows the working set, a little under the regions once the
/// window's larger peak has passed (16 buffers of 4 MiB held, then 14): the
/// excess, a few MiB and less than an eighth of the cap, releases no region,
/// and the smaller steady workload keeps hitting. (A whole region went to
/// cover it, and the next step missed what that region held.)
#[test]
fn a_following_cap_a_little_under_the_regions_releases_none() {
    let (pool, faults) = following_with(|b| b.idle_trim(Duration::from_millis(800)));
    // Held across provisioning ticks, which see them in use.
    let step = |n: usize| {
        let held: Vec<_> = (0..n).map(|_| pool.take(4 * MIB)).collect();
        std::thread::sleep(Duration::from_millis(50));
        drop(held);
        pool.flush();
        std::thread::sleep(Duration::from_millis(200));
    };
    for _ in 0..3 {
        step(16);
    }
    let before = pool.stats();
    let registered = faults.registered();
    // The window's peak passes (after four steps or so), and the cap falls.
    for _ in 0..10 {
        step(14);
    }
    let after = pool.stats();
    eprintln!(
        "regions {} MiB, cap {} MiB; after: regions {} MiB, cap {} MiB",
        before.region_bytes / MIB,
        before.max_pooled_bytes / MIB,
        after.region_bytes / MIB,
        after.max_pooled_bytes / MIB
    );
    assert_eq!(
        (after.misses, after.regions_released, faults.registered()),
        (before.misses, before.regions_released, registered),
        "misses, regions released and registrations over ten steady steps: {after:#?}"
    );
    shut_down_balanced(pool, &faults);
}
