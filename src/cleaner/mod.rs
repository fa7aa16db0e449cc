//! The cleaner: a pool of workers that turns dropped buffers into ready
//! ones. [IMPLEMENTATION.md](../../IMPLEMENTATION.md) tells the whole
//! journey; this module owns the cleaner's part of it:
//!
//! - the work queue ([`Lanes`]): drops that a thread cache does not keep
//!   arrive as [`Job`]s on the *recycle* lane (already registered, or never
//!   to be) or the *register* lane (first registrations, milliseconds each),
//!   whose backlog is bounded; worker 0 reads only the recycle lane (unless
//!   it is the only worker), so a burst of registrations never starves
//!   recycling, and the others take the register lane first one pop in
//!   eight, so recycling never starves registrations;
//! - bounded backlogs: registrations queued, bytes to zero and buffers
//!   held for recycling; a drop past a bound is [shed](Cleaner::shed)
//!   without a driver call or a lock on the dropping thread (a pageable
//!   buffer freed there, its fences to the cleaner through [`spent`]; a
//!   pinned one released by the cleaner in bulk);
//! - [parking]: buffers whose fences have not completed wait there,
//!   re-polled by idle workers, so one slow copy holds up nothing else;
//! - [device synchronizes](device_sync) for pinned buffers dropped without
//!   events, one covering every buffer dropped before it started;
//! - the work itself: re-zero the dirty prefix, and before a first
//!   registration touch every page, in [`CHUNK`]-sized jobs that any worker
//!   runs; register once; then hand the buffer to admission;
//! - sweeps: buffers left in the caches of threads that went idle are moved
//!   along after a while, and `flush` moves them along at once.
//!
//! The cleaner reaches its pool only through admission and the cache list
//! ([`Env`]). A worker never blocks on a copy (fences are polled), and a job
//! that panics (a backend or allocator bug) is caught by its worker: the
//! buffer it held is leaked, not lost, its completion counted, and the
//! worker carries on.
//!
//! [`CHUNK`]: crate::tune::Tuning::CHUNK

pub(crate) mod device_sync;
mod lanes;
pub(crate) mod parking;
pub(crate) mod spent;

use std::ptr::NonNull;
use std::time::{Duration, Instant};

use crate::admission::{Admission, Places};
use crate::alloc::{clean_range, Block, Unpinned};
use crate::backend::Backend;
use crate::error::Error;
use crate::provision::Provisioner;
use crate::stats::Counters;
use crate::sync::track::Contents;
use crate::sync::{thread, Arc, AtomicBool, AtomicUsize, HintCounter, Mutex, Ordering};
use crate::thread_cache::ThreadCache;
use crate::tune::{Tune, Tuning};

use device_sync::{DeviceSyncs, Synced};
use lanes::{Lane, Lanes, Popped};
use parking::Parking;
use spent::Spent;

/// What the cleaner reaches of its pool.
#[derive(Clone, Copy)]
pub(crate) struct Env<'a> {
    pub(crate) backend: &'a dyn Backend,
    pub(crate) admission: &'a Admission,
    pub(crate) places: Places<'a>,
    pub(crate) provisioner: &'a Provisioner,
}

impl Env<'_> {
    fn counters(&self) -> &Counters {
        &self.places.caches.counters
    }
}

/// A dropped buffer on its way through the cleaner, with the cache its
/// drop was counted in. If a job panics while holding one, its `Drop`
/// frees the buffer if it is known to be quiescent and unregistered, leaks
/// it otherwise, and counts the completion: nothing is lost and no flush
/// hangs.
#[derive(Debug)]
pub(crate) struct Returned {
    block: Option<Block>,
    home: NonNull<ThreadCache>,
    /// Freed once quiescent rather than recycled.
    release: bool,
    /// Its copies are known to have finished.
    quiet: bool,
    /// Goes to its device's shard, not back to its home cache (whose owner
    /// went idle).
    to_shard: bool,
}

// SAFETY: a returned buffer owns its block; `home` points into the pool's
// caches, which outlive every job (jobs are drained before a pool goes).
unsafe impl Send for Returned {}

impl Returned {
    pub(crate) fn new(block: Block, home: &ThreadCache) -> Self {
        Self {
            block: Some(block),
            home: NonNull::from(home),
            release: false,
            quiet: false,
            to_shard: false,
        }
    }

    fn block(&self) -> &Block {
        self.block.as_ref().expect("held until finished")
    }

    fn block_mut(&mut self) -> &mut Block {
        self.block.as_mut().expect("held until finished")
    }

    fn home(&self) -> &ThreadCache {
        // SAFETY: see the `Send` impl.
        unsafe { self.home.as_ref() }
    }

    /// Leaks the buffer at once (its fence failed) and counts it.
    pub(crate) fn fail_now(self, env: Env<'_>, e: &Error) {
        Cleaner::fail(env, self, e);
    }

    /// Takes the block out, completing nothing yet.
    pub(crate) fn into_block(mut self) -> Block {
        self.block.take().expect("held until finished")
    }
}

