//! The cleaner: a pool of workers that turns dropped buffers into ready
//! ones. The [design account](crate::implementation) tells the whole
//! journey; this folder holds the cleaner's part of it:
//!
//! - [`intake`]: where a drop that its thread cache does not keep comes in
//!   (the thread caches hold it directly): the backlogs, bounded, and
//!   what is [shed](intake::Intake::shed) past them without a driver call
//!   or a lock on the dropping thread (a pageable buffer freed there, its
//!   fences to the cleaner through [`spent`]; a pinned one released by the
//!   cleaner in bulk);
//! - [`lanes`]: the work queue. Drops arrive as [`Job`]s on the *recycle*
//!   lane (already registered, or never to be) or the *register* lane
//!   (first registrations, milliseconds each); worker 0 reads only the
//!   recycle lane (unless it is the only worker), so a burst of
//!   registrations never starves recycling, and the others take the
//!   register lane first one pop in eight, so recycling never starves
//!   registrations;
//! - [`job`]: what travels: a dropped buffer with the inbox of its cache;
//! - [`parking`]: buffers whose fences have not completed wait there,
//!   re-polled by idle workers, so one slow copy holds up nothing else,
//!   and returned misses waiting for their regions' growth or demand;
//! - [`device_sync`]: device synchronizes for pinned buffers dropped
//!   without events, one covering every buffer dropped before it started;
//! - this file: the workers and the work itself: re-zero the dirty prefix,
//!   and before a first registration touch every page, in
//!   [`CHUNK`]-sized jobs that any worker runs; register once; then hand
//!   the buffer to admission and close its flush ticket;
//! - `sweep.rs`: sweeps (buffers left in the caches of threads that went
//!   idle are moved along after a while, and `flush` moves them along at
//!   once) and the provisioning tick; `late.rs`: a closed pool's late
//!   buffers; `release.rs`: unregistering and freeing.
//!
//! The cleaner reaches its pool only through admission and the cache list
//! ([`Env`]). A worker never blocks on a copy (fences are polled), and a job
//! that panics (a backend or allocator bug) is caught by its worker: the
//! buffer it held is leaked, not lost, its completion counted, and the
//! worker carries on.
//!
//! [`CHUNK`]: crate::tune::Tuning::CHUNK

pub(crate) mod device_sync;
pub(crate) mod intake;
pub(crate) mod job;
pub(crate) mod lanes;
pub(crate) mod late;
pub(crate) mod parking;
mod release;
pub(crate) mod spent;
mod sweep;

use std::time::{Duration, Instant};

use crate::admission::{Admission, Places};
use crate::alloc::{clean_range, Block, Fold, Regions};
use crate::backend::Backend;
use crate::error::Error;
use crate::provision::Provisioner;
use crate::stats::Counters;
use crate::sync::{thread, Arc, AtomicBool, AtomicUsize, HintCounter, Mutex, Ordering};
use crate::trace;
use crate::tune::{Tune, Tuning};
use lanes::{Lane, Popped};

use device_sync::Synced;
use intake::Intake;
pub(crate) use job::Returned;
use job::{Chunked, Job};
use parking::Parking;
pub(crate) use release::{
    cap_slack, cool, fit_regions_to_cap, give_back, release, release_all, release_region,
    release_regions, release_regions_over_budget, Releaser,
};

/// What the cleaner reaches of its pool.
#[derive(Clone, Copy)]
pub(crate) struct Env<'a> {
    pub(crate) backend: &'a dyn Backend,
    pub(crate) admission: &'a Admission,
    pub(crate) places: Places<'a>,
    pub(crate) provisioner: &'a Provisioner,
}

impl<'a> Env<'a> {
    fn counters(&self) -> &Counters {
        &self.places.caches.counters
    }

    /// What releasing one of the pool's buffers needs.
    pub(crate) fn releaser(&self) -> Releaser<'a> {
        Releaser {
            backend: self.backend,
            counters: &self.places.caches.counters,
            events: &self.places.caches.events,
            trace: self.places.caches.trace.as_deref(),
        }
    }
}

impl Returned {
    /// Leaks the buffer at once (its fence failed) and counts it.
    pub(crate) fn fail_now(self, env: Env<'_>, e: &Error) {
        Cleaner::fail(env, self, e);
    }
}

/// How long worker 0 waits before sweeping idle caches, and what it saw of
/// each cache last time.
#[derive(Debug)]
struct Sweep {
    pub(super) wait: Duration,
    pub(super) due: Instant,
    pub(super) seen: std::collections::HashMap<usize, u64>,
    /// When the caches were last searched for buffers of draining regions
    /// (see `Cleaner::pull_draining`).
    pub(super) pulled: Option<Instant>,
    /// Idle sweeps turned off (`PoolBuilder::idle_sweeps`, for tests).
    pub(super) off: bool,
}

/// The state of a device's synchronize for late buffers.
#[derive(Debug)]
struct LateSync {
    running: AtomicBool,
    failed: Mutex<Option<Error>>,
}

impl LateSync {
    pub(super) fn new() -> Self {
        Self {
            running: AtomicBool::new(false),
            failed: Mutex::new(None),
        }
    }
}

