//! The only module that names std or loom primitives.
//!
//! Everything else in the crate imports atomics, locks, cells, the
//! per-thread map and the cleaner's work queue from here, so that the same
//! code runs under [loom] when built with `--cfg loom --features loom`.
//! As in tokio, std types are given loom's API (`UnsafeCell::with_mut`, a
//! non-poisoning `lock()`), never the other way round.
//!
//! Two primitives need more than a rename under loom:
//! - [`PerThread`] is the `thread_local` crate's `ThreadLocal` in normal
//!   builds. Loom runs its model threads on one OS thread, where every model
//!   thread would share one entry, so the loom build keys entries by loom's
//!   own thread id instead.
//! - [`Lanes`], the cleaner's two-lane work queue, is a pair of
//!   crossbeam channels in normal builds. Crossbeam is invisible to loom, so
//!   the loom build is a `Mutex<[VecDeque; 2]>` plus a `Condvar` with the same
//!   semantics: unbounded, multi-producer multi-consumer, never disconnected,
//!   and a receiver prefers the recycle lane.
//!
//! [loom]: https://docs.rs/loom

pub(crate) use imp::*;

/// Which of the cleaner's two queues a job travels on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Buffers that are already registered (or need no registration), and
    /// chunks of them: microseconds of work each, always served first.
    Recycle,
    /// First-time registrations of pool-miss buffers: milliseconds each.
    Register,
}

#[cfg(not(all(loom, feature = "loom")))]
mod imp {
    use std::time::Duration;

    pub(crate) use std::sync::atomic::{
        fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
    };
    pub(crate) use std::sync::Arc;
    pub(crate) use std::thread::{self, JoinHandle};

    use super::Lane;

    /// A number identifying the calling thread among live threads: the
    /// address of a thread-local (0 during thread-local teardown).
    #[inline]
    pub(crate) fn thread_key() -> usize {
        thread_local!(static KEY: u8 = const { 0 });
        KEY.try_with(|k| k as *const u8 as usize).unwrap_or(0)
    }

    /// Sleeps the calling thread.
    pub(crate) fn sleep(duration: Duration) {
        thread::sleep(duration);
    }

    /// A mutex whose `lock` ignores poisoning: every structure it guards is
    /// left consistent between statements, so a panic elsewhere never leaves
    /// it half-updated.
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(std::sync::Mutex<T>);

