//! A value per thread, reachable from every thread.
//!
//! Each thread that uses a map gets a *slot index*, the lowest free one,
//! and its value lives in that slot of every map; values outlive their
//! threads (an exited thread's value stays until the map is dropped, and
//! the next thread given its index inherits it), so every thread cache
//! stays reachable for steals, eviction, `clear` and `shutdown`, and a
//! process that starts and ends threads keeps as many caches as it ever
//! ran threads at once. Slots sit in buckets of doubling size (bucket `b`
//! holds `2^b` slots), each installed by a CAS when first needed, as in the
//! `thread_local` crate, whose layout this follows: a lookup is two loads,
//! and iteration walks the buckets.
//!
//! Each thread that owns a value also gets an *owner token*, a number never
//! reused, so that "does the calling thread own this value" is one
//! thread-local read and a compare ([`current_token`]); the owner stores
//! its token in the value (the `claim` of [`get_or`]).
//!
//! Each thread also remembers the last map it looked up and its value
//! there, next to its token: a lookup in that map is one thread-local read
//! and a compare. Maps are named by a number never reused, so the memo of a
//! dropped map matches no other.
//!
//! A thread that is being torn down (its thread-local destructors running)
//! must still be able to take and drop buffers, in every order of those
//! destructors. The index and token are kept in a thread-local without a
//! destructor, which stays readable to the end, and a guard of this
//! module's, created with them at the thread's first use of any map, gives
//! the index back when the thread's destructors reach it. From then on the
//! thread's token is `DEAD` and [`get_or`] returns `None` (callers then
//! bypass the cache) before another thread can inherit the value. A
//! thread whose first use comes during its teardown gets an index then,
//! and a guard that runs later in the same teardown (the C library runs
//! destructors registered while it runs them). The `thread_local` crate
//! is not used: its lookup panics in a destructor that runs after its own
//! guard, and it has no way to ask first (a process built with
//! `panic = "abort"` would abort, even though the panic was caught).
//!
//! Loom runs every model thread on one OS thread, so the loom build keeps
//! the index, the token and the free indices in loom's primitives (the
//! free ones as bits of an atomic, taken by CAS: the same edges as the
//! normal build's lock), and the values in one flat array of slots (a loom execution has few threads),
//! installed by a Release store and read by Acquire loads, the same
//! happens-before edges as the buckets here. Loom runs thread-local
//! destructors in no set order, so a model ends a thread's ownership
//! where its teardown would reach the guard (`loom_internals::end_thread`).
//!
//! [`get_or`]: PerThread::get_or

#[cfg(not(pinpool_loom))]
mod imp {
    use std::cell::Cell;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    use std::ptr;
    use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

    use super::{DEAD, NONE};
    use crate::sync::StaticMutex;

    /// A thread's index, token and its memo of its last lookup.
    struct Local {
        /// This thread's owner token: `NONE` until it uses a map, `DEAD`
        /// once its teardown reached the guard.
        token: Cell<u64>,
        /// This thread's slot index, valid while the token is neither.
        index: Cell<usize>,
        /// The token this thread was given (0 before), kept through its
        /// teardown: the name a trace gives its records.
        name: Cell<u64>,
        /// The `id` of the map last looked up (0: none), and this thread's
        /// value there.
        map: Cell<u64>,
        value: Cell<*const ()>,
    }

    thread_local! {
        // No destructor: readable until the thread is gone.
        static LOCAL: Local = const {
            Local {
                token: Cell::new(NONE),
                index: Cell::new(0),
                name: Cell::new(0),
                map: Cell::new(0),
                value: Cell::new(ptr::null()),
            }
        };
        static GUARD: Guard = const { Guard };
    }