/// The cleaner; see the module docs.
pub(crate) struct Cleaner {
    workers: Mutex<Vec<thread::JoinHandle<()>>>,
    /// Whether workers run (a hint: set under `workers`).
    running: AtomicBool,
    /// How many workers the last start started (0 once stopped): the first
    /// `started` indices run (see `start`).
    started: HintCounter,
    width: usize,
    /// Where drops come in: the lanes, the backlogs, the device
    /// synchronizes (shared with the thread caches).
    intake: Arc<Intake>,
    parking: Parking,
    /// Per device: the synchronize run for closed pools' late buffers.
    late_syncs: Box<[LateSync]>,
    sweep: Mutex<Sweep>,
}

impl std::fmt::Debug for Cleaner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cleaner")
            .field("width", &self.width)
            .field("intake", &self.intake)
            .field("parked", &self.parking.len())
            .finish_non_exhaustive()
    }
}

// === impl Cleaner ===

/// See [`Cleaner::work`]: one pop in this many tries the register lane
/// first.
const REGISTER_TURN: u32 = 8;

/// How long a region must have been wholly free before a growth the
/// pinned budget refuses may fold it in (see `Cleaner::grow_with`): one
/// free for less is in use between takes (a thread taking and dropping a
/// buffer of it in a loop), whose next take would miss once it is folded
/// into a larger buffer's region.
pub(crate) const FOLD_IDLE_AFTER: Duration = Duration::from_millis(100);

/// Why a parked buffer's wait ended without its copies known finished.
enum Failed {
    /// Polling one of its fences failed.
    Fence(Error),
    /// The device synchronize it waited for (the `i`th of a poll) failed.
    Sync(usize),
}