    /// The guard of a [`Mutex`].
    pub(crate) type MutexGuard<'a, T> = std::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(std::sync::Mutex::new(value))
        }

        #[inline]
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// The value, through exclusive access: no locking.
        #[inline]
        pub(crate) fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().unwrap_or_else(|e| e.into_inner())
        }

        #[inline]
        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            match self.0.try_lock() {
                Ok(guard) => Some(guard),
                Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            }
        }
    }

    /// A condition variable whose `wait` ignores poisoning, like [`Mutex`].
    #[derive(Debug, Default)]
    pub(crate) struct Condvar(std::sync::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Self(std::sync::Condvar::new())
        }

        pub(crate) fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(guard).unwrap_or_else(|e| e.into_inner())
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    /// `std::cell::UnsafeCell` with loom's closure-based API.
    #[derive(Debug)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(std::cell::UnsafeCell::new(value))
        }

        #[inline]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }

    /// A value per thread, reachable from every thread (for eviction, `clear`
    /// and steals on a miss), never dropped before the map itself.
    pub(crate) struct PerThread<T: Send>(thread_local::ThreadLocal<T>);

    impl<T: Send> PerThread<T> {
        pub(crate) fn new() -> Self {
            Self(thread_local::ThreadLocal::new())
        }

        /// The calling thread's value, created by `create` on first use.
        #[inline]
        pub(crate) fn get_or(&self, create: impl FnOnce() -> T) -> &T {
            self.0.get_or(create)
        }

        /// Every thread's value, including those of threads that have exited.
        pub(crate) fn iter(&self) -> impl Iterator<Item = &T>
        where
            T: Sync,
        {
            self.0.iter()
        }
    }

    impl<T: Send> std::fmt::Debug for PerThread<T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("PerThread")
        }
    }

    /// Stands for a buffer's bytes in loom models, where every access is
    /// reported to loom's race detector; in normal builds it is nothing.
    #[derive(Debug, Clone)]
    pub(crate) struct Contents;

    impl Contents {
        #[inline(always)]
        pub(crate) fn new(_parts: usize) -> Self {
            Self
        }

        #[inline(always)]
        pub(crate) fn read(&self) {}

        #[inline(always)]
        pub(crate) fn write(&self) {}

        #[inline(always)]
        pub(crate) fn write_part(&self, _part: usize) {}
    }

    /// The cleaner's work queue: two unbounded crossbeam channels.
    ///
    /// The queue owns both ends of each channel, so it never disconnects;
    /// workers are stopped with an explicit message instead.
    pub(crate) struct Lanes<T> {
        recycle: (crossbeam_channel::Sender<T>, crossbeam_channel::Receiver<T>),
        register: (crossbeam_channel::Sender<T>, crossbeam_channel::Receiver<T>),
    }

    impl<T> Lanes<T> {
        pub(crate) fn new() -> Self {
            Self {
                recycle: crossbeam_channel::unbounded(),
                register: crossbeam_channel::unbounded(),
            }
        }

        /// Queues `item`; never blocks.
        #[inline]
        pub(crate) fn push(&self, lane: Lane, item: T) {
            let tx = match lane {
                Lane::Recycle => &self.recycle.0,
                Lane::Register => &self.register.0,
            };
            // The receiver lives as long as `self`, so sending cannot fail.
            let _ = tx.send(item);
        }

        /// Takes the next item, preferring the recycle lane; reads the
        /// register lane only if `register` is set. Waits at most `timeout`
        /// (forever if `None`) and returns `None` when it runs out.
        pub(crate) fn pop(&self, register: bool, timeout: Option<Duration>) -> Option<T> {
            if let Ok(item) = self.recycle.1.try_recv() {
                return Some(item);
            }
            if !register {
                return match timeout {
                    None => self.recycle.1.recv().ok(),
                    Some(t) => self.recycle.1.recv_timeout(t).ok(),
                };
            }
            if let Ok(item) = self.register.1.try_recv() {
                return Some(item);
            }
            let (recycle, register) = (&self.recycle.1, &self.register.1);
            match timeout {
                None => crossbeam_channel::select_biased! {
                    recv(recycle) -> item => item.ok(),
                    recv(register) -> item => item.ok(),
                },
                Some(t) => crossbeam_channel::select_biased! {
                    recv(recycle) -> item => item.ok(),
                    recv(register) -> item => item.ok(),
                    default(t) => None,
                },
            }
        }

        /// Takes any queued item without waiting.
        pub(crate) fn try_pop(&self) -> Option<T> {
            self.recycle
                .1
                .try_recv()
                .or_else(|_| self.register.1.try_recv())
                .ok()
        }

        /// Items queued on both lanes together.
        pub(crate) fn len(&self) -> usize {
            self.recycle.1.len() + self.register.1.len()
        }
    }
}

#[cfg(all(loom, feature = "loom"))]
mod imp {
    use std::collections::VecDeque;
    use std::time::Duration;

    pub(crate) use loom::cell::UnsafeCell;
    pub(crate) use loom::sync::atomic::{
        fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
    };
    pub(crate) use loom::sync::Arc;
    pub(crate) use loom::thread::{self, JoinHandle};

    use super::Lane;

    /// A number identifying the calling loom thread.
    pub(crate) fn thread_key() -> usize {
        loom::thread_local!(static KEY: u8 = 0);
        KEY.with(|k| k as *const u8 as usize)
    }

    /// Under loom a sleep is a yield.
    pub(crate) fn sleep(_duration: Duration) {
        thread::yield_now();
    }

