//! The cleaner: a pool of workers that turns dropped buffers into ready ones.
//!
//! ```text
//!  PinnedBuffer::drop ─▶ owner cache's dirty list ─(drain token, one per cache)─▶ recycle lane ──┐
//!                    └─▶ pool-miss buffer (bounded backlog) ─────────────────▶ register lane ──┤
//!                     ┌──────────────────────────────────────────────────────────────────────┘
//!                     ▼
//!   worker: fences done? ── no ──▶ parked (re-polled; one slow event holds up nothing else)
//!             │ yes (no events: one device synchronize covers a whole burst)
//!             ▼
//!   zero the dirty prefix, pre-fault the rest if it will be registered
//!   (split in CHUNK-sized jobs that any worker runs when large)
//!             ▼
//!   register once (first cycle only) ─▶ admit under the cap ─▶ owner's thread cache or shard
//! ```
//!
//! A drop only appends to a list and, at most once per batch, pushes a token
//! onto a channel: it never blocks and never calls CUDA. Small buffers
//! dropped by their owner's thread are deferred (see `thread_cache`) and
//! swept 200 us later at the latest. Worker 0 serves only the recycle lane
//! (when there are two or more workers), so a burst of first-time
//! registrations can never starve the recycling of buffers already pinned.
//!
//! `flush` is a barrier built from two in-flight counters per thread cache,
//! selected by the parity of a flush epoch: a drop counts itself in the
//! current parity, `flush` flips the epoch and waits for the old parity to
//! drain in every cache. Drops that race the flip may land in either
//! parity; drops that happened before the call always land in the old one.

use std::time::{Duration, Instant};

use crate::alloc::{self, Block};
use crate::backend::{Backend, Fence};
use crate::pool::Shared;
use crate::size_class::{CHUNK, PAGE};
use crate::stats::Counters;
use crate::sync::{
    fence, Arc, AtomicBool, AtomicUsize, Condvar, Contents, Lane, Lanes, Mutex, Ordering,
};
use crate::thread_cache::{Dirty, Push, ThreadCache};

/// How long a sweep waits before queueing drain tokens for deferred
/// buffers, so that a thread in a tight take/drop loop cleans its own.
const SWEEP_DELAY: Duration = Duration::from_micros(200);

/// How long an idle worker waits before re-polling parked buffers.
const POLL: Duration = Duration::from_micros(100);

/// What the cleaner receives.
pub(crate) enum Job {
    /// A cache's dirty list has buffers to clean: take them all.
    Drain(Arc<ThreadCache>),
    /// A dropped buffer that needs its first registration.
    Returned(Returned),
    /// A dropped miss buffer to free unregistered (registrations are
    /// backed up).
    Release(Returned),
    /// Wait a moment, then queue drain tokens for deferred buffers.
    Sweep,
    /// Chunk `index` of a large buffer's zeroing / pre-faulting.
    Chunk(Arc<Chunked>, usize),
    /// Tells one worker to exit.
    Stop,
}