impl Drop for Returned {
    fn drop(&mut self) {
        let Some(mut block) = self.block.take() else {
            return;
        };
        let counters = &self.home().caches().counters;
        let meta = block.meta_mut();
        meta.returned = false;
        let parity = usize::from(meta.parity);
        if self.quiet && !block.is_pinned() {
            tracing::error!("pinpool: a cleaner job failed part-way; freeing its buffer");
            block.fences_mut().release();
            Counters::add(&counters.released, 1);
            drop(block);
        } else {
            tracing::error!(
                bytes = block.footprint(),
                "pinpool: a cleaner job failed part-way; leaking its buffer"
            );
            block.fences_mut().abandon();
            let leaked = block.leak();
            Counters::add(&counters.leaked_bytes, leaked as u64);
        }
        self.home().complete(parity, false);
    }
}

/// What the cleaner receives.
pub(crate) enum Job {
    /// A dropped buffer to clean and recycle.
    Clean(Returned),
    /// A dropped pool-miss buffer to register on its first cycle.
    Register(Returned),
    /// Collect the caches' release lists: pinned buffers shed past the
    /// backlog, to free once their copies are done (see `Cleaner::shed`).
    Bulk,
    /// Collect the fences of buffers their droppers freed (see [`Spent`]).
    Spent,
    /// Chunk `index` of a large buffer's zeroing / pre-faulting.
    Chunk(Arc<Chunked>, usize),
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

/// How long worker 0 waits before sweeping idle caches, and what it saw of
/// each cache last time.
#[derive(Debug)]
struct Sweep {
    wait: Duration,
    due: Instant,
    seen: std::collections::HashMap<usize, u64>,
}

/// The cleaner; see the module docs.
pub(crate) struct Cleaner {
    lanes: Lanes<Job>,
    workers: Mutex<Vec<thread::JoinHandle<()>>>,
    /// Whether workers run (a hint: set under `workers`).
    running: AtomicBool,
    /// How many workers the last start started (0 once stopped): the first
    /// `started` indices run (see `start`).
    started: HintCounter,
    width: usize,
    pins: bool,
    parking: Parking,
    syncs: DeviceSyncs,
    /// Per device: the synchronize run for closed pools' late buffers.
    late_syncs: Box<[LateSync]>,
    /// Registrations queued or running, and the most allowed.
    register_queued: AtomicUsize,
    register_backlog: usize,
    /// Dirty bytes queued for zeroing.
    zero_queued: AtomicUsize,
    /// Buffers queued for recycling (`Job::Clean`): with the parked ones,
    /// at most [`RECYCLE_BACKLOG`](Tuning::RECYCLE_BACKLOG) (give or take
    /// the drops racing at the bound).
    recycle_queued: HintCounter,
    /// Fences of buffers freed by their droppers.
    spent: Spent,
    sweep: Mutex<Sweep>,
}

impl std::fmt::Debug for Cleaner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cleaner")
            .field("width", &self.width)
            .field("lanes", &self.lanes)
            .field("parked", &self.parking.len())
            .finish_non_exhaustive()
    }
}

// === impl Cleaner ===

/// See [`Cleaner::work`]: one pop in this many tries the register lane
/// first.
const REGISTER_TURN: u32 = 8;

/// Where a closed pool's late buffer stands; see [`Cleaner::settle_late`].
#[derive(Debug)]
pub(crate) enum Late {
    /// Its copies have finished: retire it.
    Settled,
    /// Not yet: look again later.
    Waiting,
    /// It needs a synchronize of this device above this note: run it with
    /// [`Cleaner::run_late_sync`], then look again.
    NeedsSync(usize, u64),
}

/// The state of a device's synchronize for late buffers.
#[derive(Debug)]
struct LateSync {
    running: AtomicBool,
    failed: Mutex<Option<Error>>,
}

impl LateSync {
    fn new() -> Self {
        Self {
            running: AtomicBool::new(false),
            failed: Mutex::new(None),
        }
    }
}

/// Why a parked buffer's wait ended without its copies known finished.
enum Failed {
    /// Polling one of its fences failed.
    Fence(Error),
    /// The device synchronize it waited for (the `i`th of a poll) failed.
    Sync(usize),
}

impl Cleaner {
    /// A stopped cleaner of `width` workers for `devices` devices.
    pub(crate) fn new(width: usize, devices: usize, pins: bool) -> Self {
        Self {
            lanes: Lanes::new(),
            workers: Mutex::new(Vec::new()),
            running: AtomicBool::new(false),
            started: HintCounter::new(0),
            width,
            pins,
            parking: Parking::new(),
            syncs: DeviceSyncs::new(devices),
            late_syncs: (0..devices).map(|_| LateSync::new()).collect(),
            register_queued: AtomicUsize::new(0),
            register_backlog: Tune::REGISTER_BACKLOG + 16 * width,
            zero_queued: AtomicUsize::new(0),
            recycle_queued: HintCounter::new(0),
            spent: Spent::new(),
            sweep: Mutex::new(Sweep {
                wait: Tune::SWEEP_MIN,
                due: Instant::now(),
                seen: std::collections::HashMap::new(),
            }),
        }
    }

