//! Fences: what a buffer's copies leave behind for the cleaner to wait on.
//!
//! A [`Fence`] marks the point on a stream after which a buffer is no longer
//! read (or written): a CUDA event recorded after the last copy, by the
//! buffer's `record_last_use` or by a copy made through cudarc. Waiting needs no current context: events are queried
//! and synchronized through the driver directly, never through cudarc's
//! methods, which bind the event's context to the calling thread and can
//! report an unrelated error stored on it.
//!
//! Events are reused, never created or destroyed in the steady state: each
//! buffer keeps its completed events as spares for its next trip, and its
//! pool's [`EventPool`] (held by the pool's caches) holds the rest, so a
//! pool's spare events, and the contexts they keep, go with the pool. An
//! event is dropped (destroyed) only with the current context put back
//! afterwards, so no pool call changes the caller's context.

use std::sync::Arc as StdArc;

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream, DriverError};

use crate::backend::cuda::Bound;
use crate::error::Error;
use crate::sync::Mutex;

/// A reusable CUDA event of one context.
#[derive(Debug)]
pub(crate) struct Event {
    raw: std::mem::ManuallyDrop<CudaEvent>,
}

impl Event {
    /// A new event of `ctx` (without timing), leaving the calling thread's
    /// current context as it was.
    fn create(ctx: &StdArc<CudaContext>) -> Result<Self, Error> {
        let _bound = Bound::restoring()?;
        let raw = ctx
            .new_event(None)
            .map_err(|source| Error::cuda("cuEventCreate", source))?;
        Ok(Self {
            raw: std::mem::ManuallyDrop::new(raw),
        })
    }

    /// The context the event belongs to.
    pub(crate) fn context(&self) -> sys::CUcontext {
        self.raw.context().cu_ctx()
    }

    /// cudarc's handle, for `SyncOnDrop::Record`.
    pub(crate) fn cudarc(&self) -> &CudaEvent {
        &self.raw
    }

    /// Records the event after the work queued on `stream` so far, with the
    /// event's context bound for the call and the caller's put back.
    ///
    /// # Safety
    /// `stream` is a live stream of the event's context.
    pub(crate) unsafe fn record(&self, stream: sys::CUstream) -> Result<(), Error> {
        let _bound = Bound::to(self.context())?;
        // SAFETY: a live event and, by the caller, a live stream of its context.
        unsafe { result::event::record(self.raw.cu_event(), stream) }
            .map_err(|source| Error::cuda("cuEventRecord", source))
    }

    /// Whether the work before the event has finished, without waiting.
    pub(crate) fn is_done(&self) -> Result<bool, Error> {
        // SAFETY: a live event; querying needs no current context.
        match unsafe { result::event::query(self.raw.cu_event()) } {
            Ok(()) => Ok(true),
            Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
            Err(source) => Err(Error::cuda("cuEventQuery", source)),
        }
    }

    /// Waits for the work before the event.
    pub(crate) fn wait(&self) -> Result<(), Error> {
        // SAFETY: a live event; waiting needs no current context.
        unsafe { result::event::synchronize(self.raw.cu_event()) }
            .map_err(|source| Error::cuda("cuEventSynchronize", source))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        #[cfg(feature = "testing")]
        testing::note(|calls| calls.destroyed += 1);
        // cudarc's drop binds the event's context; put the caller's back.
        let bound = Bound::restoring();
        // SAFETY: taken once, here.
        drop(unsafe { std::mem::ManuallyDrop::take(&mut self.raw) });
        drop(bound);
    }
}

/// A pool's spare events, of whichever contexts its buffers' copies ran
/// in. Events stay boxed everywhere, so one moves between a buffer's copies
/// (where its address must stay fixed) and the spares without a new
/// allocation. Each spare keeps its context retained (cudarc's event holds
/// it), so the spares go with their pool (before its backend, whose drop
/// releases the pool's own references to the contexts).
#[derive(Debug)]
#[allow(clippy::vec_box)] // see above
pub(crate) struct EventPool {
    spares: Mutex<Vec<Box<Event>>>,
}

