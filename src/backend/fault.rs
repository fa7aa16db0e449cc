//! A backend that pins in name only and fails, panics or blocks on chosen
//! calls, for tests (the `testing` feature) and loom models. It reports
//! itself as the host backend but "registers" every buffer it is given, so
//! the registration, event-less synchronize and unregistration paths all
//! run; it counts every call and the thread that made it.

use std::collections::HashSet;

use super::{Backend, BackendKind};
use crate::error::Error;
use crate::sync::{Condvar, Mutex, Ordering, StatCounter, Unmodeled};

/// Which calls of a fault-injecting backend fail, panic or block, and what
/// it has seen.
///
/// Calls are numbered from 1 per operation, in the order the pool makes
/// them.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use pinpool::testing::Faults;
///
/// let faults = Arc::new(Faults::default());
/// faults.fail_register(&[1]);
/// // Buffers pinned one by one (with regions, a region's registration fails).
/// let pool = pinpool::Pool::builder().faults(faults.clone()).regions(false).build()?;
/// drop(pool.take(4096)); // its first registration fails: freed, not pooled
/// pool.flush();
/// assert_eq!(pool.stats().registration_failures, 1);
/// assert_eq!(faults.registered(), 0);
/// # Ok::<(), pinpool::Error>(())
/// ```
#[derive(Debug)]
pub struct Faults {
    plan: Unmodeled<Plan>,
    register_calls: StatCounter,
    registered: StatCounter,
    unregister_calls: StatCounter,
    unregistered: StatCounter,
    synchronize_calls: StatCounter,
    spawn_failures: StatCounter,
    held: Mutex<Held>,
    released: Condvar,
    threads: Unmodeled<Vec<std::thread::ThreadId>>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            plan: Unmodeled::new(Plan::default()),
            register_calls: StatCounter::new(0),
            registered: StatCounter::new(0),
            unregister_calls: StatCounter::new(0),
            unregistered: StatCounter::new(0),
            synchronize_calls: StatCounter::new(0),
            spawn_failures: StatCounter::new(0),
            held: Mutex::new(Held::default()),
            released: Condvar::new(),
            threads: Unmodeled::new(Vec::new()),
        }
    }
}

/// Which calls block until [`Faults::release`].
#[derive(Debug, Default)]
struct Held {
    synchronize: bool,
    register: bool,
}

#[derive(Debug, Default)]
struct Plan {
    fail_register: HashSet<u64>,
    panic_register: HashSet<u64>,
    fail_unregister: HashSet<u64>,
    fail_synchronize: HashSet<u64>,
    /// Thread names (prefixes) whose start fails.
    fail_spawn: Vec<String>,
}

/// A call's outcome under the plan.
enum Outcome {
    Pass,
    Fail,
    Panic,
}

impl Faults {
    /// Fails these registration calls.
    pub fn fail_register(&self, calls: &[u64]) {
        self.plan().fail_register.extend(calls);
    }

    /// Panics in these registration calls (inside a cleaner worker).
    pub fn panic_register(&self, calls: &[u64]) {
        self.plan().panic_register.extend(calls);
    }

    /// Fails these unregistration calls.
    pub fn fail_unregister(&self, calls: &[u64]) {
        self.plan().fail_unregister.extend(calls);
    }

    /// Fails these device synchronizes (the wait for event-less buffers).
    pub fn fail_synchronize(&self, calls: &[u64]) {
        self.plan().fail_synchronize.extend(calls);
    }

