//! Helpers shared by the loom models.
#![allow(dead_code)]

use std::sync::Arc as StdArc;

use pinpool::testing::Faults;
use pinpool::{BackendKind, Pool, SizeClasses};

/// Runs `f` under loom with room for the pool's longer executions, at the
/// preemption bound `LOOM_MAX_PREEMPTIONS` (or `preemptions`).
pub fn model_bounded(preemptions: Option<usize>, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 200_000;
    if preemptions.is_some() {
        builder.preemption_bound = preemptions;
    }
    builder.check(f);
}

/// As [`model_bounded`] at the environment's bound.
pub fn model(f: impl Fn() + Sync + Send + 'static) {
    model_bounded(None, f);
}

/// A host-backend pool with `workers` cleaner workers. It never borrows
/// (each model names the one buffer path it races); see
/// [`borrowing_pool`].
pub fn pool(workers: usize) -> Pool {
    Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(workers)
        .size_classes(SizeClasses::PowersOfTwo)
        .borrow_slack(0)
        .build()
        .unwrap()
}

/// As [`pool`] with one worker, where a take whose class is empty may
/// borrow an idle buffer of the next (power-of-two) class.
pub fn borrowing_pool() -> Pool {
    Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(1)
        .size_classes(SizeClasses::PowersOfTwo)
        .borrow_slack(100)
        .build()
        .unwrap()
}

/// A pool on the fault-injecting backend, which "pins" every buffer: the
/// registration, device-synchronize and unregistration paths run.
pub fn pinning_pool(workers: usize) -> (Pool, StdArc<Faults>) {
    let faults = StdArc::new(Faults::default());
    let pool = Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(workers)
        .size_classes(SizeClasses::PowersOfTwo)
        .borrow_slack(0)
        .build()
        .unwrap();
    (pool, faults)
}

/// A pool on the fault-injecting backend whose cleaner workers cannot
/// start (nor any thread named with a prefix in `refused`): flushes and the
/// close do the cleaning on their own thread, so a model races only its
/// own threads.
pub fn workerless_pool(refused: &[&str]) -> (Pool, StdArc<Faults>) {
    let faults = StdArc::new(Faults::default());
    faults.fail_spawn("pinpool-cleaner");
    for prefix in refused {
        faults.fail_spawn(prefix);
    }
    let pool = Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(1)
        .size_classes(SizeClasses::PowersOfTwo)
        .borrow_slack(0)
        .build()
        .unwrap();
    (pool, faults)
}

/// As [`workerless_pool`], each buffer and slab pinned on its own
/// (`PoolBuilder::regions(false)`): a sub-page miss's slab is registered
/// and carved when it comes back, where with regions it is freed (its
/// class not being in demand) and the next take carves a page.
pub fn own_slabs_pool() -> (Pool, StdArc<Faults>) {
    workerless_with(|b| b.regions(false))
}

/// As [`workerless_pool`], with buffers carved from regions
/// (`PoolBuilder::regions`).
pub fn carving_pool() -> (Pool, StdArc<Faults>) {
    workerless_with(|b| b.provision(false).regions(true))
}

/// A pool as [`workerless_pool`] makes with no thread refused, with what
/// `settings` adds.
fn workerless_with(
    settings: impl FnOnce(pinpool::PoolBuilder) -> pinpool::PoolBuilder,
) -> (Pool, StdArc<Faults>) {
    let faults = StdArc::new(Faults::default());
    faults.fail_spawn("pinpool-cleaner");
    let builder = Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(1)
        .size_classes(SizeClasses::PowersOfTwo)
        .borrow_slack(0);
    (settings(builder).build().unwrap(), faults)
}

/// A pool whose calling thread's cache holds one ready buffer of 8 bytes;
/// returns it with the buffer's address.
pub fn pool_with_cached_buffer() -> (Pool, usize) {
    let pool = pool(1);
    let buf = pool.take(8);
    let ptr = buf.as_ptr() as usize;
    drop(buf);
    pool.flush();
    (pool, ptr)
}