impl Cleaner {
    /// A stopped cleaner of `width` workers for `devices` devices.
    pub(crate) fn new(width: usize, devices: usize, intake: Arc<Intake>) -> Self {
        Self {
            intake,
            workers: Mutex::new(Vec::new()),
            running: AtomicBool::new(false),
            started: HintCounter::new(0),
            width,
            parking: Parking::new(),
            late_syncs: (0..devices).map(|_| LateSync::new()).collect(),
            sweep: Mutex::new(Sweep {
                wait: Tune::SWEEP_MIN,
                due: Instant::now(),
                seen: std::collections::HashMap::new(),
                pulled: None,
                off: false,
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
        self.intake.lanes.stop(workers.len());
        for handle in workers.drain(..) {
            if handle.join().is_err() {
                tracing::error!("pinpool: a cleaner worker panicked");
            }
        }
        self.started.store(0, Ordering::Relaxed);
        self.running.store(false, Ordering::Relaxed);
    }

    /// Frees, in bulk, the pinned buffers that [`shed`](intake::Intake::shed) put on
    /// the caches' release lists, each once its copies are done. One
    /// synchronize per device, waited for here, covers every event-less
    /// buffer of the batch (all were dropped before it starts), so a large
    /// batch neither runs one per buffer nor fills the parking; buffers
    /// with fences are polled, and parked if not done, as any buffer.
    fn release_bulk(&self, env: Env<'_>) {
        let mut batch = Vec::new();
        let mut notes: Vec<(usize, u64)> = Vec::new();
        for cache in env.places.caches.iter() {
            for mut block in cache.inbox().released.take_all() {
                if block.fences_mut().is_empty() {
                    let (device, note) = (block.device(), block.meta_mut().sync_gen);
                    match notes.iter_mut().find(|(d, _)| *d == device) {
                        Some((_, highest)) => *highest = (*highest).max(note),
                        None => notes.push((device, note)),
                    }
                }
                let mut returned = Returned::new(block, cache.inbox(), env.counters());
                returned.release = true;
                batch.push(returned);
            }
        }
        let mut failed: Vec<(usize, Error)> = Vec::new();
        for (device, note) in notes {
            match self.intake.syncs.wait(env.backend, device, note) {
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
            let mut block = returned.into_block();
            let ticket = block.take_ticket();
            release(env.releaser(), block);
            if let Some(ticket) = ticket {
                ticket.close_quietly();
            }
            released = true;
        }
        if released {
            env.places.caches.flush.notify();
        }
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
            let popped = self.intake.lanes.pop(register, register_first, timeout);
            if matches!(popped, Popped::Stop) {
                break;
            }
            Self::contained(env, || {
                if let Popped::Job(job) = popped {
                    self.run(env, job);
                }
                self.poll_parked(env);
                if index == 0 && Tune::SWEEPS {
                    self.sweep_if_due(env);
                    self.provision(env, false);
                }
            });
        }
    }

    /// Runs cleaner work, catching a panic in it (a backend or allocator
    /// bug): it must not take a worker with it, nor escape into a flush,
    /// a shutdown or the close of the last handle that cleans on its own
    /// thread (a close cut short would free the pool's state under the
    /// buffers still out). The buffers a job held are freed or leaked as
    /// it unwinds (see `Returned`), their tickets closed, and the panic is
    /// counted.
    fn contained(env: Env<'_>, work: impl FnOnce()) {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).is_err() {
            Counters::add(&env.counters().worker_panics, 1);
            tracing::error!("pinpool: a cleaner job panicked; its buffer was leaked");
        }
    }

    /// As [`contained`](Self::contained), for the work a flush, shutdown
    /// or close runs on its own thread. Under loom it is not caught: the
    /// models' workerless pools clean inline, and a panic there is a
    /// model's finding (an assertion, a ticket dropped unclosed in a close
    /// that no flush waits on), which must fail the model, not be counted.
    fn inline(env: Env<'_>, work: impl FnOnce()) {
        if cfg!(pinpool_loom) {
            work();
        } else {
            Self::contained(env, work);
        }
    }

    fn run(&self, env: Env<'_>, job: Job) {
        match job {
            Job::Clean(returned) => {
                self.intake
                    .zero_queued
                    .fetch_sub(returned.block().dirty(), Ordering::Relaxed);
                self.intake.recycle_queued.fetch_sub(1, Ordering::Relaxed);
                self.process(env, returned);
            }
            Job::Register(returned) => {
                self.intake.register_queued.fetch_sub(1, Ordering::Relaxed);
                self.process(env, returned);
            }
            Job::Bulk => self.release_bulk(env),
            Job::Spent => {
                for mut fences in self.intake.spent.take_all() {
                    // Spare events back to the pool; the rest destroyed.
                    fences.release(&env.places.caches.events);
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
            while let Some(job) = self.intake.lanes.try_pop() {
                Self::inline(env, || self.run(env, job));
            }
            Self::inline(env, || self.poll_parked(env));
            // A parked buffer that became ready may have queued the chunks
            // of its zeroing: run those too, or nobody will.
            if self.intake.lanes.len() == 0 {
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
            match self.intake.syncs.try_sync(env.backend, device, note)? {
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
        let mut block = returned.take_block().expect("held until finished");
        tracing::error!(
            error = %e,
            bytes = block.footprint(),
            "pinpool: waiting for a buffer's copies failed; leaking the buffer"
        );
        let ticket = block.take_ticket();
        block.fences_mut().abandon();
        let leaked = block.leak();
        Counters::add(&counters.leaked_bytes, leaked as u64);
        if let Some(ticket) = ticket {
            ticket.close(false);
        }
    }

    /// Finishes the parked buffers whose wait is over: copies done, or (a
    /// returned miss) no growth of its regions running and their demand
    /// settled. Those waiting for
    /// a device synchronize (parked while another worker ran one that may
    /// have started before their drop) get one run here if none is
    /// running, and are looked at again.
    fn poll_parked(&self, env: Env<'_>) {
        let mut failed: Vec<(usize, Error)> = Vec::new();
        for round in 0..2 {
            let mut syncs_wanted: Vec<(usize, u64)> = Vec::new();
            let done = self.parking.poll(|returned| {
                if let Some(since) = returned.growth {
                    // Waiting for a growth of its regions, or for their
                    // demand to settle (a bounded time), not for copies.
                    let block = returned.block();
                    let regions = env.places.shards[block.device()].regions();
                    // Settled first: the growth lock is tried only then.
                    let settled = waited_out(since) || !regions.growth_waits();
                    return (settled && !regions.growth_running()).then_some(Ok(()));
                }
                let block = returned.block_mut();
                if block.fences_mut().is_empty() && block.is_pinned() {
                    let (device, note) = (block.device(), block.meta_mut().sync_gen);
                    if self.intake.syncs.settled(device, note) {
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
                match self.intake.syncs.try_sync(env.backend, device, note) {
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
        if self.replaces(block) {
            // Replaced by a block carved from a region (`finish`): its
            // bytes are freed, not cleaned.
            self.finish(env, returned);
            return;
        }
        let register = self.intake.pins && !block.is_pinned();
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
            self.intake
                .lanes
                .push(lane, Job::Chunk(Arc::clone(&task), chunk));
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
        let pins = self.intake.pins;
        let parked = returned.growth.take();
        let block = returned.block_mut();
        block.meta_mut().dirty = 0;
        if self.replaces(block) {
            // A pageable buffer (a miss, or memory to pin ahead of demand):
            // a block of its class carved from a region takes its place,
            // and its own memory goes back to the OS.
            let waited = parked.is_some_and(waited_out);
            let mut carved = match self.carve_for(env, block, waited) {
                Replacement::Carved(carved) => carved,
                Replacement::Freed => {
                    self.release_returned(env, returned);
                    return;
                }
                Replacement::AfterGrowth => {
                    // Parked, so that a flush waits for it, and re-polled
                    // by idle workers once the growth has ended.
                    returned.growth = Some(parked.unwrap_or_else(Instant::now));
                    self.parking.park(returned);
                    return;
                }
            };
            block.hand_over(&mut carved);
            let mut old = returned.replace_block(carved);
            // Pageable and quiescent (its fences are done): unmapped here.
            old.fences_mut().release(&env.places.caches.events);
            drop(old);
        }
        let block = returned.block_mut();
        if pins && !block.is_pinned() {
            let (base, len) = block.region();
            // Admitted against the budget with every registration under
            // way (memory `reserve` asked for was admitted when asked: its
            // registration takes that admission over).
            let mut share = Claim::reserve_share(counters, block);
            let Some(claim) = Claim::for_memory(counters, len as u64, Some(&mut share)) else {
                // The pinned budget is spent (by registrations since the
                // drop was taken in): free it rather than pin past it.
                Counters::add(&counters.registrations_skipped, 1);
                tracing::debug!(
                    bytes = len,
                    "pinpool: the pinned budget is spent; freeing a miss buffer"
                );
                self.release_returned(env, returned);
                return;
            };
            let started = Instant::now();
            // SAFETY: the region is a live mapping that stays mapped until
            // it is unregistered in `release`.
            let registered = unsafe { env.backend.register(block.device(), base, len) };
            let held = [len as u64];
            claim.settle(if registered.is_ok() { &held } else { &[] });
            match registered {
                Ok(()) => {
                    block.set_registered();
                    let took = started.elapsed();
                    Counters::add(&counters.registration_nanos, took.as_nanos() as u64);
                    tracing::debug!(bytes = len, ?took, "pinpool: registered a buffer");
                    trace_registration(env, block.device(), base, len, took, 0);
                }
                Err(e) => {
                    let took = started.elapsed();
                    trace_registration(
                        env,
                        block.device(),
                        base,
                        len,
                        took,
                        trace::REGISTER_FAILED,
                    );
                    Counters::add(&counters.registration_failures, 1);
                    tracing::warn!(error = %e, bytes = len, "pinpool: registration failed; freeing the buffer");
                    self.release_returned(env, returned);
                    return;
                }
            }
        }
        if pins && block.is_pinned() && !counters.fits_pinned(0) {
            // Past a lowered pinned budget: give the memory back rather
            // than pool it pinned (a carved buffer's region with it, once
            // wholly free).
            self.release_returned(env, returned);
            release_regions_over_budget(env.releaser(), env.places.shards);
            return;
        }
        if let Some(at) = block.meta_mut().dropped_at.take() {
            counters.record_ready(at.elapsed());
        }
        Counters::add(&counters.recycled, 1);
        let back_to_region = block.is_region_memory()
            && !block.is_reserved_in(env.admission.reservations())
            && (!env.provisioner.is_hot(block.slot()) || !block.region_listed());
        if back_to_region {
            // A buffer of a class not in demand (not hot) goes back to its
            // region, where it coalesces with its free neighbours: the
            // next take of any size carves from there (see
            // `alloc::region`). So does any buffer of a region unlisted
            // while it was out (by `shutdown`, or drained), so that the
            // region goes with its last buffer. A reserved one stays
            // pooled: while its region drains (a drain it keeps from ending
            // is given up: see `Regions::settle_drains`), and where a
            // `shutdown` or `clear` unlisted its region (a `reserve` that
            // raced it, whose reservation the clear began: the region
            // goes once a later clear has forgotten it).
            let mut block = returned.into_block();
            let ticket = block.take_ticket();
            give_back(env.releaser(), block);
            if let Some(ticket) = ticket {
                ticket.close(false);
            }
            return;
        }
        // The head of a new slab carves its siblings once it stays pooled
        // (one going back to its region gives the page back whole).
        let siblings = block.carve();
        let ticket = block.take_ticket();
        let (home, to_shard) = (returned.home, returned.to_shard);
        let block = returned.into_block();
        // SAFETY: see `Returned`'s `Send` impl.
        let home = unsafe { home.as_ref() };
        // A buffer of region memory goes to its shard, where a take short
        // of memory can give it back to its region (see `Shared::carve`) and
        // the sweep gives it up once its class is cold (see
        // `release::cool`), not to a cache, whose ready lists neither
        // looks in.
        let place = (!to_shard && !block.is_region_memory()).then_some(home);
        for block in siblings.into_iter().chain(std::iter::once(block)) {
            let evicted = env.admission.admit(env.places, block, place);
            release_all(env.releaser(), evicted);
        }
        if let Some(ticket) = ticket {
            ticket.close(false);
        }
    }

    /// Whether `block`, pageable on a pool that carves from regions, is
    /// replaced in `finish` by a block carved from a region (a slab's head
    /// by the head of a slab carved from one), its own memory freed.
    fn replaces(&self, block: &Block) -> bool {
        self.intake.regions && !block.is_pinned()
    }

    /// Pins memory for a pageable buffer that came back (a miss, or one
    /// to pin ahead of demand): first grows its device's regions by what
    /// they fall short of the most its takes wanted at once (one
    /// registration, within the pinned budget), then carves a block of its
    /// class to take its place from what they have free, unless it would
    /// go back to its region anyway (its class is not hot, nor was it asked
    /// for by `reserve`): then `None`, and the next take of its size
    /// carves. Only memory `reserve` asked for grows the regions by its own
    /// size when none is free; any other replacement is `None` then (its
    /// class may hold idle buffers already, and the demand decides growth).
    ///
    /// While another worker grows the set, only memory `reserve` asked for
    /// waits for it here; any other returned miss is parked until that
    /// growth ends ([`Replacement::AfterGrowth`]), so that this worker goes
    /// on recycling and a flush still finds the demand met once it
    /// returns. So is a returned miss while a growth is due and the set's
    /// demand is still rising (see [`Regions::growth_waits`]), unless it
    /// has `waited` [`GROWTH_SETTLE_MAX`] parked already: a burst of takes
    /// that missed grows the set once, when it settles, for the whole
    /// burst, rather than once for its first misses back and again for the
    /// rest (a flush waits for parked misses, so it still returns with the
    /// burst's demand met).
    ///
    /// [`Regions::growth_waits`]: crate::alloc::Regions::growth_waits
    /// [`GROWTH_SETTLE_MAX`]: crate::tune::Tuning::GROWTH_SETTLE_MAX
    fn carve_for(&self, env: Env<'_>, like: &mut Block, waited: bool) -> Replacement {
        // What `reserve` admitted for it: taken over by its growth below,
        // else given back (carved from memory pinned already, or freed).
        let mut share = Claim::reserve_share(env.counters(), like);
        let device = like.device();
        let classes = &env.places.caches.classes;
        // A slab's head takes a page for its slab.
        let footprint = like.carve_len(classes);
        let regions = env.places.shards[device].regions();
        let _growing = if like.is_reserved() {
            regions.growing()
        } else {
            match regions.try_growing() {
                Some(_) if !waited && regions.growth_waits() => return Replacement::AfterGrowth,
                Some(guard) => guard,
                None => return Replacement::AfterGrowth,
            }
        };
        let short = regions.take_shortfall();
        // Within the budget, as every growth (memory `reserve` asked for
        // grows with its own admission, below). At least what the shortfall needs
        // (another miss's buffer, which must fit in one extent, or the
        // demand past what is held), not only this buffer, so that a
        // budget or a failed registration that makes the growth smaller
        // does not leave out what other misses wait for; failing that,
        // this buffer alone, and the shortfall stays unmet.
        if short.want > 0 && !Self::merge(env, device, regions, short) {
            let least = short.need.max(footprint);
            let whole = short.whole.max(footprint);
            if !Self::grow(env, device, regions, short.want, (least, whole), None) {
                regions.unmet_merge(short);
                if least > footprint {
                    Self::grow(
                        env,
                        device,
                        regions,
                        footprint,
                        (footprint, footprint),
                        None,
                    );
                }
            }
        }
        if !like.is_reserved() && !env.provisioner.is_hot(like.slot()) {
            return Replacement::Freed;
        }
        if let Some(at) = regions.carve(footprint) {
            return Replacement::Carved(Block::carved_like(classes, like, at));
        }
        // Memory `reserve` asked for is pinned whatever the demand; any
        // other replacement only comes from what the demand grew (its
        // class may well hold idle buffers already).
        if like.is_reserved()
            && Self::grow(
                env,
                device,
                regions,
                footprint,
                (footprint, footprint),
                Some(&mut share),
            )
        {
            if let Some(at) = regions.carve(footprint) {
                return Replacement::Carved(Block::carved_like(classes, like, at));
            }
        }
        Replacement::Freed
    }

    /// Makes one extent for a buffer of `short.merge` bytes out of wholly
    /// free regions of `device`, moved together and registered again as
    /// one region, if the regions hold the bytes the demand needs (see
    /// [`Shortfall`]): no bytes added, where a growth would add the
    /// buffer's whole footprint (which the cap would then release once
    /// idle, the pinned bytes past what the working set needs). Whether it
    /// did; else the caller grows.
    ///
    /// [`Shortfall`]: crate::alloc::Shortfall
    pub(crate) fn merge(
        env: Env<'_>,
        device: usize,
        regions: &Regions,
        short: crate::alloc::Shortfall,
    ) -> bool {
        if short.merge == 0 {
            return false;
        }
        let Some(plan) = regions.merge_plan(short.merge, Duration::ZERO) else {
            return false;
        };
        Self::grow_with(
            env,
            device,
            regions,
            0,
            (0, 0),
            None,
            Some((plan, short.merge)),
        )
    }

    /// The bytes the regions of every device may grow by before they pass
    /// the cap, when the cap is given (`None` while it follows the working
    /// set, which rises with the demand the regions grow for).
    fn cap_room(env: Env<'_>) -> Option<usize> {
        let (cap, follows) = env.admission.cap_and_follows(env.places);
        if follows {
            return None;
        }
        let held: usize = env
            .places
            .shards
            .iter()
            .map(|s| s.regions().listed_bytes())
            .sum();
        Some(cap.saturating_sub(held))
    }

    /// Registers a region of `device` of at least `want` bytes (see
    /// [`Regions::next_len`]), retrying smaller, down to `least` bytes, if
    /// the pinned budget or the registration fails; within the budget, with
    /// what `reserve` admitted for the memory (`reserved`, taken over by
    /// the first registration) counted as room. Under a given cap, a
    /// growth other than for `reserve` stops at the cap's room (see
    /// `grow_with`) where that holds `whole`, the largest buffer it is for.
    /// A growth for one buffer that the budget refuses even at its
    /// footprint folds regions of `device` wholly free for
    /// [`FOLD_IDLE_AFTER`] or longer into its region, adding only the
    /// rest, or merges them if they hold the buffer together. Whether one
    /// was registered (for such a growth: one that holds the buffer).
    ///
    /// [`Regions::next_len`]: crate::alloc::Regions::next_len
    pub(crate) fn grow(
        env: Env<'_>,
        device: usize,
        regions: &Regions,
        want: usize,
        (least, whole): (usize, usize),
        reserved: Option<&mut Claim<'_>>,
    ) -> bool {
        Self::grow_with(env, device, regions, want, (least, whole), reserved, None)
    }

    /// As [`grow`](Self::grow); with `merge` (a plan of
    /// `Regions::merge_plan`, and the length it is for), adds no bytes and
    /// folds the regions of the lengths the plan names, once: whether the
    /// region it made (or, its registration failing, the one the folded
    /// regions were registered again as) holds that length (a region of
    /// the plan carved from, or whose unregistration failed, since the
    /// plan is left out).
    fn grow_with(
        env: Env<'_>,
        device: usize,
        regions: &Regions,
        want: usize,
        (least, whole): (usize, usize),
        mut reserved: Option<&mut Claim<'_>>,
        mut merge: Option<(Fold, usize)>,
    ) -> bool {
        let merging = merge.as_ref().map(|(_, len)| *len);
        let counters = env.counters();
        // Growths of a set run one at a time, under its growth lock, which
        // `Regions::wait_for_growths` relies on.
        debug_assert!(regions.growth_running(), "a growth outside the growth lock");
        let _under_way = regions.growth_begins();
        let footprint = least;
        let mut len = if merging.is_some() {
            0
        } else {
            regions.next_len(want, least)
        };
        // Under a cap that is given (a bound on idle bytes: regions past it
        // go once wholly free, whole, as one registration cannot be
        // released in part), a growth that would take the regions of every
        // device past the cap (see `Cleaner::cap_room`) stops at it, in a
        // region of its own, though the demand needs more, if the room is
        // `REGION_MIN` at least and holds `whole` (the largest buffer the
        // growth is for, which must lie in one region); the rest is left
        // to the next growth, whose region folds nothing. A region holding
        // both what the cap keeps and what it does not would go whole once
        // idle, and a workload whose steps hold more than the cap would
        // miss every take (one region grown, and released, per step).
        let cap_room = if merging.is_none() && reserved.is_none() {
            Self::cap_room(env)
        } else {
            None
        };
        if let Some(room) = cap_room {
            let within = regions.fit_len_within(room);
            if len > room && within >= Tune::REGION_MIN.max(regions.fit_len(whole)) {
                len = within;
            }
        }
        // Whether this growth takes the regions past a given cap: it folds
        // no region, so that those within the cap stay apart from it.
        let past_cap = cap_room.is_some_and(|room| len > room);
        // The set's wholly free regions go into the new one (see
        // `Regions::grow`): a set grown in steps keeps a few large regions,
        // and a buffer as large as the set's largest still finds one
        // extent that holds it. Planned once the budget has admitted the
        // growth itself (what it adds: the folded regions are registered
        // already, and are admitted again past the budget, below, only so
        // that no other registration takes their room between their
        // unregistration and the new one; until then they count twice,
        // which can only make another registration wait). Only the first
        // attempt folds (a failed registration registers what it folded
        // again on its own, or frees it).
        let mut first = true;
        // Wholly free regions to fold into a growth that the budget
        // refuses whole (see below).
        let mut to_fit: Option<Fold> = None;
        // Whether this growth folded them: it is for `footprint`, which it
        // holds only if every region planned was still wholly free.
        let mut fitted = false;
        loop {
            if merging.is_none()
                && !counters.fits_pinned(len as u64)
                && len > regions.fit_len(footprint)
            {
                len = regions.fit_len(footprint);
                continue;
            }
            // The budget has no room for even `footprint` beside what is
            // pinned: regions wholly free for `FOLD_IDLE_AFTER` or longer,
            // folded in (pinned already), make up part of it, and the
            // growth adds only the rest (at least `REGION_MIN`, in huge
            // pages once it is one or more, so that the pages moved in
            // after it stay aligned); if they hold `footprint` together,
            // they are merged, adding nothing. Regions of other devices
            // (which cannot be folded: another device's memory, on its
            // node) wholly free for `Cleaner::elsewhere_after` or longer
            // are released for the room the budget still lacks, if they
            // hold it all. Within a given cap's room (what the growth
            // adds), and not for memory `reserve` asked for; and only for
            // one buffer that must fit whole (`least` no more than
            // `whole`): a demand past what the regions hold needs bytes
            // added, which folding does not add.
            if merging.is_none()
                && first
                && reserved.is_none()
                && footprint <= whole
                && !counters.fits_pinned(len as u64)
            {
                let plan = regions.idle_cover(footprint, FOLD_IDLE_AFTER);
                let folded: usize = plan.lens.iter().sum();
                let fit = if folded >= footprint {
                    regions
                        .merge_plan(footprint, FOLD_IDLE_AFTER)
                        .map(|plan| (0, plan))
                } else if folded > 0 {
                    let rest = regions.next_len(footprint - folded, 0);
                    (rest < len && cap_room.is_none_or(|room| rest <= room)).then_some((rest, plan))
                } else {
                    Some((len, plan))
                };
                if let Some((rest, plan)) = fit {
                    if rest > 0 && !counters.fits_pinned(rest as u64) {
                        Self::release_idle_elsewhere(env, device, rest);
                    }
                    if rest == 0 || counters.fits_pinned(rest as u64) {
                        len = rest;
                        to_fit = Some(plan);
                    }
                }
            }
            // Admitted against the budget with every registration under
            // way, taking over what `reserve` admitted for the memory.
            let Some(claim) = Claim::for_memory(counters, len as u64, reserved.as_deref_mut())
            else {
                Counters::add(&counters.registrations_skipped, 1);
                tracing::debug!(
                    bytes = len,
                    "pinpool: the pinned budget is spent; no region"
                );
                return false;
            };
            let fold = match (merge.take(), std::mem::take(&mut first)) {
                (Some((plan, _)), _) => plan,
                (None, true) if to_fit.is_some() => {
                    fitted = true;
                    to_fit.take().unwrap_or_default()
                }
                (None, true) if !past_cap => Fold::from(regions.fold_plan(len)),
                (None, _) => Fold::default(),
            };
            // The regions it folds are registered now, and will be again
            // within its registration: their bytes are admitted from now to
            // that registration, so that no other registration takes their
            // room between their unregistration and it.
            let claim = claim.and(fold.lens.iter().sum::<usize>() as u64);
            let mut unregister = |region| {
                Counters::add(&counters.regions_released, 1);
                release::unregister_region(env.releaser(), device, region)
            };
            // Each registration call: where, how many bytes, how long it
            // took, whether it held (a failed growth that folded regions
            // registers them again on their own: a second call).
            let mut calls = Vec::new();
            let mut register = |ptr: *mut u8, n: usize| {
                let started = Instant::now();
                // SAFETY: a fresh mapping of `n` bytes, which stays mapped
                // until the region is unregistered in `release_region`.
                let result = unsafe { env.backend.register(device, ptr, n) };
                let took = started.elapsed();
                // Traced here, before the region is listed: its
                // unregistration (a `clear` may come at once) follows it.
                let flags = trace::REGISTER_REGION
                    | if result.is_ok() {
                        0
                    } else {
                        trace::REGISTER_FAILED
                    };
                trace_registration(env, device, ptr, n, took, flags);
                calls.push((ptr, n, took, result.is_ok()));
                result
            };
            let grown = regions.grow(len, fold, &mut unregister, Some(&mut register));
            if calls.is_empty() && grown.is_err() {
                // It failed to map: counted as a failed registration (a
                // merge that moved nothing made no call, and failed none).
                calls.push((std::ptr::null_mut(), len, Duration::ZERO, false));
            }
            let held: Vec<u64> = calls.iter().filter(|c| c.3).map(|c| c.1 as u64).collect();
            claim.settle(&held);
            for (at, bytes, took, held) in calls {
                if held {
                    Counters::add(&counters.registration_nanos, took.as_nanos() as u64);
                    tracing::debug!(bytes, ?took, "pinpool: registered a region");
                } else if !at.is_null() {
                    Counters::add(&counters.registration_failures, 1);
                } else {
                    // It failed to map: counted, and traced, as a failed
                    // registration.
                    Counters::add(&counters.registration_failures, 1);
                    let flags = trace::REGISTER_REGION | trace::REGISTER_FAILED;
                    trace_registration(env, device, at, bytes, took, flags);
                }
            }
            match grown {
                Ok(_) if reserved.is_none() && !counters.fits_pinned(0) => {
                    // The budget was lowered while the registration ran:
                    // what it made, wholly free, goes again at once.
                    release_regions_over_budget(env.releaser(), env.places.shards);
                    return false;
                }
                Ok(total) if fitted => return total >= footprint,
                Ok(total) => return merging.is_none_or(|asked| total >= asked),
                Err(failed) if merging.is_some() || (fitted && len == 0) => {
                    tracing::warn!(
                        error = %failed.error,
                        kept = ?failed.kept,
                        "pinpool: registering merged regions failed"
                    );
                    // Registered again as one region, they hold it still (a
                    // merge the budget made for `footprint`, too).
                    let asked = merging.unwrap_or(footprint);
                    return failed.kept.is_some_and(|kept| kept >= asked);
                }
                Err(failed) => {
                    tracing::warn!(
                        error = %failed.error,
                        bytes = len,
                        kept = ?failed.kept,
                        "pinpool: registering a region failed"
                    );
                    let smaller = regions.fit_len(footprint).max(len / 2);
                    if smaller >= len {
                        return false;
                    }
                    len = smaller;
                }
            }
        }
    }

    /// How long a region must have been wholly free before a growth on
    /// another device that the pinned budget refuses may release it for
    /// the room (see `Cleaner::grow_with`): a quarter of the idle-trim time
    /// (of 30 s when idle trimming is off), at least [`FOLD_IDLE_AFTER`]:
    /// a region its device takes from every few seconds stays.
    pub(crate) fn elsewhere_after(env: Env<'_>) -> Duration {
        (env.provisioner.window() / 4).max(FOLD_IDLE_AFTER)
    }

    /// Releases regions of devices other than `device` wholly free for
    /// [`elsewhere_after`](Self::elsewhere_after) or longer, the fewest
    /// bytes that leave room under the pinned budget for a growth of
    /// `bytes` (the registrations under way counted), if they hold that
    /// much and no more than `bytes` (a small buffer's growth does not
    /// release a larger region another device's buffer will want again);
    /// else none. Within four idle-trim times of the last such release,
    /// only regions wholly free for a whole idle-trim time go (see
    /// `Provisioner::move_room`).
    fn release_idle_elsewhere(env: Env<'_>, device: usize, bytes: usize) {
        let counters = env.counters();
        env.provisioner
            .move_room(Self::elsewhere_after(env), |after| {
                let eligible = |idle: Duration, _| idle >= after;
                let lack = counters.pinned_lack(bytes as u64);
                let Ok(lack) = usize::try_from(lack) else {
                    return false;
                };
                if lack == 0 {
                    return false;
                }
                // (length, device, key) of the other devices' regions idle
                // long enough, the shortest first.
                let mut free: Vec<(usize, usize, u64)> = Vec::new();
                for (other, shard) in env.places.shards.iter().enumerate() {
                    if other == device {
                        continue;
                    }
                    for region in shard.regions().free_regions(eligible) {
                        if region.eligible {
                            free.push((region.len, other, region.key));
                        }
                    }
                }
                free.sort_unstable();
                let lens: Vec<usize> = free.iter().map(|f| f.0).collect();
                let chosen = crate::alloc::cover(&lens, lack);
                let total: usize = chosen.iter().map(|&i| lens[i]).sum();
                if total < lack || total > bytes {
                    return false;
                }
                let mut released = false;
                for (other, shard) in env.places.shards.iter().enumerate() {
                    let keys: Vec<u64> = chosen
                        .iter()
                        .map(|&i| free[i])
                        .filter(|&(_, on, _)| on == other)
                        .map(|f| f.2)
                        .collect();
                    if keys.is_empty() {
                        continue;
                    }
                    // One carved from since it was chosen stays (and the
                    // growth may then find too little room).
                    for region in shard.regions().unlist_chosen(&keys, eligible) {
                        release_region(env.releaser(), other, region);
                        released = true;
                    }
                }
                released
            });
    }

    /// Frees a quiescent returned buffer and counts its completion.
    fn release_returned(&self, env: Env<'_>, returned: Returned) {
        let mut block = returned.into_block();
        let ticket = block.take_ticket();
        release(env.releaser(), block);
        if let Some(ticket) = ticket {
            ticket.close(false);
        }
    }
}

/// Bytes admitted against the pinned budget for a registration under way
/// (see `Counters::claim_pinned`), or by `reserve` for a block not yet
/// registered: settled with the registrations they became, or, dropped
/// (a registration that unwinds, a backend that panics, a reserved block
/// carved from memory pinned already), with none. Built only once
/// admitted.
pub(crate) struct Claim<'a> {
    counters: &'a Counters,
    bytes: u64,
}

impl<'a> Claim<'a> {
    /// What `reserve` admitted for `block` when it was asked for
    /// ([`Meta::reserve_share`](crate::alloc::Meta)), taken out of the
    /// block: a claim that its registration takes over (see
    /// [`for_memory`](Self::for_memory)), else given back when dropped (the
    /// block was carved from memory pinned already, or freed). Empty for
    /// memory `reserve` did not ask for, or whose share was taken.
    fn reserve_share(counters: &'a Counters, block: &mut Block) -> Self {
        let bytes = std::mem::take(&mut block.meta_mut().reserve_share);
        Self { counters, bytes }
    }

    /// Admits `bytes` for a registration, within the budget: taking over
    /// what `reserve` admitted for the memory (`share`, left empty), if it
    /// has not been taken over by an earlier attempt, and the rest within
    /// the budget (see [`Counters::take_over_pinned`]); `None` (and `share`
    /// kept) if the budget has no room.
    fn for_memory(
        counters: &'a Counters,
        bytes: u64,
        share: Option<&mut Claim<'_>>,
    ) -> Option<Self> {
        let held = share.as_ref().map_or(0, |share| share.bytes);
        counters.take_over_pinned(held, bytes).then(|| {
            if let Some(share) = share {
                share.bytes = 0;
            }
            Self { counters, bytes }
        })
    }

    /// Admits `more` bytes that are registered already and will be again
    /// within this registration (past the budget: they are in it now).
    fn and(mut self, more: u64) -> Self {
        if more > 0 && self.counters.claim_pinned(more, true) {
            self.bytes += more;
        }
        self
    }

    /// Settles the claim, counting the registrations of `registered`
    /// bytes it became.
    fn settle(mut self, registered: &[u64]) {
        self.counters
            .settle_pinned(std::mem::take(&mut self.bytes), registered);
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.counters.settle_pinned(self.bytes, &[]);
        }
    }
}

/// Records a registration in the pool's trace, if it writes one.
fn trace_registration(
    env: Env<'_>,
    device: usize,
    at: *mut u8,
    len: usize,
    took: std::time::Duration,
    flags: u8,
) {
    if let Some(tracer) = &env.places.caches.trace {
        tracer.event(
            trace::REGISTER,
            flags,
            device,
            at as u64,
            len as u64,
            took.as_nanos() as u64,
        );
    }
}

/// Whether a miss first parked at `since` (for its set's demand to settle,
/// or for another worker's growth) has waited as long as it may for the
/// demand ([`GROWTH_SETTLE_MAX`]): a demand that rises in
/// steps just over [`GROWTH_SETTLE`] apart is never settled for long, and
/// the miss's replacement must not wait on chance.
///
/// [`GROWTH_SETTLE_MAX`]: crate::tune::Tuning::GROWTH_SETTLE_MAX
/// [`GROWTH_SETTLE`]: crate::tune::Tuning::GROWTH_SETTLE
fn waited_out(since: Instant) -> bool {
    since.elapsed() >= Tune::GROWTH_SETTLE_MAX
}

/// What replaces a returned pageable buffer (see `Cleaner::carve_for`).
enum Replacement {
    /// A block carved from a region.
    Carved(Block),
    /// Nothing: the buffer is freed, and the next take of its size carves.
    Freed,
    /// Another worker is growing its set of regions, or its demand is
    /// still rising: the buffer waits, parked, until that growth ends and
    /// the demand has settled (or it has waited
    /// [`GROWTH_SETTLE_MAX`](crate::tune::Tuning::GROWTH_SETTLE_MAX) since
    /// it was first parked), then is replaced again.
    AfterGrowth,
}
