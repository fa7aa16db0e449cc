//! What the pool needs from the platform: page-locking, fences, devices.
//!
//! [`cuda`] drives the CUDA driver through cudarc, loaded at run time so the
//! crate builds and runs where no CUDA is installed; [`host`] stands in on
//! machines without a GPU: buffers are pooled and re-zeroed but never
//! page-locked.

use std::fmt;

use cudarc::driver::CudaEvent;

use crate::error::Error;

pub(crate) mod cuda;
#[cfg(feature = "testing")]
pub(crate) mod fault;
pub(crate) mod host;

/// Which backend a pool runs on.
///
/// # Examples
///
/// ```
/// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Auto).build()?;
/// println!("running on the {} backend", pool.backend());
/// # Ok::<(), pinpool::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BackendKind {
    /// CUDA when the driver loads and reports a device, otherwise host.
    #[default]
    Auto,
    /// The CUDA driver: buffers are page-locked; building fails without it.
    Cuda,
    /// Plain host memory: pooled and re-zeroed, never page-locked.
    Host,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Auto => "auto",
            BackendKind::Cuda => "cuda",
            BackendKind::Host => "host",
        })
    }
}

/// The platform operations behind a pool. Called from cleaner workers and
/// slow paths only, except `current_device`, which `take` calls.
pub(crate) trait Backend: Send + Sync + fmt::Debug {
    /// `Cuda` or `Host`, never `Auto`.
    fn kind(&self) -> BackendKind;
    /// Devices the backend can serve.
    fn device_count(&self) -> usize;
    /// The device current on the calling thread (0 if none).
    fn current_device(&self) -> usize;
    /// Whether `register` page-locks memory.
    fn pins(&self) -> bool;
    /// Page-locks `[ptr, ptr + len)` for all contexts, in one call.
    ///
    /// # Safety
    /// The range is a live allocation that stays mapped until unregistered.
    unsafe fn register(&self, device: usize, ptr: *mut u8, len: usize) -> Result<(), Error>;
    /// Reverses a successful `register` of the same base pointer.
    ///
    /// # Safety
    /// `ptr` was registered, and no copy from it is in flight.
    unsafe fn unregister(&self, device: usize, ptr: *mut u8) -> Result<(), Error>;
    /// Waits for all work on `device`.
    fn synchronize(&self, device: usize) -> Result<(), Error>;
}

/// Marks the point on a stream after which a buffer is no longer read.
#[derive(Debug)]
pub(crate) struct Fence(FenceKind);

#[derive(Debug)]
enum FenceKind {
    /// A CUDA event recorded after the last copy.
    Event(CudaEvent),
    /// Flags another thread sets when the "copy" is done, or has failed
    /// (loom models and the `testing` feature).
    #[cfg(any(all(loom, feature = "loom"), feature = "testing"))]
    Flag {
        done: crate::sync::Arc<crate::sync::AtomicBool>,
        failed: crate::sync::Arc<crate::sync::AtomicBool>,
    },
}

impl Fence {
    pub(crate) fn new(event: CudaEvent) -> Self {
        Self(FenceKind::Event(event))
    }

    /// A fence that completes when `done` is set and fails when `failed`
    /// is (loom models and the `testing` feature).
    #[cfg(any(all(loom, feature = "loom"), feature = "testing"))]
    pub(crate) fn flag(
        done: crate::sync::Arc<crate::sync::AtomicBool>,
        failed: crate::sync::Arc<crate::sync::AtomicBool>,
    ) -> Self {
        Self(FenceKind::Flag { done, failed })
    }

    /// Whether the work before the fence has finished, without waiting.
    pub(crate) fn is_done(&self) -> Result<bool, Error> {
        match &self.0 {
            FenceKind::Event(event) => event.try_is_complete().map_err(|source| Error::Cuda {
                op: "cuEventQuery",
                source,
            }),
            // Acquire pairs with the setter's Release store: what the
            // "copy" did happens before the buffer is reused.
            #[cfg(any(all(loom, feature = "loom"), feature = "testing"))]
            FenceKind::Flag { done, failed } => {
                if failed.load(crate::sync::Ordering::Acquire) {
                    return Err(Error::Cuda {
                        op: "cuEventQuery (injected)",
                        source: cudarc::driver::DriverError(
                            cudarc::driver::sys::CUresult::CUDA_ERROR_UNKNOWN,
                        ),
                    });
                }
                Ok(done.load(crate::sync::Ordering::Acquire))
            }
        }
    }

    /// Waits for the work before the fence.
    pub(crate) fn wait(&self) -> Result<(), Error> {
        match &self.0 {
            FenceKind::Event(event) => event.synchronize().map_err(|source| Error::Cuda {
                op: "cuEventSynchronize",
                source,
            }),
            #[cfg(any(all(loom, feature = "loom"), feature = "testing"))]
            FenceKind::Flag { .. } => {
                while !self.is_done()? {
                    crate::sync::thread::yield_now();
                }
                Ok(())
            }
        }
    }
}

/// Picks the backend for `kind`, logging the choice once.
pub(crate) fn select(kind: BackendKind, devices: Option<usize>) -> Result<Box<dyn Backend>, Error> {
    let host = || Box::new(host::HostBackend::new(devices.unwrap_or(1)));
    match kind {
        BackendKind::Host => Ok(host()),
        BackendKind::Cuda => Ok(Box::new(cuda::CudaBackend::new(devices)?)),
        BackendKind::Auto => match cuda::CudaBackend::new(devices) {
            Ok(backend) => {
                tracing::info!(
                    devices = backend.device_count(),
                    "pinpool: using the CUDA backend"
                );
                Ok(Box::new(backend))
            }
            Err(e @ Error::InvalidConfig(_)) => Err(e),
            Err(why) => {
                tracing::info!(reason = %why, "pinpool: using the host backend (buffers are not page-locked)");
                Ok(host())
            }
        },
    }
}