impl Default for EventPool {
    fn default() -> Self {
        Self {
            spares: Mutex::new(Vec::new()),
        }
    }
}

/// At most this many spare events are kept per pool.
const POOL_LIMIT: usize = 4096;

impl EventPool {
    /// A spare event of `ctx`, or a new one.
    pub(crate) fn take(&self, ctx: &StdArc<CudaContext>) -> Result<Box<Event>, Error> {
        let cu = ctx.cu_ctx();
        {
            #[cfg(feature = "testing")]
            testing::note(|calls| calls.pool_locks += 1);
            let mut spares = self.spares.lock();
            if let Some(i) = spares.iter().rposition(|e| e.context() == cu) {
                return Ok(spares.swap_remove(i));
            }
        }
        Event::create(ctx).map(Box::new)
    }

    /// Keeps completed events for reuse.
    pub(crate) fn give(&self, events: impl IntoIterator<Item = Box<Event>>) {
        #[cfg(feature = "testing")]
        testing::note(|calls| calls.pool_locks += 1);
        let mut spares = self.spares.lock();
        for event in events {
            if spares.len() < POOL_LIMIT {
                spares.push(event);
            }
        }
    }
}

/// What the cleaner waits on before reusing a buffer.
#[derive(Debug)]
pub(crate) enum Fence {
    /// An event recorded after the last copy on its stream.
    Event(Box<Event>),
    /// A copy made through cudarc while its context's event tracking was
    /// switched off part-way: whether its event was recorded is unknown,
    /// so the whole context is synchronized.
    Context(StdArc<CudaContext>),
    /// Flags set by a test when the "copy" is done or has failed (loom
    /// models and the `testing` feature).
    #[cfg(feature = "testing")]
    Flag(testing::Recorded),
}

impl Fence {
    /// Whether the copy has finished, without waiting (a `Context` fence
    /// synchronizes its context: there is nothing to poll).
    fn is_done(&self) -> Result<bool, Error> {
        match self {
            Fence::Event(event) => event.is_done(),
            Fence::Context(ctx) => {
                let _bound = Bound::to(ctx.cu_ctx())?;
                result::ctx::synchronize()
                    .map_err(|source| Error::cuda("cuCtxSynchronize", source))?;
                Ok(true)
            }
            #[cfg(feature = "testing")]
            Fence::Flag(flag) => flag.0.state(),
        }
    }
}

/// A buffer's fences and spare events (boxed: see [`EventPool`]).
#[derive(Debug, Default)]
#[allow(clippy::vec_box)] // see `EventPool`
#[repr(C)] // the lists a take and a drop read first, the spares last (see `Meta`)
pub(crate) struct Fences {
    /// Fences still to wait on before reuse.
    pending: Vec<Fence>,
    /// Events of copies made through cudarc since the last host write
    /// access: host access waits for these. Boxed, so that a borrow handed to
    /// cudarc stays valid while the list grows.
    copies: Vec<Box<Event>>,
    /// Completed events kept for the next trip.
    spares: Vec<Box<Event>>,
}