    /// Tokens are never reused, so a token can name at most one thread.
    static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);
    /// Map ids are never reused either (0 names no map).
    static NEXT_MAP: AtomicU64 = AtomicU64::new(1);

    /// Slot indices: the lowest free one goes to the next thread.
    struct Indices {
        next: usize,
        free: BinaryHeap<Reverse<usize>>,
    }

    static INDICES: StaticMutex<Indices> = StaticMutex::new(Indices {
        next: 0,
        free: BinaryHeap::new(),
    });

    fn indices() -> std::sync::MutexGuard<'static, Indices> {
        // Each step under the lock leaves the indices consistent.
        INDICES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Gives the thread's index back when its destructors reach it.
    struct Guard;

    impl Drop for Guard {
        fn drop(&mut self) {
            // `LOCAL` has no destructor, so it outlives every guard. The memo
            // goes with the token: a dying thread looks its value up again,
            // and gets none.
            let index = LOCAL.with(|l| {
                l.token.set(DEAD);
                l.map.set(0);
                l.index.get()
            });
            indices().free.push(Reverse(index));
        }
    }

    /// The calling thread's token (`NONE` before its first lookup, `DEAD`
    /// once its teardown reached the guard).
    #[inline]
    pub(crate) fn current_token() -> u64 {
        LOCAL.with(|l| l.token.get())
    }

    /// The calling thread's slot index, assigned on its first use; `None`
    /// once its teardown reached the guard.
    #[inline]
    fn current_index() -> Option<usize> {
        match LOCAL.with(|l| (l.token.get(), l.index.get())) {
            (DEAD, _) => None,
            (NONE, _) => Some(assign()),
            (_, index) => Some(index),
        }
    }

    #[cold]
    fn assign() -> usize {
        let index = {
            let mut indices = indices();
            match indices.free.pop() {
                Some(Reverse(index)) => index,
                None => {
                    indices.next += 1;
                    indices.next - 1
                }
            }
        };
        // The guard first: once the token is set, the index is given back
        // when the thread goes.
        GUARD.with(|_| ());
        // Relaxed: only uniqueness matters.
        let token = match LOCAL.with(|l| l.name.get()) {
            0 => NEXT_TOKEN.fetch_add(1, Ordering::Relaxed),
            named => named,
        };
        LOCAL.with(|l| {
            l.index.set(index);
            l.token.set(token);
            l.name.set(token);
        });
        index
    }

    /// The calling thread's name: the token it was given, through its
    /// teardown too (when its token reads `DEAD`); a thread that had none
    /// is given one now (a number no other thread had, without a slot).
    #[inline]
    pub(crate) fn current_name() -> u64 {
        match LOCAL.with(|l| l.name.get()) {
            0 => name_now(),
            name => name,
        }
    }

    #[cold]
    fn name_now() -> u64 {
        // Relaxed: only uniqueness matters.
        let name = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
        LOCAL.with(|l| l.name.set(name));
        name
    }

    /// Bucket `b` holds slots `2^b - 1 ..= 2^(b+1) - 2`.
    const BUCKETS: usize = usize::BITS as usize;

    /// Bucket and offset of slot `index`.
    #[inline]
    fn locate(index: usize) -> (usize, usize) {
        let bucket = (usize::BITS - 1 - (index + 1).leading_zeros()) as usize;
        (bucket, index + 1 - (1 << bucket))
    }

    /// See the module docs.
    pub(crate) struct PerThread<T: Send> {
        /// Each a boxed slice of `2^b` slots (its first element's address),
        /// each slot a boxed value or null.
        buckets: [AtomicPtr<AtomicPtr<T>>; BUCKETS],
        /// Names this map in the threads' memos.
        id: u64,
    }

    // SAFETY: as the `thread_local` crate's `ThreadLocal`: a value is made
    // by its thread and handed to that thread (`get_or`) or, through
    // `iter`, which needs `T: Sync`, shared with any.
    unsafe impl<T: Send> Sync for PerThread<T> {}

    impl<T: Send> PerThread<T> {
        pub(crate) fn new() -> Self {
            Self {
                buckets: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
                // Relaxed: only uniqueness matters.
                id: NEXT_MAP.fetch_add(1, Ordering::Relaxed),
            }
        }

        /// The calling thread's value, created by `create` on first use;
        /// `None` while the thread is being torn down, past its guard.
        /// `claim` gets the value and the thread's token whenever the
        /// lookup is not served by the thread's memo: on the thread's first
        /// lookup, and after a lookup in another map (a value left by an
        /// exited thread may have passed to this one).
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
                // which `&self` keeps alive; the thread still holds its
                // index, since the guard clears the memo and `lookup` never
                // sets it after that.
                return Some(unsafe { &*value.cast::<T>() });
            }
            self.lookup(create, claim)
        }

        #[cold]
        fn lookup(&self, create: impl FnOnce() -> T, claim: impl FnOnce(&T, u64)) -> Option<&T> {
            let index = current_index()?;
            let slot = self.slot(index);
            // Acquire pairs with the Release store below, made by an exited
            // thread that held this index: its value is fully built. (The
            // index passed from it to this thread through `INDICES`' lock,
            // which orders that store before this load anyway.)
            let mut value = slot.load(Ordering::Acquire);
            if value.is_null() {
                value = Box::into_raw(Box::new(create()));
                // Release publishes the value to `iter` on other threads.
                // Only the holder of the index writes its slot.
                slot.store(value, Ordering::Release);
            }
            // SAFETY: a non-null slot holds a box that lives, unmoved,
            // until the map drops.
            let value = unsafe { &*value };
            claim(value, current_token());
            LOCAL.with(|l| {
                l.map.set(self.id);
                l.value.set(ptr::from_ref(value).cast());
            });
            Some(value)
        }

        /// Slot `index`, installing its bucket if it has none yet.
        fn slot(&self, index: usize) -> &AtomicPtr<T> {
            let (bucket, offset) = locate(index);
            let entry = &self.buckets[bucket];
            // Acquire pairs with the installing CAS: the slots are
            // initialized.
            let mut slots = entry.load(Ordering::Acquire);
            if slots.is_null() {
                let fresh: Box<[AtomicPtr<T>]> = (0..1usize << bucket)
                    .map(|_| AtomicPtr::new(ptr::null_mut()))
                    .collect();
                let fresh = Box::into_raw(fresh).cast::<AtomicPtr<T>>();
                // AcqRel: Release publishes the fresh slots, Acquire (also
                // on failure) sees a racing thread's.
                match entry.compare_exchange(
                    ptr::null_mut(),
                    fresh,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => slots = fresh,
                    Err(installed) => {
                        // SAFETY: `fresh` was made just above and never
                        // shared: rebuild the box to free it.
                        drop(unsafe { Self::bucket_box(fresh, bucket) });
                        slots = installed;
                    }
                }
            }
            // SAFETY: bucket `bucket` holds `2^bucket` slots and `offset` is
            // below that (see `locate`); installed buckets live until the
            // map drops.
            unsafe { &*slots.add(offset) }
        }

        /// The box of bucket `bucket`, from its first slot's address.
        ///
        /// # Safety
        /// `slots` came from `Box::into_raw` of a slice of `2^bucket` slots,
        /// and is not used after.
        unsafe fn bucket_box(slots: *mut AtomicPtr<T>, bucket: usize) -> Box<[AtomicPtr<T>]> {
            let slice = ptr::slice_from_raw_parts_mut(slots, 1 << bucket);
            // SAFETY: the caller's guarantee.
            unsafe { Box::from_raw(slice) }
        }

        /// Every thread's value, those of exited threads included.
        pub(crate) fn iter(&self) -> impl Iterator<Item = &T>
        where
            T: Sync,
        {
            self.buckets
                .iter()
                .enumerate()
                // Acquire: as in `slot`.
                // A bucket may be missing below an installed one: indices
                // are handed out by the process, and a map sees only the
                // threads that use it.
                .map(|(bucket, entry)| (bucket, entry.load(Ordering::Acquire)))
                .filter(|(_, slots)| !slots.is_null())
                .flat_map(|(bucket, slots)| {
                    // SAFETY: an installed bucket of `2^bucket` slots, live
                    // until the map drops, which `&self` prevents.
                    let slots = unsafe { &*ptr::slice_from_raw_parts(slots, 1 << bucket) };
                    slots.iter().filter_map(|slot| {
                        // Acquire pairs with the value's Release store.
                        let value = slot.load(Ordering::Acquire);
                        // SAFETY: a non-null slot holds a live box.
                        (!value.is_null()).then(|| unsafe { &*value })
                    })
                })
        }
    }

    impl<T: Send> Drop for PerThread<T> {
        fn drop(&mut self) {
            for (bucket, entry) in self.buckets.iter_mut().enumerate() {
                let slots = *entry.get_mut();
                if slots.is_null() {
                    continue;
                }
                // SAFETY: installed by `slot` from such a box; `&mut self`:
                // nothing else reaches it.
                let mut slots = unsafe { Self::bucket_box(slots, bucket) };
                for slot in slots.iter_mut() {
                    let value = *slot.get_mut();
                    if !value.is_null() {
                        // SAFETY: made by `Box::into_raw` in `lookup`; no
                        // reference into it outlives `&mut self`.
                        drop(unsafe { Box::from_raw(value) });
                    }
                }
            }
        }
    }
}

