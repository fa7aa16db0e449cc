//! A backend that fails or panics on chosen calls, for tests (the
//! `testing` feature). It "pins" like CUDA, so the registration, event-less
//! synchronize and unregistration paths all run, and it counts every call.

use std::collections::HashSet;

use super::{Backend, BackendKind};
use crate::error::Error;
use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering};

/// Which calls of a [`FaultBackend`] fail or panic, and what it has seen.
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
/// let pool = pinpool::Pool::builder().faults(faults.clone()).build()?;
/// drop(pool.take(4096)); // its first registration fails: freed, not pooled
/// pool.flush();
/// assert_eq!(pool.stats().registration_failures, 1);
/// assert_eq!(faults.registered(), 0);
/// # Ok::<(), pinpool::Error>(())
/// ```
#[derive(Debug, Default)]
pub struct Faults {
    plan: Mutex<Plan>,
    register_calls: AtomicU64,
    registered: AtomicU64,
    unregister_calls: AtomicU64,
    unregistered: AtomicU64,
    synchronize_calls: AtomicU64,
    held: std::sync::Mutex<bool>,
    released: std::sync::Condvar,
    threads: Mutex<Vec<std::thread::ThreadId>>,
}

#[derive(Debug, Default)]
struct Plan {
    fail_register: HashSet<u64>,
    panic_register: HashSet<u64>,
    fail_unregister: HashSet<u64>,
    fail_synchronize: HashSet<u64>,
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

    /// Makes every synchronize call block until [`release`](Self::release).
    pub fn hold_synchronize(&self) {
        *self.held.lock().unwrap() = true;
    }

    /// Lets held synchronize calls return.
    pub fn release(&self) {
        *self.held.lock().unwrap() = false;
        self.released.notify_all();
    }

    /// Backend calls (registration, unregistration, synchronize) made on
    /// `thread`.
    pub fn calls_on(&self, thread: std::thread::ThreadId) -> usize {
        self.threads.lock().iter().filter(|t| **t == thread).count()
    }

    fn note_thread(&self) {
        self.threads.lock().push(std::thread::current().id());
    }

    fn plan(&self) -> MutexGuard<'_, Plan> {
        self.plan.lock()
    }

    /// Numbers a call of `counter` and looks it up in the plan.
    fn call(
        &self,
        counter: &AtomicU64,
        pick: impl Fn(&Plan) -> (&HashSet<u64>, Option<&HashSet<u64>>),
    ) -> Outcome {
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
    Error::Cuda {
        op,
        source: cudarc::driver::DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_UNKNOWN),
    }
}

/// Serves `devices` simulated devices under a [`Faults`] plan. It reports
/// itself as the host backend, but pins (in name) every buffer it is given.
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
        f.note_thread();
        match f.call(&f.register_calls, |p| {
            (&p.fail_register, Some(&p.panic_register))
        }) {
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
        f.note_thread();
        match f.call(&f.unregister_calls, |p| (&p.fail_unregister, None)) {
            Outcome::Pass => {
                f.unregistered.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            _ => Err(injected("cuMemHostUnregister (injected)")),
        }
    }

    fn synchronize(&self, _device: usize) -> Result<(), Error> {
        let f = &self.faults;
        f.note_thread();
        let mut held = f.held.lock().unwrap();
        while *held {
            held = f.released.wait(held).unwrap();
        }
        drop(held);
        match f.call(&f.synchronize_calls, |p| (&p.fail_synchronize, None)) {
            Outcome::Pass => Ok(()),
            _ => Err(injected("cuCtxSynchronize (injected)")),
        }
    }
}

/// A stand-in for the event after a copy still reading a buffer: it
/// completes, or fails, when the test says so.
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
#[derive(Debug, Clone, Default)]
pub struct TestFence {
    done: crate::sync::Arc<crate::sync::AtomicBool>,
    failed: crate::sync::Arc<crate::sync::AtomicBool>,
}

impl TestFence {
    /// Makes `buf` wait for this fence before it is reused.
    pub fn record(&self, buf: &mut crate::PinnedBuffer) {
        buf.record_flag(self.done.clone(), self.failed.clone());
    }

    /// The "copy" finished.
    pub fn complete(&self) {
        // Release pairs with the cleaner's Acquire load in `Fence::is_done`.
        self.done.store(true, Ordering::Release);
    }

    /// Waiting for the "copy" fails, as a failed event query would.
    pub fn fail(&self) {
        // Release: as in `complete`.
        self.failed.store(true, Ordering::Release);
    }
}