    /// Makes the start of every thread of the pool whose name begins with
    /// `prefix` fail, as a system out of threads would: `pinpool-cleaner`
    /// (or `pinpool-cleaner-N` for worker N), `pinpool-reaper` (the
    /// process-wide thread that frees closed pools' buffers, started by the
    /// close of a pool), `pinpool-late-sync` (a closed pool's device
    /// synchronize), or `pinpool` for all of them.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use pinpool::testing::Faults;
    ///
    /// let faults = Arc::new(Faults::default());
    /// faults.fail_spawn("pinpool-cleaner");
    /// let pool = pinpool::Pool::builder().faults(faults.clone()).regions(false).build()?;
    /// drop(pool.take(4096));
    /// pool.flush(); // no worker runs: the flush cleans on this thread
    /// assert_eq!(pool.stats().pooled_buffers, 1);
    /// assert!(faults.spawn_failures() > 0);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn fail_spawn(&self, prefix: &str) {
        self.plan().fail_spawn.push(prefix.to_owned());
    }

    /// Lets threads start again (undoes every [`fail_spawn`](Self::fail_spawn)).
    pub fn allow_spawn(&self) {
        self.plan().fail_spawn.clear();
    }

    /// Thread starts that failed by [`fail_spawn`](Self::fail_spawn).
    pub fn spawn_failures(&self) -> u64 {
        self.spawn_failures.load(Ordering::Relaxed)
    }

    /// Makes every synchronize call block until [`release`](Self::release).
    pub fn hold_synchronize(&self) {
        self.held.lock().synchronize = true;
    }

    /// Makes every registration call block until
    /// [`release`](Self::release) (counted in
    /// [`register_calls`](Self::register_calls) once it blocks).
    pub fn hold_register(&self) {
        self.held.lock().register = true;
    }

    /// Lets held synchronize and registration calls return.
    pub fn release(&self) {
        *self.held.lock() = Held::default();
        self.released.notify_all();
    }

    /// Successful registrations.
    pub fn registered(&self) -> u64 {
        self.registered.load(Ordering::Relaxed)
    }

    /// Successful unregistrations.
    pub fn unregistered(&self) -> u64 {
        self.unregistered.load(Ordering::Relaxed)
    }

    /// Registration calls, failed ones included.
    pub fn register_calls(&self) -> u64 {
        self.register_calls.load(Ordering::Relaxed)
    }

    /// Unregistration calls, failed ones included.
    pub fn unregister_calls(&self) -> u64 {
        self.unregister_calls.load(Ordering::Relaxed)
    }

    /// Device synchronize calls, failed ones included.
    pub fn synchronize_calls(&self) -> u64 {
        self.synchronize_calls.load(Ordering::Relaxed)
    }

    /// Backend calls (registration, unregistration, synchronize) made on
    /// `thread`.
    pub fn calls_on(&self, thread: std::thread::ThreadId) -> usize {
        let threads = self
            .threads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        threads.iter().filter(|t| **t == thread).count()
    }

    fn plan(&self) -> std::sync::MutexGuard<'_, Plan> {
        self.plan
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Numbers a call of `counter`, notes its thread, and looks it up in
    /// the plan.
    fn call(
        &self,
        counter: &StatCounter,
        pick: impl Fn(&Plan) -> (&HashSet<u64>, Option<&HashSet<u64>>),
    ) -> Outcome {
        self.threads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(std::thread::current().id());
        // Relaxed: call numbering; the counters publish nothing.
        let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
        let plan = self.plan();
        let (fail, panic) = pick(&plan);
        if panic.is_some_and(|p| p.contains(&n)) {
            Outcome::Panic
        } else if fail.contains(&n) {
            Outcome::Fail
        } else {
            Outcome::Pass
        }
    }
}

/// The error an injected failure returns.
fn injected(op: &'static str) -> Error {
    Error::cuda(
        op,
        cudarc::driver::DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_UNKNOWN),
    )
}

/// Serves `devices` simulated devices under a [`Faults`] plan.
#[derive(Debug)]
pub(crate) struct FaultBackend {
    faults: std::sync::Arc<Faults>,
    devices: usize,
}

impl FaultBackend {
    pub(crate) fn new(faults: std::sync::Arc<Faults>, devices: usize) -> Self {
        Self { faults, devices }
    }
}

impl Backend for FaultBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Host
    }

    fn device_count(&self) -> usize {
        self.devices
    }

    fn current_device(&self) -> usize {
        0
    }

    fn pins(&self) -> bool {
        true
    }

    unsafe fn register(&self, _device: usize, _ptr: *mut u8, _len: usize) -> Result<(), Error> {
        let f = &self.faults;
        let outcome = f.call(&f.register_calls, |p| {
            (&p.fail_register, Some(&p.panic_register))
        });
        let mut held = f.held.lock();
        while held.register {
            held = f.released.wait(held);
        }
        drop(held);
        match outcome {
            Outcome::Pass => {
                f.registered.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Outcome::Fail => Err(injected("cuMemHostRegister (injected)")),
            Outcome::Panic => panic!("injected panic in cuMemHostRegister"),
        }
    }

    unsafe fn unregister(&self, _device: usize, _ptr: *mut u8) -> Result<(), Error> {
        let f = &self.faults;
        match f.call(&f.unregister_calls, |p| (&p.fail_unregister, None)) {
            Outcome::Pass => {
                f.unregistered.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            _ => Err(injected("cuMemHostUnregister (injected)")),
        }
    }

    fn refuses_thread(&self, name: &str) -> bool {
        let f = &self.faults;
        let refused = f.plan().fail_spawn.iter().any(|p| name.starts_with(p));
        if refused {
            // Relaxed: a statistic.
            f.spawn_failures.fetch_add(1, Ordering::Relaxed);
        }
        refused
    }

    fn synchronize(&self, _device: usize) -> Result<(), Error> {
        let f = &self.faults;
        let mut held = f.held.lock();
        while held.synchronize {
            held = f.released.wait(held);
        }
        drop(held);
        match f.call(&f.synchronize_calls, |p| (&p.fail_synchronize, None)) {
            Outcome::Pass => Ok(()),
            _ => Err(injected("cuCtxSynchronize (injected)")),
        }
    }
}