impl Fences {
    /// Whether nothing is left to wait on.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.copies.is_empty()
    }

    /// Whether nothing is held at all: no fence, no spare event.
    pub(crate) fn is_bare(&self) -> bool {
        self.is_empty() && self.spares.is_empty()
    }

    /// Adds a fence to wait on.
    pub(crate) fn push(&mut self, fence: Fence) {
        self.pending.push(fence);
    }

    /// A spare event of `ctx`, or one from the pool.
    pub(crate) fn event(
        &mut self,
        ctx: &StdArc<CudaContext>,
        pool: &EventPool,
    ) -> Result<Box<Event>, Error> {
        let cu = ctx.cu_ctx();
        match self.spares.iter().rposition(|e| e.context() == cu) {
            Some(i) => Ok(self.spares.swap_remove(i)),
            None => pool.take(ctx),
        }
    }

    /// Keeps an event that could not be used as a spare.
    pub(crate) fn spare(&mut self, event: Box<Event>) {
        self.spares.push(event);
    }

    /// Adds the event of a copy made through cudarc, returning the borrow
    /// cudarc records it through.
    pub(crate) fn push_copy(&mut self, event: Box<Event>) -> &CudaEvent {
        self.copies.push(event);
        let event: &Event = self.copies.last().expect("just pushed");
        event.cudarc()
    }

    /// Whether copies made through cudarc wait for host access.
    pub(crate) fn has_copies(&self) -> bool {
        !self.copies.is_empty()
    }

    /// The raw events of the copies made through cudarc.
    pub(crate) fn copy_events(&self) -> impl Iterator<Item = sys::CUevent> + '_ {
        self.copies.iter().map(|e| e.cudarc().cu_event())
    }

    /// Waits for the copies made through cudarc (host access).
    pub(crate) fn wait_copies(&self) -> Result<(), Error> {
        self.copies.iter().try_for_each(|e| e.wait())
    }

    /// After [`wait_copies`](Self::wait_copies) returned: the events of
    /// copies whose context tracks events become spares (those of a
    /// context that stopped tracking stay, for [`seal`](Self::seal)).
    pub(crate) fn retire_copies(&mut self) {
        let (tracked, untracked): (Vec<_>, Vec<_>) = std::mem::take(&mut self.copies)
            .into_iter()
            .partition(|e| e.cudarc().context().is_event_tracking());
        self.spares.extend(tracked);
        self.copies = untracked;
    }

    /// Moves the copies made through cudarc to the fences the cleaner waits
    /// on. If their context's event tracking is off now, cudarc may have
    /// skipped recording them (it checks again when the copy is enqueued),
    /// so the context is synchronized instead.
    pub(crate) fn seal(&mut self) {
        for event in std::mem::take(&mut self.copies) {
            let ctx = event.cudarc().context();
            if ctx.is_event_tracking() {
                self.pending.push(Fence::Event(event));
            } else {
                self.pending.push(Fence::Context(ctx.clone()));
                self.spares.push(event);
            }
        }
    }

    /// Whether every fence has completed, without waiting; completed events
    /// become spares. An error means a fence failed: whether its copy has
    /// finished is unknown.
    #[inline]
    pub(crate) fn poll(&mut self) -> Result<bool, Error> {
        if self.pending.is_empty() {
            return Ok(true);
        }
        self.poll_pending()
    }

    fn poll_pending(&mut self) -> Result<bool, Error> {
        let mut i = 0;
        while i < self.pending.len() {
            if self.pending[i].is_done()? {
                self.retire(i);
            } else {
                i += 1;
            }
        }
        Ok(self.pending.is_empty())
    }

    fn retire(&mut self, i: usize) {
        if let Fence::Event(event) = self.pending.swap_remove(i) {
            self.spares.push(event);
        }
    }

    /// Gives the spare events back to `pool` (the buffer is being freed).
    pub(crate) fn release(&mut self, pool: &EventPool) {
        if !self.spares.is_empty() {
            pool.give(self.spares.drain(..));
        }
    }

    /// Drops the fences of a buffer that is being leaked (its copies are
    /// not known to have finished), or freed where its pool's spares are
    /// out of reach; their events are destroyed, not reused (the driver
    /// releases an event still pending once it completes).
    pub(crate) fn abandon(&mut self) {
        self.pending.clear();
        self.copies.clear();
        self.spares.clear();
    }
}

/// The context of `stream`, and whether copies on it must be synchronized
/// rather than recorded: on the legacy default stream (a null handle) or
/// when cudarc does not manage events for the context, cudarc would not
/// record an event, so the copy is made synchronous instead.
pub(crate) fn must_sync(stream: &CudaStream) -> bool {
    stream.cu_stream().is_null() || !stream.context().is_managing_stream_synchronization()
}