#[cfg(pinpool_loom)]
mod imp {
    use std::cell::Cell;

    use super::{DEAD, NONE};
    use crate::sync::{AtomicPtr, AtomicUsize, Ordering};

    /// A loom execution never has more threads, so never more indices.
    const SLOTS: usize = loom::MAX_THREADS;

    loom::lazy_static! {
        /// Indices given back by threads' guards, one bit each: as in the
        /// normal build, the lowest free one goes to the next thread, so a
        /// thread started after another's teardown inherits its values.
        static ref FREE: AtomicUsize = AtomicUsize::new(0);
        /// The next index never handed out, and the next token: std
        /// atomics, which loom does not schedule around (as the statistics
        /// counters): they only number, and publish nothing. Under loom
        /// every model thread runs on one OS thread, so they are exact;
        /// they are made again for each execution.
        static ref NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        static ref NEXT_TOKEN: std::sync::atomic::AtomicU64 =
            std::sync::atomic::AtomicU64::new(1);
    }
    loom::thread_local! {
        static TOKEN: Cell<u64> = Cell::new(NONE);
        static INDEX: Cell<usize> = Cell::new(0);
    }

    pub(crate) fn current_token() -> u64 {
        TOKEN.with(Cell::get)
    }

    /// As the normal build's (models never trace): the token while the
    /// thread has one.
    pub(crate) fn current_name() -> u64 {
        TOKEN.with(Cell::get)
    }

