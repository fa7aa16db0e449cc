//! A value per thread, reachable from every thread.
//!
//! Normal builds use the `thread_local` crate's `ThreadLocal`, whose entries
//! outlive their threads (an exited thread's value stays until the map is
//! dropped, and a new thread may inherit it), so every thread cache stays
//! reachable for steals, eviction, `clear` and `shutdown`.
//!
//! Each thread that owns a value also gets an *owner token*, a number never
//! reused, so that "does the calling thread own this value" is one
//! thread-local read and a compare ([`current_token`]); the owner stores
//! its token in the value.
//!
//! A thread that is being torn down (its thread-local destructors running)
//! must still be able to take and drop buffers, but the crate's `get_or`
//! panics once the crate's own per-thread guard is destroyed, after which
//! another thread may inherit the dying thread's value. So this module
//! keeps a guard of its own, created right after the thread's first
//! `get_or`: thread-local destructors run in the reverse order of their
//! creation (glibc's `__call_tls_dtors`, and std's own list), so this guard
//! dies before the crate's, retiring the token and making [`get_or`] return
//! `None` (callers then bypass the cache) before the value can change
//! hands. A thread whose very first `get_or` happens during its teardown is
//! caught by `catch_unwind`.
//!
//! Loom runs every model thread on one OS thread, so the loom build keys
//! entries by loom thread instead: one slot per loom thread, installed by a
//! Release store and read by Acquire loads, the same happens-before edges
//! as the crate's buckets (and no global lock, which would add edges the
//! real map lacks).
//!
//! [`get_or`]: PerThread::get_or

#[cfg(not(all(loom, feature = "loom")))]
mod imp {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::{DEAD, NONE};

    thread_local! {
        /// This thread's owner token: `NONE` until it owns a value, `DEAD`
        /// once its teardown reached the guard.
        static TOKEN: Cell<u64> = const { Cell::new(NONE) };
        static GUARD: Guard = const { Guard };
    }

    /// Tokens are never reused, so a token can name at most one thread.
    static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

    /// Marks the thread as dying when its destructors reach this guard.
    struct Guard;

    impl Drop for Guard {
        fn drop(&mut self) {
            // `TOKEN` has no destructor, so it outlives every guard.
            TOKEN.with(|t| t.set(DEAD));
        }
    }

    /// The calling thread's token, as [`owner_token`] left it (never
    /// assigns one).
    #[inline]
    pub(crate) fn current_token() -> u64 {
        TOKEN.with(Cell::get)
    }

    /// The calling thread's token, assigned on first use; call only after
    /// the thread got a value from [`PerThread::get_or`], so that the
    /// guard that retires the token is created after the crate's own
    /// per-thread guard, and destroyed before it.
    #[inline]
    pub(crate) fn owner_token() -> u64 {
        match current_token() {
            NONE => assign(),
            token => token,
        }
    }

    #[cold]
    fn assign() -> u64 {
        // Relaxed: only uniqueness matters.
        let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
        GUARD.with(|_| ());
        TOKEN.with(|t| t.set(token));
        token
    }

    /// See the module docs.
    pub(crate) struct PerThread<T: Send>(thread_local::ThreadLocal<T>);

    impl<T: Send> PerThread<T> {
        pub(crate) fn new() -> Self {
            Self(thread_local::ThreadLocal::new())
        }

        /// The calling thread's value, created by `create` on first use;
        /// `None` while the thread is being torn down.
        #[inline]
        pub(crate) fn get_or(&self, create: impl FnOnce() -> T) -> Option<&T> {
            match self.0.get() {
                // The crate's map still has this thread's value while the
                // thread's destructors run between this module's guard and
                // the crate's: a dying thread must not get it back, since
                // every dying thread has the same token (`DEAD`) and two of
                // them would both pass for its owner.
                Some(value) if current_token() != DEAD => Some(value),
                Some(_) => None,
                None => self.insert(create),
            }
        }

