//! The only module that names std or loom primitives.
//!
//! Everything else imports atomics, locks, cells, threads and the stand-ins
//! below from here, so that one body of code runs under [loom] when built
//! with `--cfg loom --features loom` (`cfg(pinpool_loom)`, which `build.rs`
//! sets for that pair). As in tokio and sharded-slab, the std
//! types are given loom's API (`UnsafeCell::with_mut`, a non-poisoning
//! `lock`), never the other way round, and each wrapper is written once over
//! whichever primitive the build uses.
//!
//! Stand-ins that need more than a rename live in files of their own:
//!
//! - [`per_thread`]: a value per thread, reachable from every thread
//!   (buckets of slots indexed per thread, readable in every teardown
//!   order; under loom, slots keyed by loom's threads);
//! - [`barrier`]: the asymmetric fence pair of the thread caches'
//!   owner/thief handshake (`membarrier(2)` where the kernel has it);
//! - [`track`]: loom's leak-checked allocations and per-chunk byte cells,
//!   nothing in normal builds.
//!
//! [loom]: https://docs.rs/loom

#[cfg(not(pinpool_loom))]
mod imp {
    pub(crate) use std::sync::atomic::{
        fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
    };
    pub(crate) use std::sync::{
        Arc, Condvar as RawCondvar, Mutex as RawMutex, MutexGuard, PoisonError, TryLockError,
    };
    pub(crate) use std::thread;

    /// `std::cell::UnsafeCell` with loom's closure-based API.
    #[derive(Debug)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) const fn new(value: T) -> Self {
            Self(std::cell::UnsafeCell::new(value))
        }

        #[inline(always)]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }

    /// Waits on `condvar` for a notification or `timeout`.
    pub(crate) fn wait_timeout<'a, T>(
        condvar: &RawCondvar,
        _lock: &'a RawMutex<T>,
        guard: MutexGuard<'a, T>,
        timeout: std::time::Duration,
    ) -> MutexGuard<'a, T> {
        match condvar.wait_timeout(guard, timeout) {
            Ok((guard, _)) => guard,
            Err(e) => e.into_inner().0,
        }
    }

    /// Backs off in a spin-wait: a CPU hint, then a yield.
    #[inline]
    pub(crate) fn spin(round: u32) {
        if round < 64 {
            std::hint::spin_loop();
        } else {
            thread::yield_now();
        }
    }
}

#[cfg(pinpool_loom)]
mod imp {
    pub(crate) use loom::cell::UnsafeCell;
    pub(crate) use loom::sync::atomic::{
        fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
    };
    pub(crate) use loom::sync::{Arc, Condvar as RawCondvar, Mutex as RawMutex, MutexGuard};
    pub(crate) use loom::thread;
    pub(crate) use std::sync::{PoisonError, TryLockError};

    /// Loom has no time: a timed wait gives every other thread a chance to
    /// run (a yield) and returns, as a timeout that expired would.
    pub(crate) fn wait_timeout<'a, T>(
        _condvar: &RawCondvar,
        lock: &'a RawMutex<T>,
        guard: MutexGuard<'a, T>,
        _timeout: std::time::Duration,
    ) -> MutexGuard<'a, T> {
        drop(guard);
        thread::yield_now();
        lock.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Under loom a spin-wait yields to the scheduler.
    #[inline]
    pub(crate) fn spin(_round: u32) {
        thread::yield_now();
    }
}

pub(crate) use imp::*;

pub(crate) mod barrier;
pub(crate) mod per_thread;
pub(crate) mod track;

/// Set once before the value is shared, read freely afterwards: loom need
/// not see it.
pub(crate) use std::sync::OnceLock;

/// std's mutex in every build: for process-wide statics (the global pool's
/// first build, whether the reaper runs), which loom models never reach,
/// and whose constructor is `const`; and for the pinned budget's admission
/// (`Counters::claim_pinned`), held only around statistics counters (std
/// atomics in every build, see [`StatCounter`]), never across a point
/// where loom switches threads, so loom need not see it (nor explores its
/// interleavings).
pub(crate) use std::sync::Mutex as StaticMutex;

/// crossbeam's channels, which loom cannot see: the normal build's cleaner
/// lanes and reaper thread (the loom build replaces both; see
/// `cleaner::lanes` and `reaper`).
#[cfg(not(pinpool_loom))]
pub(crate) use crossbeam_channel as channel;

/// A statistics counter: compiled in everywhere, loom models included
/// (they read and check its values), but a std atomic in every build.
/// Counters decide nothing and publish nothing (Relaxed throughout), so
/// loom need not schedule around them; under loom, where every model
/// thread runs on one OS thread, their values are exact.
pub(crate) type StatCounter = std::sync::atomic::AtomicU64;

/// A count that only bounds a backlog or hints at a role (read Relaxed,
/// publishing nothing; a stale value lets a few drops past a bound, or
/// costs a pop): a std atomic in every build, as the statistics counters,
/// so that loom does not explore its values. Models never come near the
/// bounds it guards.
pub(crate) type HintCounter = std::sync::atomic::AtomicUsize;

/// A std mutex in every build, for the test backend's bookkeeping (its plan
/// and call log): never held across a pool operation and deciding nothing
/// the models check the pool's synchronization on, so loom need not see it.
#[cfg(feature = "testing")]
pub(crate) type Unmodeled<T> = std::sync::Mutex<T>;

/// A mutex whose `lock` ignores poisoning: every structure it guards is left
/// consistent between statements, so a panic elsewhere never leaves it
/// half-updated.
#[derive(Debug)]
pub(crate) struct Mutex<T>(RawMutex<T>);

impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(RawMutex::new(value))
    }

    #[inline]
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The guard if the lock is free now (poisoned or not), else `None`.
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// The value, through exclusive access: no locking.
    #[inline]
    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A condition variable whose waits ignore poisoning, like [`Mutex`].
#[derive(Debug)]
pub(crate) struct Condvar(RawCondvar);

impl Condvar {
    pub(crate) fn new() -> Self {
        Self(RawCondvar::new())
    }

    pub(crate) fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.0.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for a notification or until `timeout` passes (under loom: a
    /// yield, see `imp::wait_timeout`).
    pub(crate) fn wait_timeout<'a, T>(
        &self,
        lock: &'a Mutex<T>,
        guard: MutexGuard<'a, T>,
        timeout: std::time::Duration,
    ) -> MutexGuard<'a, T> {
        imp::wait_timeout(&self.0, &lock.0, guard, timeout)
    }

    pub(crate) fn notify_all(&self) {
        self.0.notify_all();
    }
}