    /// Whether workers are running. Relaxed: a hint; callers that act on
    /// `false` take the workers lock.
    pub(crate) fn is_running(&self) -> bool {
        self.running.load(Ordering::Relaxed)
    }

    /// Starts the workers unless they run, with `spawn(index)` starting
    /// worker `index`. They start in order, and the first that cannot
    /// start (the system is out of threads) ends the start: workers
    /// `0..k` run, worker 0 serving the registration lane too if it runs
    /// alone. With none, `flush`, `shutdown` and closing do the cleaning
    /// on their own thread, and the next take that misses tries again.
    pub(crate) fn start(&self, spawn: impl Fn(usize) -> std::io::Result<thread::JoinHandle<()>>) {
        let mut workers = self.workers.lock();
        if !workers.is_empty() {
            return;
        }
        for index in 0..self.width {
            match spawn(index) {
                Ok(handle) => workers.push(handle),
                Err(e) => {
                    tracing::error!(error = %e, started = index, width = self.width,
                        "pinpool: could not start a cleaner worker; running with those started");
                    break;
                }
            }
        }
        // Relaxed (both): hints, written under the lock; see `work` for
        // what a stale `started` costs.
        self.started.store(workers.len(), Ordering::Relaxed);
        self.running.store(!workers.is_empty(), Ordering::Relaxed);
    }

    /// Stops and joins the workers. Queued jobs stay queued.
    pub(crate) fn stop(&self) {
        let mut workers = self.workers.lock();
        self.lanes.stop(workers.len());
        for handle in workers.drain(..) {
            if handle.join().is_err() {
                tracing::error!("pinpool: a cleaner worker panicked");
            }
        }
        self.started.store(0, Ordering::Relaxed);
        self.running.store(false, Ordering::Relaxed);
    }

    /// Takes a dropped buffer that its cache does not keep. Never blocks:
    /// atomics and a channel send only (it runs inside the dropping
    /// thread's active window, where taking a lock could deadlock with a
    /// thief).
    pub(crate) fn submit(&self, home: &ThreadCache, block: Block, cap: usize) {
        self.submit_to(home, block, cap, false, false);
    }

    /// Takes a fresh buffer to pin and pool ahead of demand (`reserve`, or
    /// provisioning), counted in `home` (the orphan cache): it goes to its
    /// shard. One that `reserve` asked for (`meta.reserved`) is registered
    /// whatever the registration backlog; a provisioned one yields to it.
    /// Neither counts against the recycling backlog: both are fresh and
    /// clean, as many as the caller asked for.
    pub(crate) fn submit_reserved(&self, home: &ThreadCache, block: Block, cap: usize) {
        self.submit_to(home, block, cap, true, true);
    }

    /// As [`submit`](Self::submit); the buffer goes to its shard once ready
    /// if `to_shard`, and is pinned ahead of demand if `ahead`.
    fn submit_to(
        &self,
        home: &ThreadCache,
        mut block: Block,
        cap: usize,
        to_shard: bool,
        ahead: bool,
    ) {
        let register = self.pins && !block.is_pinned();
        self.note_drop(&mut block);
        let meta = block.meta_mut();
        meta.dropped_at = Some(Instant::now());
        let reserved = meta.reserved;
        let mut returned = Returned::new(block, home);
        returned.to_shard = to_shard;
        if register {
            // Relaxed: a bound on a queue length, publishing nothing; a
            // racing read lets a few drops past it or sheds a few below it.
            if !reserved && self.register_queued.load(Ordering::Relaxed) >= self.register_backlog {
                // Registrations are backed up: free this miss buffer rather
                // than let misses breed an ever longer queue.
                Counters::add(&home.caches().counters.registrations_skipped, 1);
                self.shed(home, returned);
            } else {
                self.register_queued.fetch_add(1, Ordering::Relaxed);
                self.lanes.push(Lane::Register, Job::Register(returned));
            }
            return;
        }
        let dirty = returned.block().dirty();
        // Relaxed: bounds, as above. What is pinned ahead of demand is
        // queued whatever the backlog.
        let limit = (cap / 2).clamp(Tune::ZERO_BACKLOG_MIN, Tune::ZERO_BACKLOG);
        // The buffers the cleaner holds to recycle: queued, or parked for
        // their copies or a device synchronize.
        let held = self.recycle_queued.load(Ordering::Relaxed) + self.parking.len();
        let full = self.zero_queued.load(Ordering::Relaxed) + dirty > limit
            || held >= Tune::RECYCLE_BACKLOG;
        if full && !ahead {
            Counters::add(&home.caches().counters.zeroing_skipped, 1);
            self.shed(home, returned);
            return;
        }
        self.zero_queued.fetch_add(dirty, Ordering::Relaxed);
        self.recycle_queued.fetch_add(1, Ordering::Relaxed);
        self.lanes.push(Lane::Recycle, Job::Clean(returned));
    }