    /// loom's mutex with a non-poisoning `lock`.
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    /// The guard of a [`Mutex`].
    pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }

        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.0.try_lock().ok()
        }

        pub(crate) fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().unwrap_or_else(|e| e.into_inner())
        }
    }

    impl<T: Default> Default for Mutex<T> {
        fn default() -> Self {
            Self::new(T::default())
        }
    }

    /// loom's condition variable with a non-poisoning `wait`.
    #[derive(Debug)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Self(loom::sync::Condvar::new())
        }

        pub(crate) fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(guard).unwrap_or_else(|e| e.into_inner())
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    /// Entries keyed by loom thread id: loom runs every model thread on one
    /// OS thread, so a std thread-local would be shared by all of them.
    /// Entries are boxed and never removed, so references stay valid for
    /// the life of the map.
    pub(crate) struct PerThread<T: Send> {
        entries: Mutex<Vec<(loom::thread::ThreadId, Box<T>)>>,
    }

    impl<T: Send> PerThread<T> {
        pub(crate) fn new() -> Self {
            Self {
                entries: Mutex::new(Vec::new()),
            }
        }

        pub(crate) fn get_or(&self, create: impl FnOnce() -> T) -> &T {
            let id = loom::thread::current().id();
            let mut entries = self.entries.lock();
            let ptr: *const T = match entries.iter().find(|(owner, _)| *owner == id) {
                Some((_, value)) => &**value,
                None => {
                    entries.push((id, Box::new(create())));
                    &*entries.last().expect("just pushed").1
                }
            };
            // SAFETY:
            // - the box is never removed or replaced while `self` lives, so its
            //   heap address outlives the returned borrow of `self`;
            // - only shared references to the value are ever handed out.
            unsafe { &*ptr }
        }

        pub(crate) fn iter(&self) -> impl Iterator<Item = &T>
        where
            T: Sync,
        {
            let entries = self.entries.lock();
            let ptrs: Vec<*const T> = entries.iter().map(|(_, v)| &**v as *const T).collect();
            drop(entries);
            // SAFETY: as in `get_or`: boxes live, unmoved, as long as `self`.
            ptrs.into_iter().map(|p| unsafe { &*p })
        }
    }

    impl<T: Send> std::fmt::Debug for PerThread<T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("PerThread")
        }
    }

    /// Stands for a buffer's bytes, one cell per cleaning chunk: each read
    /// and write is reported to loom, so a buffer handed out while a worker
    /// still writes it (or a chunk written by two threads at once) fails the
    /// model as a data race.
    #[derive(Debug, Clone)]
    pub(crate) struct Contents(Arc<Vec<loom::cell::UnsafeCell<()>>>);

    // SAFETY: the cell holds no data; it exists so that loom checks every
    // access from every thread, which is the point of sharing it.
    unsafe impl Send for Contents {}
    // SAFETY: as above.
    unsafe impl Sync for Contents {}

    impl Contents {
        pub(crate) fn new(parts: usize) -> Self {
            Self(Arc::new(
                (0..parts.max(1))
                    .map(|_| loom::cell::UnsafeCell::new(()))
                    .collect(),
            ))
        }

        pub(crate) fn read(&self) {
            self.0.iter().for_each(|part| part.with(|_| ()));
        }

        pub(crate) fn write(&self) {
            self.0.iter().for_each(|part| part.with_mut(|_| ()));
        }

        /// Chunks past the class size (pre-faulting the rest of a page
        /// before a registration) share the last cell.
        pub(crate) fn write_part(&self, part: usize) {
            self.0[part.min(self.0.len() - 1)].with_mut(|_| ());
        }
    }

    /// The loom stand-in for the crossbeam lanes: same semantics, visible to
    /// loom's scheduler.
    pub(crate) struct Lanes<T> {
        queues: Mutex<[VecDeque<T>; 2]>,
        ready: Condvar,
    }

    impl<T> Lanes<T> {
        pub(crate) fn new() -> Self {
            Self {
                queues: Mutex::new([VecDeque::new(), VecDeque::new()]),
                ready: Condvar::new(),
            }
        }

        pub(crate) fn push(&self, lane: Lane, item: T) {
            self.queues.lock()[lane as usize].push_back(item);
            self.ready.notify_all();
        }

        pub(crate) fn pop(&self, register: bool, timeout: Option<Duration>) -> Option<T> {
            let mut queues = self.queues.lock();
            loop {
                if let Some(item) = queues[0].pop_front() {
                    return Some(item);
                }
                if register {
                    if let Some(item) = queues[1].pop_front() {
                        return Some(item);
                    }
                }
                match timeout {
                    None => queues = self.ready.wait(queues),
                    Some(_) => {
                        drop(queues);
                        thread::yield_now();
                        return None;
                    }
                }
            }
        }

        pub(crate) fn try_pop(&self) -> Option<T> {
            let mut queues = self.queues.lock();
            queues[0].pop_front().or_else(|| queues[1].pop_front())
        }

        pub(crate) fn len(&self) -> usize {
            let queues = self.queues.lock();
            queues[0].len() + queues[1].len()
        }
    }
}

impl<T> std::fmt::Debug for Lanes<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lanes")
            .field("queued", &self.len())
            .finish()
    }
}