    /// As the normal build's.
    fn current_index() -> Option<usize> {
        match current_token() {
            DEAD => None,
            NONE => Some(assign()),
            _ => Some(INDEX.with(Cell::get)),
        }
    }

    fn assign() -> usize {
        // Acquire pairs with the Release in `end_thread`: an inherited slot's
        // value is seen as its last holder left it (as the normal build's
        // lock orders it).
        let mut free = FREE.load(Ordering::Acquire);
        let index = loop {
            if free == 0 {
                // Relaxed: only uniqueness matters.
                break NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            let lowest = free.trailing_zeros() as usize;
            // AcqRel: Acquire as above (the Release half publishes
            // nothing).
            match FREE.compare_exchange(
                free,
                free & !(1 << lowest),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break lowest,
                Err(now) => free = now,
            }
        };
        // Relaxed: only uniqueness matters.
        let token = NEXT_TOKEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        INDEX.with(|i| i.set(index));
        TOKEN.with(|t| t.set(token));
        index
    }

    /// What the normal build's guard does when the thread's destructors
    /// reach it: loom runs thread-local destructors in no set order, so a
    /// model calls this where the teardown would reach the guard.
    pub(crate) fn end_thread() {
        let had_index = !matches!(current_token(), NONE | DEAD);
        TOKEN.with(|t| t.set(DEAD));
        if had_index {
            // Release: the thread's last use of its values happens before
            // the next holder of the index takes it (see `assign`).
            FREE.fetch_or(1 << INDEX.with(Cell::get), Ordering::Release);
        }
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

        /// As the normal build's, without the memo: `claim` runs on every
        /// lookup.
        pub(crate) fn get_or(
            &self,
            create: impl FnOnce() -> T,
            claim: impl FnOnce(&T, u64),
        ) -> Option<&T> {
            let slot = &self.slots[current_index()?];
            // Acquire pairs with the Release store below (this thread's,
            // or an exited holder's of the index).
            let mut ptr = slot.load(Ordering::Acquire);
            if ptr.is_null() {
                ptr = Box::into_raw(Box::new(create()));
                // Release publishes the value to `iter` and later lookups.
                // Only the holder of the index writes its slot.
                slot.store(ptr, Ordering::Release);
            }
            // SAFETY: non-null slots hold boxes that live until `self` drops.
            let value = unsafe { &*ptr };
            claim(value, current_token());
            Some(value)
        }

        pub(crate) fn iter(&self) -> impl Iterator<Item = &T>
        where
            T: Sync,
        {
            self.slots.iter().filter_map(|slot| {
                // Acquire: as in `get_or`.
                let ptr = slot.load(Ordering::Acquire);
                // SAFETY: as in `get_or`.
                (!ptr.is_null()).then(|| unsafe { &*ptr })
            })
        }
    }

    // SAFETY: as the normal build's: each value is created by and handed
    // to its own thread, and `iter` (which shares values across threads)
    // needs `T: Sync`.
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

#[cfg(pinpool_loom)]
pub(crate) use imp::end_thread;
pub(crate) use imp::{current_name, current_token, PerThread};

/// No thread has this token (a cache nobody has owned yet).
pub(crate) const NOBODY: u64 = u64::MAX - 1;
/// A thread without a token yet.
const NONE: u64 = 0;
/// A thread whose teardown has reached its guard.
const DEAD: u64 = u64::MAX;

impl<T: Send> std::fmt::Debug for PerThread<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PerThread")
    }
}