    /// Takes a dropped buffer that a full backlog (registrations, bytes to
    /// zero, or buffers to recycle) has no room for, so that dropping
    /// faster than the cleaner works grows no queue (and no flush's wait)
    /// without bound, while the dropping thread still never blocks, calls
    /// the backend or takes a lock:
    ///
    /// - a pageable buffer is freed here (nothing of CUDA to undo, and no
    ///   copy can still read it: copies from pageable memory are staged
    ///   before they return); its fences and spare events, which only the
    ///   driver destroys and the event pool's lock takes back, go to the
    ///   cleaner ([`Spent`]);
    /// - a pinned one needs the driver to be unregistered: it goes on its
    ///   home cache's release list, which the cleaner frees in bulk once
    ///   the buffers' copies are done.
    ///
    /// Either list queues one collecting job when a push finds it empty,
    /// so the queue gains at most one job per collection.
    fn shed(&self, home: &ThreadCache, returned: Returned) {
        let mut block = returned.into_block();
        if block.is_pinned() {
            if home.released().push(block) {
                self.lanes.push(Lane::Recycle, Job::Bulk);
            }
            return;
        }
        let fences = std::mem::take(block.fences_mut());
        let meta = block.meta_mut();
        meta.returned = false;
        let parity = usize::from(meta.parity);
        Counters::add(&home.caches().counters.released, 1);
        drop(block);
        home.complete(parity, home.is_owned_here());
        if !fences.is_bare() && self.spent.push(fences) {
            self.lanes.push(Lane::Recycle, Job::Spent);
        }
    }

    /// Frees, in bulk, the pinned buffers that [`shed`](Self::shed) put on
    /// the caches' release lists, each once its copies are done. One
    /// synchronize per device, waited for here, covers every event-less
    /// buffer of the batch (all were dropped before it starts), so a large
    /// batch neither runs one per buffer nor fills the parking; buffers
    /// with fences are polled, and parked if not done, as any buffer.
    fn release_bulk(&self, env: Env<'_>) {
        let mut batch = Vec::new();
        let mut notes: Vec<(usize, u64)> = Vec::new();
        for cache in env.places.caches.iter() {
            for mut block in cache.released().take_all() {
                if block.fences_mut().is_empty() {
                    let (device, note) = (block.device(), block.meta_mut().sync_gen);
                    match notes.iter_mut().find(|(d, _)| *d == device) {
                        Some((_, highest)) => *highest = (*highest).max(note),
                        None => notes.push((device, note)),
                    }
                }
                let mut returned = Returned::new(block, cache);
                returned.release = true;
                batch.push(returned);
            }
        }
        let mut failed: Vec<(usize, Error)> = Vec::new();
        for (device, note) in notes {
            match self.syncs.wait(env.backend, device, note) {
                Ok(true) => Counters::add(&env.counters().device_syncs, 1),
                Ok(false) => {}
                Err(e) => failed.push((device, e)),
            }
        }
        let mut released = false;
        for mut returned in batch {
            let block = returned.block_mut();
            if !block.fences_mut().is_empty() {
                self.process(env, returned);
                continue;
            }
            let device = block.device();
            if let Some((_, e)) = failed.iter().find(|(d, _)| *d == device) {
                // Its copies are not known to have finished.
                Self::fail(env, returned, e);
                continue;
            }
            let meta = returned.block_mut().meta_mut();
            meta.returned = false;
            let parity = usize::from(meta.parity);
            let home = returned.home;
            release(env.backend, env.counters(), returned.into_block());
            // SAFETY: see `Returned`'s `Send` impl.
            unsafe { home.as_ref() }.complete_quietly(parity);
            released = true;
        }
        if released {
            env.places.caches.flush.notify();
        }
    }

    /// Notes, on a dropped pinned buffer without recorded events, the
    /// device synchronizes started so far: one numbered above the note
    /// covers the copies that may still read it. Every path that takes a
    /// dropped buffer in (the cleaner's, a closed pool's) notes it before
    /// anything can release it.
    pub(crate) fn note_drop(&self, block: &mut Block) {
        if block.is_pinned() && block.fences_mut().is_empty() {
            let note = self.syncs.started(block.device());
            block.meta_mut().sync_gen = note;
        }
    }