        #[cold]
        fn insert(&self, create: impl FnOnce() -> T) -> Option<&T> {
            match current_token() {
                DEAD => None,
                NONE => {
                    // Maybe the thread's first `get_or` of any map, maybe
                    // during its teardown (then the crate panics).
                    let value = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        self.0.get_or(create)
                    }))
                    .ok()?;
                    owner_token();
                    Some(value)
                }
                _ => Some(self.0.get_or(create)),
            }
        }

        /// Every thread's value, those of exited threads included.
        pub(crate) fn iter(&self) -> impl Iterator<Item = &T>
        where
            T: Sync,
        {
            self.0.iter()
        }
    }
}

#[cfg(all(loom, feature = "loom"))]
mod imp {
    use loom::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

    const SLOTS: usize = loom::MAX_THREADS;

    loom::lazy_static! {
        static ref NEXT: AtomicUsize = AtomicUsize::new(0);
    }
    loom::thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }

    /// Loom threads are never reused within an execution: the slot index
    /// names the thread.
    pub(crate) fn current_token() -> u64 {
        INDEX.with(|i| *i as u64 + 1)
    }

    /// See `current_token`.
    pub(crate) fn owner_token() -> u64 {
        current_token()
    }

    /// See the module docs.
    pub(crate) struct PerThread<T: Send> {
        slots: [AtomicPtr<T>; SLOTS],
    }

    impl<T: Send> PerThread<T> {
        pub(crate) fn new() -> Self {
            Self {
                slots: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            }
        }

        fn slot(&self) -> &AtomicPtr<T> {
            &self.slots[INDEX.with(|i| *i)]
        }

        fn get(&self) -> Option<&T> {
            // Acquire pairs with the Release store in `get_or`.
            let ptr = self.slot().load(Ordering::Acquire);
            // SAFETY: non-null slots hold boxes that live until `self` drops.
            (!ptr.is_null()).then(|| unsafe { &*ptr })
        }

        pub(crate) fn get_or(&self, create: impl FnOnce() -> T) -> Option<&T> {
            if let Some(value) = self.get() {
                return Some(value);
            }
            let ptr = Box::into_raw(Box::new(create()));
            // Release publishes the value to `iter` and later `get`s. Only
            // this thread writes its slot.
            self.slot().store(ptr, Ordering::Release);
            // SAFETY: just installed; lives until `self` drops.
            Some(unsafe { &*ptr })
        }

        pub(crate) fn iter(&self) -> impl Iterator<Item = &T>
        where
            T: Sync,
        {
            self.slots.iter().filter_map(|slot| {
                // Acquire: as in `get`.
                let ptr = slot.load(Ordering::Acquire);
                // SAFETY: as in `get`.
                (!ptr.is_null()).then(|| unsafe { &*ptr })
            })
        }
    }

    // SAFETY: as the `thread_local` crate's `ThreadLocal`: each value is
    // created by and handed to its own thread, and `iter` (which shares
    // values across threads) needs `T: Sync`.
    unsafe impl<T: Send> Sync for PerThread<T> {}
    // SAFETY: moving the map moves boxed values of `T: Send`.
    unsafe impl<T: Send> Send for PerThread<T> {}

    impl<T: Send> Drop for PerThread<T> {
        fn drop(&mut self) {
            for slot in &self.slots {
                let ptr = slot.load(Ordering::Relaxed);
                if !ptr.is_null() {
                    // SAFETY: installed by `Box::into_raw` in `get_or`;
                    // `&mut self` means no reference into it remains.
                    drop(unsafe { Box::from_raw(ptr) });
                }
            }
        }
    }
}

pub(crate) use imp::{current_token, owner_token, PerThread};

/// No thread has this token (a cache nobody has owned yet).
pub(crate) const NOBODY: u64 = u64::MAX - 1;
/// A thread without a token yet.
#[cfg_attr(all(loom, feature = "loom"), allow(dead_code))]
const NONE: u64 = 0;
/// A thread whose teardown has begun.
#[cfg_attr(all(loom, feature = "loom"), allow(dead_code))]
const DEAD: u64 = u64::MAX;

impl<T: Send> std::fmt::Debug for PerThread<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PerThread")
    }
}
