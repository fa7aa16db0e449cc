//! A value per thread, reachable from every thread.
//!
//! Normal builds use the `thread_local` crate's `ThreadLocal`, whose entries
//! outlive their threads (an exited thread's value stays until the map is
//! dropped, and a new thread may inherit it), so every thread cache stays
//! reachable for steals, eviction, `clear` and `shutdown`.
//!
//! A thread that is being torn down (its thread-local destructors running)
//! must still be able to take and drop buffers, but the crate's `get_or`
//! panics once the crate's own per-thread guard is destroyed. [`get_or`]
//! therefore returns `None` for such a thread, and callers bypass the
//! cache. It knows because this module keeps a guard of its own, created
//! right after the thread's first `get_or`: thread-local destructors run in
//! the reverse order of their creation (glibc's `__call_tls_dtors`, and
//! std's own list), so this guard dies before the crate's, and a thread
//! whose guard is gone gets `None`. A thread whose very first `get_or`
//! happens during its teardown is caught by `catch_unwind`.
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

    const FRESH: u8 = 0;
    const ALIVE: u8 = 1;
    const DYING: u8 = 2;

    thread_local! {
        static STATE: Cell<u8> = const { Cell::new(FRESH) };
        static GUARD: Guard = const { Guard };
    }

    /// Marks the thread as dying when its destructors reach this guard.
    struct Guard;

    impl Drop for Guard {
        fn drop(&mut self) {
            // `STATE` has no destructor, so it outlives every guard.
            STATE.with(|s| s.set(DYING));
        }
    }

    /// See the module docs.
    pub(crate) struct PerThread<T: Send>(thread_local::ThreadLocal<T>);

    impl<T: Send> PerThread<T> {
        pub(crate) fn new() -> Self {
            Self(thread_local::ThreadLocal::new())
        }

        /// The calling thread's value, if it has one. Never panics, also
        /// during thread teardown.
        #[inline]
        pub(crate) fn get(&self) -> Option<&T> {
            self.0.get()
        }

        /// The calling thread's value, created by `create` on first use;
        /// `None` while the thread is being torn down.
        #[inline]
        pub(crate) fn get_or(&self, create: impl FnOnce() -> T) -> Option<&T> {
            match self.0.get() {
                Some(value) => Some(value),
                None => self.insert(create),
            }
        }

        #[cold]
        fn insert(&self, create: impl FnOnce() -> T) -> Option<&T> {
            match STATE.with(Cell::get) {
                DYING => None,
                ALIVE => Some(self.0.get_or(create)),
                _ => {
                    let value = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        self.0.get_or(create)
                    }))
                    .ok()?;
                    GUARD.with(|_| ());
                    STATE.with(|s| s.set(ALIVE));
                    Some(value)
                }
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

        pub(crate) fn get(&self) -> Option<&T> {
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

pub(crate) use imp::PerThread;

impl<T: Send> std::fmt::Debug for PerThread<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PerThread")
    }
}