    /// Where a closed pool's late buffer stands; the reaper, the only
    /// caller, never blocks here: a device synchronize the buffer needs is
    /// [`Late::NeedsSync`], for the caller to run off the reaper's thread
    /// ([`run_late_sync`](Self::run_late_sync)), one per device at a time.
    pub(crate) fn settle_late(&self, block: &mut Block) -> Result<Late, Error> {
        if !block.fences_mut().is_empty() {
            return Ok(match block.fences_mut().poll()? {
                true => Late::Settled,
                false => Late::Waiting,
            });
        }
        if !block.is_pinned() {
            return Ok(Late::Settled);
        }
        let (device, note) = (block.device(), block.meta_mut().sync_gen);
        if self.syncs.settled(device, note) {
            return Ok(Late::Settled);
        }
        let late = &self.late_syncs[device];
        // Acquire pairs with the Release store in `run_late_sync`: seeing
        // the last synchronize over means seeing its failure, if any,
        // recorded below.
        if late.running.swap(true, Ordering::Acquire) {
            return Ok(Late::Waiting);
        }
        if let Some(e) = late.failed.lock().take() {
            // The synchronize this buffer may have waited for failed: its
            // copies are not known to have finished. Later buffers get a
            // new one. Release: as in `run_late_sync`.
            late.running.store(false, Ordering::Release);
            return Err(e);
        }
        Ok(Late::NeedsSync(device, note))
    }

    /// Runs the device synchronize that [`settle_late`](Self::settle_late)
    /// asked for (blocking the calling thread).
    pub(crate) fn run_late_sync(&self, env: Env<'_>, device: usize, note: u64) {
        let late = &self.late_syncs[device];
        match self.syncs.wait(env.backend, device, note) {
            Ok(synced) => {
                if synced {
                    Counters::add(&env.counters().device_syncs, 1);
                }
                // A synchronize above the note completed: an older failure
                // no longer says anything about the buffers waiting now.
                *late.failed.lock() = None;
            }
            Err(e) => *late.failed.lock() = Some(e),
        }
        // Release: see `settle_late`.
        late.running.store(false, Ordering::Release);
    }