/// A stand-in for the event after a copy still reading a buffer: it
/// completes, or fails, when the test says so (loom models and the
/// `testing` feature).
///
/// # Examples
///
/// ```
/// use pinpool::testing::TestFence;
///
/// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
/// let mut buf = pool.take(4096);
/// let fence = TestFence::default();
/// fence.record(&mut buf);
/// drop(buf);
/// fence.complete(); // until now the cleaner kept the buffer back
/// pool.flush();
/// assert_eq!(pool.stats().pooled_buffers, 1);
/// # Ok::<(), pinpool::Error>(())
/// ```
#[cfg(feature = "testing")]
#[derive(Debug, Clone)]
pub struct TestFence {
    done: crate::sync::Arc<crate::sync::AtomicBool>,
    failed: crate::sync::Arc<crate::sync::AtomicBool>,
}

#[cfg(feature = "testing")]
impl Default for TestFence {
    fn default() -> Self {
        Self {
            done: crate::sync::Arc::new(crate::sync::AtomicBool::new(false)),
            failed: crate::sync::Arc::new(crate::sync::AtomicBool::new(false)),
        }
    }
}

// `TestFence::record` is written in `buffer`: fences know nothing of buffers.
#[cfg(feature = "testing")]
impl TestFence {
    /// The fence a buffer waits on for this stand-in.
    pub(crate) fn to_fence(&self) -> Fence {
        Fence::Flag(testing::Recorded(self.clone()))
    }

    /// The "copy" finished.
    pub fn complete(&self) {
        // Release pairs with the Acquire load in `state`: what the "copy"
        // did happens before the buffer is reused.
        self.done.store(true, crate::sync::Ordering::Release);
    }

    /// Waiting for the "copy" fails, as a failed event query would.
    pub fn fail(&self) {
        // Release: as in `complete`.
        self.failed.store(true, crate::sync::Ordering::Release);
    }

    /// Whether it completed; an error once it failed.
    fn state(&self) -> Result<bool, Error> {
        use crate::sync::Ordering::Acquire;
        if self.failed.load(Acquire) {
            return Err(Error::cuda(
                "cuEventQuery (injected)",
                DriverError(sys::CUresult::CUDA_ERROR_UNKNOWN),
            ));
        }
        Ok(self.done.load(Acquire))
    }
}

/// What the `testing` feature records of fences: which threads destroy
/// them and take the event pool's lock, so that tests can show that no
/// drop does either.
#[cfg(feature = "testing")]
pub(crate) mod testing {
    use std::collections::HashMap;
    use std::thread::ThreadId;

    use super::TestFence;
    use crate::sync::StaticMutex;

    /// What one thread did to fences and events.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinpool::testing::{fence_calls_on, FenceCalls, TestFence};
    ///
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// let mut buf = pool.take(1 << 20);
    /// TestFence::default().record(&mut buf);
    /// std::thread::spawn(move || drop(buf)).join().unwrap();
    /// assert_eq!(fence_calls_on(std::thread::current().id()), FenceCalls::default());
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    #[non_exhaustive]
    pub struct FenceCalls {
        /// Fences destroyed: CUDA events (each a `cuEventDestroy`), and
        /// [`TestFence`]s a buffer let go of (their stand-in).
        pub destroyed: usize,
        /// Times a pool's spare events were locked.
        pub pool_locks: usize,
    }

    static CALLS: StaticMutex<Option<HashMap<ThreadId, FenceCalls>>> = StaticMutex::new(None);

    /// Records something the calling thread did.
    pub(crate) fn note(what: impl FnOnce(&mut FenceCalls)) {
        let mut calls = CALLS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let calls = calls.get_or_insert_with(HashMap::new);
        what(calls.entry(std::thread::current().id()).or_default());
    }

    /// What `thread` has done to fences and events so far, in any pool.
    pub fn fence_calls_on(thread: ThreadId) -> FenceCalls {
        let calls = CALLS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        calls
            .as_ref()
            .and_then(|calls| calls.get(&thread).copied())
            .unwrap_or_default()
    }

    /// A [`TestFence`] as a buffer holds it: its drop is the stand-in for
    /// destroying an event.
    #[derive(Debug)]
    pub(crate) struct Recorded(pub(crate) TestFence);

    impl Drop for Recorded {
        fn drop(&mut self) {
            note(|calls| calls.destroyed += 1);
        }
    }
}
