//! What the pool needs from the platform: page-locking and device
//! synchronization, on at most [`MAX_DEVICES`] devices.
//!
//! [`cuda`] drives the CUDA driver through cudarc, loaded at run time so the
//! crate builds and runs where no CUDA is installed; [`host`] stands in on
//! machines without a GPU: buffers are pooled and re-zeroed but never
//! page-locked; `fault` (the `testing` feature, and loom models) pins in name only and
//! fails or blocks on chosen calls. Backends are called from cleaner
//! workers and slow paths only, except `current_device`, which `take`
//! calls; every call leaves the caller's current CUDA context as it was.

use std::fmt;

use crate::error::Error;

pub(crate) mod cuda;
#[cfg(feature = "testing")]
pub(crate) mod fault;
pub(crate) mod host;

/// The most devices a pool serves: more than any host has, and few enough
/// that every thread's per-device bookkeeping stays small.
pub const MAX_DEVICES: usize = 64;

/// The error for a backend reporting more devices than a pool serves.
pub(crate) fn too_many_devices(devices: usize) -> Error {
    Error::InvalidConfig(format!(
        "the backend reports {devices} devices; a pool serves at most {MAX_DEVICES}: \
         serve the first ones with `devices`"
    ))
}

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
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
#[non_exhaustive]
pub enum BackendKind {
    /// CUDA when the driver loads, initializes and reports a device;
    /// otherwise host. A driver that works but cannot serve a device (its
    /// context cannot be retained: busy, out of memory) is an error, not a
    /// pool that silently runs unpinned.
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

/// The platform operations behind a pool.
pub(crate) trait Backend: Send + Sync + fmt::Debug {
    /// `Cuda` or `Host`, never `Auto`.
    fn kind(&self) -> BackendKind;
    /// Devices the backend serves.
    fn device_count(&self) -> usize;
    /// The device of the CUDA context current on the calling thread (0 if
    /// none is, or on the host backend).
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
    /// Waits for all work in `device`'s primary context.
    fn synchronize(&self, device: usize) -> Result<(), Error>;
    /// The primary context of `device` (CUDA only), for fences recorded
    /// on raw streams.
    fn context(&self, device: usize) -> Option<&std::sync::Arc<cudarc::driver::CudaContext>> {
        let _ = device;
        None
    }
    /// What the driver says about each device's NUMA placement (nothing,
    /// outside CUDA).
    fn numa_hints(&self) -> Vec<crate::numa::DeviceHint> {
        vec![Default::default(); self.device_count()]
    }
    /// Whether the thread named `name` is refused (the test backend's
    /// injected failures; no real backend refuses one).
    fn refuses_thread(&self, _name: &str) -> bool {
        false
    }
    /// Starts a thread named `name` running `body`: every thread the pool
    /// starts (cleaner workers, the reaper, late synchronizes) starts
    /// here, so that the test backend can make it fail.
    fn spawn(&self, name: String, body: Box<dyn FnOnce() + Send>) -> std::io::Result<JoinHandle> {
        if self.refuses_thread(&name) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WouldBlock,
                format!("{name}: thread start refused (injected)"),
            ));
        }
        crate::sync::thread::Builder::new().name(name).spawn(body)
    }
}

/// A thread the pool started.
pub(crate) type JoinHandle = crate::sync::thread::JoinHandle<()>;

/// Picks the backend for `kind`, logging the choice.
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
            Err(cuda::Unusable::NoDriver(why)) => {
                let expected = match &why {
                    Error::Cuda { source, .. } => {
                        source.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_NO_DEVICE
                    }
                    _ => true,
                };
                if expected {
                    tracing::info!(reason = %why, "pinpool: using the host backend (buffers are not page-locked)");
                } else {
                    // A driver that is installed but does not start.
                    tracing::warn!(reason = %why, "pinpool: using the host backend (buffers are not page-locked)");
                }
                Ok(host())
            }
            Err(cuda::Unusable::Failed(e)) => Err(e),
        },
    }
}