    /// A worker's loop.
    pub(crate) fn work(&self, env: Env<'_>, index: usize) {
        let span = tracing::debug_span!("pinpool_cleaner", worker = index);
        let _entered = span.enter();
        // Registering workers serve the recycle lane first, but the register
        // lane first on every `REGISTER_TURN`th pop: a steady stream of
        // recycling must not hold first registrations (and the flushes
        // waiting for them) back for good, while pinning new buffers must
        // not slow the recycling of those already pinned.
        let mut pops = 0u32;
        loop {
            // Worker 0 serves only recycling unless it runs alone. Relaxed:
            // a hint; a stale count (0 before `start` stores it) makes it
            // serve registrations for a pop, which is harmless, and it
            // reads the count again on every pop.
            let register = index != 0 || self.started.load(Ordering::Relaxed) < 2;
            pops = pops.wrapping_add(1);
            let register_first = register && pops.is_multiple_of(REGISTER_TURN);
            let timeout = if self.parking.len() > 0 {
                Some(Tune::POLL)
            } else if index == 0 && Tune::SWEEPS {
                Some(self.sweep.lock().wait)
            } else {
                None
            };
            let popped = self.lanes.pop(register, register_first, timeout);
            if matches!(popped, Popped::Stop) {
                break;
            }
            // A panic in a job (a backend or allocator bug) must not take
            // the worker with it: the buffers it held are leaked as it
            // unwinds (see `Returned`), and the worker goes on.
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if let Popped::Job(job) = popped {
                    self.run(env, job);
                }
                self.poll_parked(env);
                if index == 0 && Tune::SWEEPS {
                    self.sweep_if_due(env);
                    self.provision(env, false);
                }
            }));
            if ran.is_err() {
                Counters::add(&env.counters().worker_panics, 1);
                tracing::error!("pinpool: a cleaner job panicked; its buffer was leaked");
            }
        }
    }

    fn run(&self, env: Env<'_>, job: Job) {
        match job {
            Job::Clean(returned) => {
                self.zero_queued
                    .fetch_sub(returned.block().dirty(), Ordering::Relaxed);
                self.recycle_queued.fetch_sub(1, Ordering::Relaxed);
                self.process(env, returned);
            }
            Job::Register(returned) => {
                self.register_queued.fetch_sub(1, Ordering::Relaxed);
                self.process(env, returned);
            }
            Job::Bulk => self.release_bulk(env),
            Job::Spent => {
                for mut fences in self.spent.take_all() {
                    // Spare events back to the pool; the rest destroyed.
                    fences.release();
                }
            }
            Job::Chunk(task, chunk) => self.run_chunk(env, &task, chunk),
        }
    }

    /// Runs queued jobs on the calling thread until the lanes are empty
    /// (shutdown, closing, or a flush that finds no worker running).
    /// Buffers whose copies are still running stay parked.
    pub(crate) fn drain_inline(&self, env: Env<'_>) {
        loop {
            while let Some(job) = self.lanes.try_pop() {
                self.run(env, job);
            }
            self.poll_parked(env);
            // A parked buffer that became ready may have queued the chunks
            // of its zeroing: run those too, or nobody will.
            if self.lanes.len() == 0 {
                break;
            }
        }
    }

    /// Takes every parked buffer (closing hands them to the reaper).
    pub(crate) fn take_parked(&self) -> Vec<Returned> {
        self.parking.take_all()
    }

    fn process(&self, env: Env<'_>, mut returned: Returned) {
        match self.quiescent(env, &mut returned) {
            Ok(true) if returned.release => self.release_returned(env, returned),
            Ok(true) => {
                returned.quiet = true;
                self.prepare(env, returned);
            }
            Ok(false) => self.parking.park(returned),
            Err(e) => Self::fail(env, returned, &e),
        }
    }

    /// Whether the copies reading the buffer have finished: its fences have
    /// completed, or, for a pinned buffer without fences, a device
    /// synchronize that started after its drop has completed.
    /// A synchronize that another worker is running parks the buffer
    /// rather than block this worker too.
    fn quiescent(&self, env: Env<'_>, returned: &mut Returned) -> Result<bool, Error> {
        let block = returned.block_mut();
        if !block.fences_mut().is_empty() {
            return block.fences_mut().poll();
        }
        if block.is_pinned() {
            let (device, note) = (block.device(), block.meta_mut().sync_gen);
            match self.syncs.try_sync(env.backend, device, note)? {
                Synced::Already => {}
                Synced::Ran => Counters::add(&env.counters().device_syncs, 1),
                Synced::Busy => return Ok(false),
            }
        }
        Ok(true)
    }

    /// A buffer whose copies are not known to have finished: leaked, never
    /// unregistered or unmapped.
    fn fail(env: Env<'_>, mut returned: Returned, e: &Error) {
        let counters = env.counters();
        Counters::add(&counters.fence_failures, 1);
        let mut block = returned.block.take().expect("held until finished");
        tracing::error!(
            error = %e,
            bytes = block.footprint(),
            "pinpool: waiting for a buffer's copies failed; leaking the buffer"
        );
        let meta = block.meta_mut();
        meta.returned = false;
        let parity = usize::from(meta.parity);
        block.fences_mut().abandon();
        let leaked = block.leak();
        Counters::add(&counters.leaked_bytes, leaked as u64);
        returned.home().complete(parity, false);
    }

    /// Finishes the parked buffers whose copies are done. Those waiting for
    /// a device synchronize (parked while another worker ran one that may
    /// have started before their drop) get one run here if none is
    /// running, and are looked at again.
    fn poll_parked(&self, env: Env<'_>) {
        let mut failed: Vec<(usize, Error)> = Vec::new();
        for round in 0..2 {
            let mut syncs_wanted: Vec<(usize, u64)> = Vec::new();
            let done = self.parking.poll(|returned| {
                let block = returned.block_mut();
                if block.fences_mut().is_empty() && block.is_pinned() {
                    let (device, note) = (block.device(), block.meta_mut().sync_gen);
                    if self.syncs.settled(device, note) {
                        return Some(Ok(()));
                    }
                    if let Some(i) = failed.iter().position(|(d, _)| *d == device) {
                        return Some(Err(Failed::Sync(i)));
                    }
                    match syncs_wanted.iter_mut().find(|(d, _)| *d == device) {
                        Some((_, highest)) => *highest = (*highest).max(note),
                        None => syncs_wanted.push((device, note)),
                    }
                    return None;
                }
                match block.fences_mut().poll() {
                    Ok(true) => Some(Ok(())),
                    Ok(false) => None,
                    Err(e) => Some(Err(Failed::Fence(e))),
                }
            });
            self.finish_parked(env, done, &failed);
            if round == 1 || syncs_wanted.is_empty() {
                return;
            }
            let mut ran = false;
            for (device, note) in syncs_wanted {
                match self.syncs.try_sync(env.backend, device, note) {
                    Ok(Synced::Ran) => {
                        Counters::add(&env.counters().device_syncs, 1);
                        ran = true;
                    }
                    Ok(Synced::Already) => ran = true,
                    Ok(Synced::Busy) => {}
                    // Their copies are not known to have finished: the next
                    // round leaks them.
                    Err(e) => {
                        failed.push((device, e));
                        ran = true;
                    }
                }
            }
            if !ran {
                return;
            }
        }
    }

    fn finish_parked(
        &self,
        env: Env<'_>,
        done: Vec<(Returned, Result<(), Failed>)>,
        failed: &[(usize, Error)],
    ) {
        for (mut returned, outcome) in done {
            match outcome {
                Ok(()) if returned.release => self.release_returned(env, returned),
                Ok(()) => {
                    returned.quiet = true;
                    self.prepare(env, returned);
                }
                Err(Failed::Fence(e)) => Self::fail(env, returned, &e),
                Err(Failed::Sync(i)) => Self::fail(env, returned, &failed[i].1),
            }
        }
    }

    /// Zeroes the dirty prefix and, for a buffer about to be registered,
    /// pre-faults the rest; splits the work across workers when large.
    fn prepare(&self, env: Env<'_>, returned: Returned) {
        let block = returned.block();
        let register = self.pins && !block.is_pinned();
        let dirty = block.dirty();
        let end = if register { block.footprint() } else { dirty };
        let base = block.as_ptr();
        Counters::add(&env.counters().bytes_zeroed, dirty as u64);
        if end <= Tune::CHUNK {
            block.contents().write();
            // SAFETY: the worker owns the returned block, whose copies have
            // finished, and `dirty <= end <= footprint`.
            unsafe { clean_range(base, 0, end, dirty) };
            self.finish(env, returned);
            return;
        }
        let chunks = end.div_ceil(Tune::CHUNK);
        let lane = if register {
            Lane::Register
        } else {
            Lane::Recycle
        };
        let task = Arc::new(Chunked {
            contents: block.contents().clone(),
            returned: Mutex::new(Some(returned)),
            base: base as usize,
            dirty,
            end,
            remaining: AtomicUsize::new(chunks),
        });
        // Every chunk goes through the queue, the first included, so that
        // a worker draining a batch of large buffers hands all of their
        // chunks out before zeroing any itself.
        for chunk in 0..chunks {
            self.lanes.push(lane, Job::Chunk(Arc::clone(&task), chunk));
        }
    }

    fn run_chunk(&self, env: Env<'_>, task: &Chunked, chunk: usize) {
        let start = chunk * Tune::CHUNK;
        let end = (start + Tune::CHUNK).min(task.end);
        task.contents.write_part(chunk);
        // SAFETY: chunks are disjoint ranges of a block owned by `task`,
        // which holds it (unmoved) until the last chunk finishes.
        unsafe { clean_range(task.base as *mut u8, start, end, task.dirty) };
        // AcqRel: Release publishes this chunk's writes; the finishing
        // worker's Acquire sees every chunk's writes before registering and
        // pooling the buffer.
        if task.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let returned = task.returned.lock().take();
            if let Some(returned) = returned {
                self.finish(env, returned);
            }
        }
    }

    /// Registers the buffer on its first cycle (the whole slab, for the
    /// head of one, whose siblings are carved then), then admits it.
    fn finish(&self, env: Env<'_>, mut returned: Returned) {
        let counters = env.counters();
        let pins = self.pins;
        let block = returned.block_mut();
        block.meta_mut().dirty = 0;
        if pins && !block.is_pinned() {
            let started = Instant::now();
            let (base, len) = block.region();
            // SAFETY: the region is a live mapping that stays mapped until
            // it is unregistered in `release`.
            let registered = unsafe { env.backend.register(block.device(), base, len) };
            match registered {
                Ok(()) => {
                    block.set_registered();
                    let took = started.elapsed();
                    counters.registered(len as u64);
                    Counters::add(&counters.registration_nanos, took.as_nanos() as u64);
                    tracing::debug!(bytes = len, ?took, "pinpool: registered a buffer");
                }
                Err(e) => {
                    Counters::add(&counters.registration_failures, 1);
                    tracing::warn!(error = %e, bytes = len, "pinpool: registration failed; freeing the buffer");
                    self.release_returned(env, returned);
                    return;
                }
            }
        }
        let siblings = block.carve();
        if let Some(at) = block.meta_mut().dropped_at.take() {
            counters.record_ready(at.elapsed());
        }
        Counters::add(&counters.recycled, 1);
        let meta = block.meta_mut();
        meta.returned = false;
        let parity = usize::from(meta.parity);
        let (home, to_shard) = (returned.home, returned.to_shard);
        let block = returned.into_block();
        // SAFETY: see `Returned`'s `Send` impl.
        let home = unsafe { home.as_ref() };
        let place = (!to_shard).then_some(home);
        for block in siblings.into_iter().chain(std::iter::once(block)) {
            let evicted = env.admission.admit(env.places, block, place);
            release_all(env, evicted);
        }
        home.complete(parity, false);
    }

    /// Frees a quiescent returned buffer and counts its completion.
    fn release_returned(&self, env: Env<'_>, mut returned: Returned) {
        let meta = returned.block_mut().meta_mut();
        meta.returned = false;
        let parity = usize::from(meta.parity);
        let home = returned.home;
        release(env.backend, env.counters(), returned.into_block());
        // SAFETY: see `Returned`'s `Send` impl.
        unsafe { home.as_ref() }.complete(parity, false);
    }

    /// Moves buffers waiting in `caches` for their owners to the cleaner:
    /// all of them (`flush`), or only those of caches whose owner has been
    /// idle since the last sweep, whose ready buffers also go to the shards
    /// (where any thread finds them without locking an owner out) and whose
    /// dropped buffers go there once clean.
    pub(crate) fn move_waiting(&self, at: Places<'_>, cap: usize, only_idle: bool) -> usize {
        let caches = at.caches;
        let mut sweep = self.sweep.lock();
        let candidates: Vec<&ThreadCache> = caches
            .iter()
            .filter(|c| {
                let activity = c.activity();
                let key = *c as *const ThreadCache as usize;
                let last = sweep.seen.insert(key, activity);
                if only_idle {
                    last == Some(activity) && (c.has_waiting() || c.has_ready())
                } else {
                    c.has_waiting()
                }
            })
            .collect();
        drop(sweep);
        let mut moved = 0;
        for cache in &candidates {
            for block in cache.returns().take_all() {
                self.submit_to(cache, block, cap, only_idle, false);
                moved += 1;
            }
        }
        let mut locked = caches.lock_out(candidates.into_iter());
        locked.each(|cache, lists| {
            for block in lists.take_deferred(cache) {
                self.submit_to(cache, block, cap, only_idle, false);
                moved += 1;
            }
            if only_idle {
                for block in lists.take_ready(cache, None) {
                    moved += 1;
                    if let Err(block) = at.shards[block.device()].push(block) {
                        // The shard's class is full (2^32 buffers): keep it.
                        lists.put_ready(cache, block);
                    }
                }
            }
        });
        moved
    }

    /// Worker 0, idle: sweeps caches whose owners went idle, backing off
    /// while sweeps find nothing.
    fn sweep_if_due(&self, env: Env<'_>) {
        {
            let sweep = self.sweep.lock();
            if Instant::now() < sweep.due {
                return;
            }
        }
        let moved = self.move_waiting(env.places, env.places.caches.cap(), true);
        let mut sweep = self.sweep.lock();
        sweep.wait = if moved > 0 {
            Tune::SWEEP_MIN
        } else {
            (sweep.wait * 2).min(Tune::SWEEP_MAX)
        };
        sweep.due = Instant::now() + sweep.wait;
    }
}