/// The part of a pool that dropped buffers need: it outlives the pool while
/// buffers are out, so late drops still find a way home (or to the OS).
pub(crate) struct Inbox {
    pub(crate) lanes: Lanes<Job>,
    /// Flush epoch; its parity selects the in-flight counter a drop uses.
    pub(crate) epoch: AtomicUsize,
    /// Whether workers are running. Cleared (then a SeqCst fence) before
    /// they are stopped; read after a SeqCst fence that follows each push.
    pub(crate) running: AtomicBool,
    /// Set once the last `Pool` handle is gone: no worker starts again.
    pub(crate) closed: AtomicBool,
    /// Whether a sweep is queued (see `thread_cache`).
    sweep_pending: AtomicBool,
    /// Registration jobs queued or running, and the most allowed.
    register_queued: AtomicUsize,
    register_backlog: usize,
    pub(crate) backend: Arc<Box<dyn Backend>>,
    pub(crate) counters: Counters,
    /// The pool, to restart its workers after a shutdown; `None` once closed.
    pub(crate) pool: Mutex<Option<Arc<Shared>>>,
    /// How many threads are in `flush`, guarded by the mutex the condition
    /// variable uses.
    flush_waiters: Mutex<usize>,
    /// The same count, readable without the lock (see `notify_flush`).
    flushing: AtomicUsize,
    flush_done: Condvar,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("lanes", &self.lanes)
            .field("running", &self.running.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

// === impl Inbox ===

impl Inbox {
    pub(crate) fn new(backend: Arc<Box<dyn Backend>>, register_backlog: usize) -> Self {
        Self {
            lanes: Lanes::new(),
            epoch: AtomicUsize::new(0),
            running: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            sweep_pending: AtomicBool::new(false),
            register_queued: AtomicUsize::new(0),
            register_backlog,
            backend,
            counters: Counters::new(),
            pool: Mutex::new(None),
            flush_waiters: Mutex::new(0),
            flushing: AtomicUsize::new(0),
            flush_done: Condvar::new(),
        }
    }

    /// Wakes `flush` callers after an in-flight counter dropped to zero.
    ///
    /// The caller's decrement, this SeqCst fence and the load of `flushing`
    /// pair with `flush`'s increment of `flushing`, its SeqCst fence and its
    /// check of the counters: either this load sees the flush (and takes the
    /// lock the flush checks under before notifying, so the wake-up cannot
    /// fall between its check and its wait), or the flush's check sees the
    /// decrement. With no flush in progress this costs no shared write.
    fn notify_flush(&self) {
        fence(Ordering::SeqCst);
        if self.flushing.load(Ordering::Relaxed) > 0 && *self.flush_waiters.lock() > 0 {
            self.flush_done.notify_all();
        }
    }

    /// Hands a dropped buffer to the cleaner. Never blocks, never calls
    /// CUDA, except on the cold path where no worker is running.
    #[inline]
    pub(crate) fn submit(home: &Arc<ThreadCache>, block: Block, dirty: usize, fences: Vec<Fence>) {
        let inbox = &home.inbox;
        // Relaxed: a drop that happens before a `flush` call cannot read
        // that flush's increment (it happens after), so it reads the parity
        // the flush will wait on; a racing drop may read either parity.
        let epoch = inbox.epoch.load(Ordering::Relaxed) & 1;
        // Relaxed: ordered before `flush`'s read by the happens-before
        // relation the caller established between its drop and its flush.
        home.inflight[epoch].fetch_add(1, Ordering::Relaxed);
        let entry = Dirty {
            block,
            dirty,
            fences,
            epoch,
            dropped_at: Instant::now(),
        };
        if entry.block.is_pinned() || !inbox.backend.pins() {
            // A small buffer dropped by its owner's thread waits for the
            // owner or the next sweep; anything else wakes a worker.
            let urgent =
                !(entry.deferrable() && home.is_owner() && inbox.running.load(Ordering::Relaxed));
            match home.push_dirty(entry, urgent) {
                // A drain token is queued; it will take this buffer too.
                Push::Queued => return,
                Push::Token => inbox
                    .lanes
                    .push(Lane::Recycle, Job::Drain(Arc::clone(home))),
                Push::Deferred => {
                    // Relaxed: a hint. A sweep clears it before it locks each
                    // cache, so a drop that reads it still set has appended
                    // under that same lock before the sweep looks.
                    if inbox.sweep_pending.load(Ordering::Relaxed)
                        || inbox.sweep_pending.swap(true, Ordering::Relaxed)
                    {
                        return;
                    }
                    inbox.lanes.push(Lane::Recycle, Job::Sweep);
                }
            }
        } else {
            let returned = Returned::new(entry, Arc::clone(home));
            // Relaxed: a bound on a queue length, publishing nothing.
            if inbox.register_queued.load(Ordering::Relaxed) >= inbox.register_backlog {
                // Registrations are backed up: free this miss buffer rather
                // than let misses breed an ever longer queue.
                inbox.lanes.push(Lane::Recycle, Job::Release(returned));
            } else {
                inbox.register_queued.fetch_add(1, Ordering::Relaxed);
                inbox.lanes.push(Lane::Register, Job::Returned(returned));
            }
        }
        // SeqCst fence pairs with the one in `Shared::stop_cleaner`: either
        // this load sees `running == false` and wakes the pool, or the
        // shutdown's drain, which follows its fence, sees this push.
        fence(Ordering::SeqCst);
        if !inbox.running.load(Ordering::Relaxed) {
            inbox.wake();
        }
    }

    /// Marks a buffer counted in flush parity `epoch` as done.
    pub(crate) fn complete(&self, home: &ThreadCache, epoch: usize) {
        // Release publishes everything done to the buffer (pooled or freed)
        // to the `flush` whose Acquire load sees the count drop.
        if home.inflight[epoch].fetch_sub(1, Ordering::Release) == 1 {
            self.notify_flush();
        }
    }

    /// No worker is running: restart them, or, if the pool is gone, release
    /// whatever is queued right here.
    #[cold]
    fn wake(&self) {
        let pool = self.pool.lock().clone();
        match pool {
            Some(shared) => Shared::start_cleaner(&shared),
            None => self.release_queued(),
        }
    }

    /// Releases every queued buffer on the calling thread.
    pub(crate) fn release_queued(&self) {
        while let Some(job) = self.lanes.try_pop() {
            match job {
                Job::Drain(cache) => {
                    for dirty in cache.take_dirty() {
                        drop(Returned::new(dirty, Arc::clone(&cache)));
                    }
                }
                Job::Returned(returned) => {
                    self.register_queued.fetch_sub(1, Ordering::Relaxed);
                    drop(returned);
                }
                _ => {}
            }
        }
    }

    /// Unregisters (if pinned) and frees `block`.
    pub(crate) fn release(&self, mut block: Block) {
        if block.is_pinned() {
            // SAFETY: the block was registered by this backend, and every
            // caller has waited for (or given up on) the copies reading it.
            match unsafe { self.backend.unregister(block.device(), block.as_ptr()) } {
                Ok(()) => {
                    block.set_pinned(false);
                    Counters::add(&self.counters.unregistered_bytes, block.footprint() as u64);
                }
                Err(e) => {
                    Counters::add(&self.counters.unregister_failures, 1);
                    tracing::error!(error = %e, bytes = block.footprint(), "unregistering failed; leaking the buffer");
                }
            }
        }
        Counters::add(&self.counters.released, 1);
        drop(block);
    }
}

// === impl Returned ===

/// A dropped buffer on its way back. Dropping it without taking `block`
/// releases the block (after waiting for its copies), so a buffer is never
/// lost, even if a worker panics; either way it leaves the in-flight count.
pub(crate) struct Returned {
    block: Option<Block>,
    dirty: usize,
    fences: Vec<Fence>,
    home: Arc<ThreadCache>,
    epoch: usize,
    dropped_at: Instant,
}

impl Returned {
    pub(crate) fn new(dirty: Dirty, home: Arc<ThreadCache>) -> Self {
        Self {
            block: Some(dirty.block),
            dirty: dirty.dirty,
            fences: dirty.fences,
            home,
            epoch: dirty.epoch,
            dropped_at: dirty.dropped_at,
        }
    }

    fn block(&self) -> &Block {
        self.block
            .as_ref()
            .expect("a returned buffer holds its block until admitted")
    }

    /// Whether the recorded events have completed, without blocking.
    fn fences_done(&self) -> Result<bool, crate::Error> {
        for fence in &self.fences {
            if !fence.is_done()? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

impl Drop for Returned {
    fn drop(&mut self) {
        let inbox = &self.home.inbox;
        if let Some(block) = self.block.take() {
            let drained = if self.fences.is_empty() {
                !block.is_pinned() || inbox.backend.synchronize(block.device()).is_ok()
            } else {
                self.fences.iter().all(|f| f.wait().is_ok())
            };
            if !drained {
                tracing::warn!("could not wait for the copies reading a released buffer");
            }
            inbox.release(block);
        }
        inbox.complete(&self.home, self.epoch);
    }
}

/// A large buffer being zeroed / pre-faulted by several workers.
pub(crate) struct Chunked {
    returned: Mutex<Option<Returned>>,
    contents: Contents,
    base: usize,
    dirty: usize,
    end: usize,
    /// Chunks not yet done; the worker that takes it to zero finishes.
    remaining: AtomicUsize,
}

// === impl Shared (cleaner side) ===

impl Shared {
    /// Starts the workers unless they are running or the pool is closed.
    pub(crate) fn start_cleaner(this: &Arc<Self>) {
        let mut workers = this.workers.lock();
        if !workers.is_empty() || this.inbox.closed.load(Ordering::Relaxed) {
            return;
        }
        let width = this.config.cleaner_threads;
        for index in 0..width {
            let shared = Arc::clone(this);
            let spawned = crate::sync::thread::Builder::new()
                .name(format!("pinpool-cleaner-{index}"))
                .spawn(move || shared.work(index, width));
            match spawned {
                Ok(handle) => workers.push(handle),
                Err(e) => tracing::error!(error = %e, "could not spawn a cleaner worker"),
            }
        }
        // Relaxed: the workers were spawned above (spawning synchronizes),
        // and `submit` orders its read with a SeqCst fence.
        this.inbox
            .running
            .store(!workers.is_empty(), Ordering::Relaxed);
    }

    /// Stops and joins the workers. Jobs still queued stay queued.
    pub(crate) fn stop_cleaner(&self) {
        let mut workers = self.workers.lock();
        self.inbox.running.store(false, Ordering::Relaxed);
        // Pairs with the SeqCst fence in `submit`; see there.
        fence(Ordering::SeqCst);
        for _ in 0..workers.len() {
            self.inbox.lanes.push(Lane::Recycle, Job::Stop);
        }
        for handle in workers.drain(..) {
            if handle.join().is_err() {
                tracing::error!("a cleaner worker panicked");
            }
        }
    }

    /// Whether workers are running.
    pub(crate) fn cleaner_running(&self) -> bool {
        self.inbox.running.load(Ordering::Relaxed)
    }

    /// Blocks until every buffer dropped before the call is recycled or
    /// released.
    pub(crate) fn flush(this: &Arc<Self>) {
        let _serial = this.flush_lock.lock();
        Self::start_cleaner(this);
        this.sweep();
        if !this.cleaner_running() {
            // No worker could start (or the pool is closed): do it here.
            this.inbox.release_queued();
            this.release_parked();
        }
        // Relaxed: see `Inbox::submit`.
        let old = this.inbox.epoch.fetch_add(1, Ordering::Relaxed) & 1;
        let inbox = &this.inbox;
        let mut waiters = inbox.flush_waiters.lock();
        *waiters += 1;
        inbox.flushing.fetch_add(1, Ordering::Relaxed);
        // Pairs with the fence in `notify_flush`.
        fence(Ordering::SeqCst);
        // Acquire pairs with the Release decrement in `Inbox::complete`, so
        // the pooled buffers are visible to the caller afterwards.
        while this
            .caches
            .iter()
            .any(|c| c.inflight[old].load(Ordering::Acquire) != 0)
        {
            waiters = inbox.flush_done.wait(waiters);
        }
        *waiters -= 1;
        inbox.flushing.fetch_sub(1, Ordering::Relaxed);
    }

    /// Queues drain tokens for every cache holding deferred buffers.
    pub(crate) fn sweep(&self) {
        // Relaxed: a drop that defers after this store sees it cleared
        // through the cache mutex this sweep takes next, or its buffer is
        // seen by this sweep.
        self.inbox.sweep_pending.store(false, Ordering::Relaxed);
        for cache in self.caches.iter() {
            if cache.sweep() {
                self.inbox
                    .lanes
                    .push(Lane::Recycle, Job::Drain(Arc::clone(cache)));
            }
        }
    }

    /// Buffers dropped and not yet recycled or released.
    pub(crate) fn in_cleaner(&self) -> usize {
        self.caches
            .iter()
            .map(|c| {
                c.inflight
                    .iter()
                    .map(|n| n.load(Ordering::Relaxed))
                    .sum::<usize>()
            })
            .sum()
    }

    fn work(&self, index: usize, width: usize) {
        let span = tracing::debug_span!("pinpool_cleaner", worker = index);
        let _entered = span.enter();
        let register = width == 1 || index != 0;
        loop {
            // Relaxed: a hint; a stale zero only delays polling until the
            // next job or until the parking worker's own next poll.
            let timeout = (self.parked_len.load(Ordering::Relaxed) > 0).then_some(POLL);
            let job = self.inbox.lanes.pop(register, timeout);
            if matches!(job, Some(Job::Stop)) {
                break;
            }
            // A panic in a job (a backend or allocator bug) must not take
            // the worker down with it: the buffers the job held are released
            // as it unwinds (see `Returned`'s `Drop`), and the worker goes on.
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if let Some(job) = job {
                    self.run(job);
                }
                self.poll_parked();
            }));
            if ran.is_err() {
                Counters::add(&self.inbox.counters.worker_panics, 1);
                tracing::error!("a cleaner job panicked; the buffers it held were released");
            }
        }
    }

    fn run(&self, job: Job) {
        match job {
            Job::Drain(cache) => {
                // Wrapped first, so that a panic part-way releases the rest.
                let batch: Vec<Returned> = cache
                    .take_dirty()
                    .into_iter()
                    .map(|dirty| Returned::new(dirty, Arc::clone(&cache)))
                    .collect();
                for returned in batch {
                    self.process(returned);
                }
            }
            Job::Sweep => {
                crate::sync::sleep(SWEEP_DELAY);
                self.sweep();
            }
            Job::Returned(returned) => {
                self.inbox.register_queued.fetch_sub(1, Ordering::Relaxed);
                self.process(returned);
            }
            Job::Release(returned) => {
                Counters::add(&self.inbox.counters.registrations_skipped, 1);
                drop(returned);
            }
            Job::Chunk(task, chunk) => self.run_chunk(&task, chunk),
            Job::Stop => {}
        }
    }

    fn process(&self, returned: Returned) {
        match self.quiescent(&returned) {
            Ok(true) => self.prepare(returned),
            Ok(false) => self.park(returned),
            Err(e) => {
                Counters::add(&self.inbox.counters.fence_failures, 1);
                tracing::warn!(error = %e, "waiting for a buffer's copies failed; freeing it");
                drop(returned);
            }
        }
    }

    /// Whether the copies reading the buffer have finished: its events
    /// have completed, or, for a pinned buffer without events, its device
    /// has been synchronized since it was dropped.
    fn quiescent(&self, returned: &Returned) -> Result<bool, crate::Error> {
        let block = returned.block();
        if !returned.fences.is_empty() {
            return returned.fences_done();
        }
        if block.is_pinned() {
            self.sync_device(block.device(), returned.dropped_at)?;
        }
        Ok(true)
    }

    /// Synchronizes `device` unless a synchronize that started after
    /// `since` has already completed: one synchronize covers every buffer
    /// dropped before it started, so a burst of event-less buffers costs one.
    fn sync_device(&self, device: usize, since: Instant) -> Result<(), crate::Error> {
        let mut last = self.device_syncs[device].lock();
        if last.is_some_and(|started| started >= since) {
            return Ok(());
        }
        let started = Instant::now();
        self.inbox.backend.synchronize(device)?;
        *last = Some(started);
        Ok(())
    }

    fn park(&self, returned: Returned) {
        let mut parked = self.parked.lock();
        parked.push(returned);
        // Relaxed: a hint read by idle workers; see `work`.
        self.parked_len.store(parked.len(), Ordering::Relaxed);
    }

    fn poll_parked(&self) {
        if self.parked_len.load(Ordering::Relaxed) == 0 {
            return;
        }
        let Some(mut parked) = self.parked.try_lock() else {
            return;
        };
        let mut ready = Vec::new();
        for returned in std::mem::take(&mut *parked) {
            match self.quiescent(&returned) {
                Ok(true) => ready.push(returned),
                Ok(false) => parked.push(returned),
                Err(e) => {
                    Counters::add(&self.inbox.counters.fence_failures, 1);
                    tracing::warn!(error = %e, "waiting for a buffer's copies failed; freeing it");
                }
            }
        }
        self.parked_len.store(parked.len(), Ordering::Relaxed);
        drop(parked);
        for returned in ready {
            self.prepare(returned);
        }
    }

    /// Releases every parked buffer (waiting for its copies first).
    pub(crate) fn release_parked(&self) {
        let parked = std::mem::take(&mut *self.parked.lock());
        self.parked_len.store(0, Ordering::Relaxed);
        drop(parked);
    }

    /// Zeroes the dirty prefix and, for a buffer about to be registered,
    /// pre-faults the rest; splits the work across workers when large.
    fn prepare(&self, returned: Returned) {
        let block = returned.block();
        let register = self.inbox.backend.pins() && !block.is_pinned();
        let dirty = returned.dirty.min(block.len());
        let end = if register { block.footprint() } else { dirty };
        let base = block.as_ptr() as usize;
        let contents = block.contents().clone();
        Counters::add(&self.inbox.counters.bytes_zeroed, dirty as u64);
        if end <= CHUNK {
            contents.write();
            // SAFETY: the worker owns the returned block, whose copies have
            // finished, and `dirty <= end <= footprint`.
            unsafe { clean_range(base, 0, end, dirty) };
            self.finish(returned);
            return;
        }
        let chunks = end.div_ceil(CHUNK);
        let lane = if register {
            Lane::Register
        } else {
            Lane::Recycle
        };
        let task = Arc::new(Chunked {
            returned: Mutex::new(Some(returned)),
            contents,
            base,
            dirty,
            end,
            remaining: AtomicUsize::new(chunks),
        });
        // Every chunk goes through the queue, the first included, so that
        // a worker draining a batch of large buffers hands all of their
        // chunks out before zeroing any itself.
        for chunk in 0..chunks {
            self.inbox
                .lanes
                .push(lane, Job::Chunk(Arc::clone(&task), chunk));
        }
    }

    fn run_chunk(&self, task: &Chunked, chunk: usize) {
        let start = chunk * CHUNK;
        let end = (start + CHUNK).min(task.end);
        task.contents.write_part(chunk);
        // SAFETY: chunks are disjoint ranges of a block owned by `task`,
        // which holds it (unmoved) until the last chunk finishes.
        unsafe { clean_range(task.base, start, end, task.dirty) };
        // AcqRel: Release publishes this chunk's writes; the finishing
        // worker's Acquire sees every chunk's writes before registering
        // and pooling the buffer.
        if task.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let returned = task.returned.lock().take();
            if let Some(returned) = returned {
                self.finish(returned);
            }
        }
    }

    /// Registers the buffer on its first cycle, then admits it.
    fn finish(&self, mut returned: Returned) {
        let backend = &**self.inbox.backend;
        let counters = &self.inbox.counters;
        let block = returned.block.as_mut().expect("held until admitted");
        if backend.pins() && !block.is_pinned() {
            let started = Instant::now();
            // SAFETY: the block is a live mapping that stays mapped until it
            // is unregistered in `Inbox::release`.
            let registered =
                unsafe { backend.register(block.device(), block.as_ptr(), block.footprint()) };
            match registered {
                Ok(()) => {
                    block.set_pinned(true);
                    let took = started.elapsed();
                    Counters::add(&counters.registrations, 1);
                    Counters::add(&counters.registered_bytes, block.footprint() as u64);
                    Counters::add(&counters.registration_nanos, took.as_nanos() as u64);
                    tracing::debug!(bytes = block.footprint(), ?took, "registered a buffer");
                }
                Err(e) => {
                    Counters::add(&counters.registration_failures, 1);
                    tracing::warn!(error = %e, bytes = block.footprint(), "registration failed; freeing the buffer");
                    drop(returned);
                    return;
                }
            }
        }
        let block = returned.block.take().expect("held until admitted");
        self.admit(block, &returned.home);
        Counters::add(&counters.recycled, 1);
        counters.record_ready(returned.dropped_at.elapsed());
        drop(returned);
    }
}

/// Zeroes `[start, end) ∩ [0, dirty)` of the block at `base` and
/// pre-faults `[start, end)` beyond `dirty` (already zero).
///
/// # Safety
/// The caller owns `[base + start, base + end)` of a live block exclusively.
unsafe fn clean_range(base: usize, start: usize, end: usize, dirty: usize) {
    let ptr = base as *mut u8;
    let zero_end = dirty.clamp(start, end);
    // SAFETY: both ranges lie in `[start, end)`, owned by the caller.
    unsafe {
        alloc::zero(ptr.add(start), zero_end - start);
        let touch_start = zero_end.next_multiple_of(PAGE).min(end);
        alloc::touch(ptr.add(touch_start), end - touch_start);
    }
}
