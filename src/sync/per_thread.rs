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
//! its token in the value (the `claim` of [`get_or`]).
//!
//! Each thread also remembers the last map it looked up and its value
//! there, next to its token: a lookup in that map is one thread-local read
//! and a compare, without the crate's bucket walk. Maps are named by a
//! number never reused, so the memo of a dropped map matches no other.
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

    /// A thread's token and its memo of its last lookup.
    struct Local {
        /// This thread's owner token: `NONE` until it owns a value, `DEAD`
        /// once its teardown reached the guard.
        token: Cell<u64>,
        /// The `id` of the map last looked up (0: none), and this thread's
        /// value there.
        map: Cell<u64>,
        value: Cell<*const ()>,
    }

    thread_local! {
        static LOCAL: Local = const {
            Local {
                token: Cell::new(NONE),
                map: Cell::new(0),
                value: Cell::new(std::ptr::null()),
            }
        };
        static GUARD: Guard = const { Guard };
    }

    /// Tokens are never reused, so a token can name at most one thread.
    static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);
    /// Map ids are never reused either (0 names no map).
    static NEXT_MAP: AtomicU64 = AtomicU64::new(1);

    /// Marks the thread as dying when its destructors reach this guard.
    struct Guard;

    impl Drop for Guard {
        fn drop(&mut self) {
            // `LOCAL` has no destructor, so it outlives every guard. The memo
            // goes with the token: a dying thread looks its value up again,
            // and gets none.
            LOCAL.with(|l| {
                l.token.set(DEAD);
                l.map.set(0);
            });
        }
    }

    /// The calling thread's token, as [`owner_token`] left it (never
    /// assigns one).
    #[inline]
    pub(crate) fn current_token() -> u64 {
        LOCAL.with(|l| l.token.get())
    }

    /// The calling thread's token, assigned on first use; call only after
    /// the thread got a value from [`PerThread::get_or`], so that the
    /// guard that retires the token is created after the crate's own
    /// per-thread guard, and destroyed before it.
    #[inline]
    fn owner_token() -> u64 {
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
        LOCAL.with(|l| l.token.set(token));
        token
    }

    /// See the module docs.
    pub(crate) struct PerThread<T: Send> {
        map: thread_local::ThreadLocal<T>,
        /// Names this map in the threads' memos.
        id: u64,
    }

    impl<T: Send> PerThread<T> {
        pub(crate) fn new() -> Self {
            Self {
                map: thread_local::ThreadLocal::new(),
                // Relaxed: only uniqueness matters.
                id: NEXT_MAP.fetch_add(1, Ordering::Relaxed),
            }
        }

        /// The calling thread's value, created by `create` on first use;
        /// `None` while the thread is being torn down. `claim` gets the
        /// value and the thread's token whenever the lookup is not served
        /// by the thread's memo: on the thread's first lookup, and after a
        /// lookup in another map (a value left by an exited thread may have
        /// passed to this one).
        #[inline]
        pub(crate) fn get_or(
            &self,
            create: impl FnOnce() -> T,
            claim: impl FnOnce(&T, u64),
        ) -> Option<&T> {
            let (map, value) = LOCAL.with(|l| (l.map.get(), l.value.get()));
            if map == self.id {
                // SAFETY: the memo names this map (ids are never reused),
                // so `lookup` below stored this thread's value in it, a
                // value that lives and stays in place as long as the map,
                // which `&self` keeps alive; the thread is not dying, since
                // the guard clears the memo and `lookup` never sets it
                // after that.
                return Some(unsafe { &*value.cast::<T>() });
            }
            self.lookup(create, claim)
        }

        #[cold]
        fn lookup(&self, create: impl FnOnce() -> T, claim: impl FnOnce(&T, u64)) -> Option<&T> {
            let value = match self.map.get() {
                // The crate's map still has this thread's value while the
                // thread's destructors run between this module's guard and
                // the crate's: a dying thread must not get it back, since
                // every dying thread has the same token (`DEAD`) and two of
                // them would both pass for its owner.
                Some(value) if current_token() != DEAD => value,
                Some(_) => return None,
                None => self.insert(create)?,
            };
            claim(value, owner_token());
            LOCAL.with(|l| {
                l.map.set(self.id);
                l.value.set(std::ptr::from_ref(value).cast());
            });
            Some(value)
        }

        #[cold]
        fn insert(&self, create: impl FnOnce() -> T) -> Option<&T> {
            match current_token() {
                DEAD => None,
                NONE => {
                    // Maybe the thread's first `get_or` of any map, maybe
                    // during its teardown (then the crate panics).
                    let value = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        self.map.get_or(create)
                    }))
                    .ok()?;
                    owner_token();
                    Some(value)
                }
                _ => Some(self.map.get_or(create)),
            }
        }

        /// Every thread's value, those of exited threads included.
        pub(crate) fn iter(&self) -> impl Iterator<Item = &T>
        where
            T: Sync,
        {
            self.map.iter()
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

        /// As the normal build's, without the memo: `claim` runs on every
        /// lookup.
        pub(crate) fn get_or(
            &self,
            create: impl FnOnce() -> T,
            claim: impl FnOnce(&T, u64),
        ) -> Option<&T> {
            let value = match self.get() {
                Some(value) => value,
                None => {
                    let ptr = Box::into_raw(Box::new(create()));
                    // Release publishes the value to `iter` and later `get`s.
                    // Only this thread writes its slot.
                    self.slot().store(ptr, Ordering::Release);
                    // SAFETY: just installed; lives until `self` drops.
                    unsafe { &*ptr }
                }
            };
            claim(value, current_token());
            Some(value)
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

pub(crate) use imp::{current_token, PerThread};

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