impl Cleaner {
    /// Runs a provisioning tick (see [`Provisioner`]): releases what it
    /// trimmed and pins what it provisions. `force` trims now
    /// (`Pool::trim`).
    pub(crate) fn provision(&self, env: Env<'_>, force: bool) {
        let quiet = crate::flush::in_flight(env.places.caches.counts()) == 0;
        let plan = env
            .provisioner
            .tick(env.places, env.admission, quiet, force);
        let trimmed: u64 = plan.trimmed.iter().map(|b| b.footprint() as u64).sum();
        Counters::add(&env.counters().trimmed_bytes, trimmed);
        release_all(env, plan.trimmed);
        if plan.provision.is_empty() {
            return;
        }
        let orphan = &env
            .places
            .caches
            .iter()
            .last()
            .expect("the orphan cache is last");
        let cap = env.places.caches.cap();
        for mut block in plan.provision {
            orphan.count_returned(&mut block);
            self.submit_reserved(orphan, block, cap);
        }
    }
}

/// Unregisters (if pinned) and frees `block`; a buffer whose unregistration
/// fails is leaked (unmapping registered memory would be worse).
pub(crate) fn release(backend: &dyn Backend, counters: &Counters, mut block: Block) {
    block.fences_mut().release();
    Counters::add(&counters.released, 1);
    if !block.is_pinned() {
        drop(block);
        return;
    }
    let device = block.device();
    match block.unpin() {
        Unpinned::Alone(mut block) => {
            // SAFETY: the block was registered by this backend, and every
            // caller knows its copies have finished (ready, or fences done).
            if unsafe { unregister(backend, counters, device, block.as_ptr(), block.footprint()) } {
                block.set_pinned(false);
                drop(block);
            } else {
                // Counted leaked by `unregister`: the block's own mapping.
                let _ = block.leak();
            }
        }
        // Other buffers of the slab are live: it stays registered.
        Unpinned::Shared => {}
        Unpinned::Last(slab) if slab.registered() => {
            // SAFETY: the slab was registered by this backend at its base,
            // and no buffer of it is left, so no copy from it is in flight.
            if unsafe { unregister(backend, counters, device, slab.base(), slab.len()) } {
                slab.set_unregistered();
                slab.free();
            } else {
                slab.leak();
            }
        }
        Unpinned::Last(slab) => slab.free(),
    }
}

/// Unregisters the `bytes` registered at `ptr`, counting the outcome; false
/// if it failed, and the caller must leak the memory.
///
/// # Safety
/// As [`Backend::unregister`].
unsafe fn unregister(
    backend: &dyn Backend,
    counters: &Counters,
    device: usize,
    ptr: *mut u8,
    bytes: usize,
) -> bool {
    // SAFETY: the caller's guarantee.
    match unsafe { backend.unregister(device, ptr) } {
        Ok(()) => {
            Counters::add(&counters.unregistered_bytes, bytes as u64);
            true
        }
        Err(e) => {
            Counters::add(&counters.unregister_failures, 1);
            Counters::add(&counters.leaked_bytes, bytes as u64);
            tracing::error!(error = %e, bytes, "pinpool: unregistering failed; leaking the memory");
            false
        }
    }
}

/// Releases every block of `blocks` (evicted or cleared: quiescent).
pub(crate) fn release_all(env: Env<'_>, blocks: Vec<Block>) {
    for block in blocks {
        release(env.backend, env.counters(), block);
    }
}
