//! The CUDA driver backend, through cudarc with the driver loaded at run time.
//!
//! Registration and device synchronization need a current context on the
//! calling thread. Every call that needs one binds the device's primary
//! context for its duration with a [`Bound`] guard, which puts back
//! whatever the thread had before: user threads that reach these paths
//! (`clear`, `shutdown`, `register_region`, event bookkeeping) keep their
//! current device. Building the backend (cudarc binds each context it
//! makes) and dropping it (cudarc binds each context it releases) put the
//! thread's context back too, so neither a pool's build, failed or not,
//! nor the drop of its last handle changes it.

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, DriverError};

use super::{Backend, BackendKind};
use crate::error::Error;
use crate::numa::DeviceHint;

/// Binds a context for a scope and puts the thread's previous one back.
#[derive(Debug)]
pub(crate) struct Bound {
    previous: sys::CUcontext,
    switched: bool,
}

impl Bound {
    /// Makes `ctx` current until the guard drops (a no-op if it already is).
    pub(crate) fn to(ctx: sys::CUcontext) -> Result<Self, Error> {
        let previous = current()?;
        let switched = previous != ctx;
        if switched {
            // SAFETY: `ctx` is a live context (a retained primary context or
            // the context of a live event).
            unsafe { result::ctx::set_current(ctx) }
                .map_err(|source| Error::cuda("cuCtxSetCurrent", source))?;
        }
        Ok(Self { previous, switched })
    }

    /// Remembers the current context and restores it when the guard drops,
    /// around a call that may change it (cudarc binds contexts freely).
    pub(crate) fn restoring() -> Result<Self, Error> {
        Ok(Self {
            previous: current()?,
            switched: true,
        })
    }
}

impl Drop for Bound {
    fn drop(&mut self) {
        if !self.switched {
            return;
        }
        // SAFETY: `previous` was current on this thread moments ago (or is
        // null, which unbinds); the driver keeps it alive while in use.
        if let Err(e) = unsafe { result::ctx::set_current(self.previous) } {
            tracing::warn!(error = %e, "pinpool: could not restore the thread's CUDA context");
        }
    }
}

/// The calling thread's current context (null if none).
fn current() -> Result<sys::CUcontext, Error> {
    result::ctx::get_current()
        .map(|c| c.unwrap_or(std::ptr::null_mut()))
        .map_err(|source| Error::cuda("cuCtxGetCurrent", source))
}

/// The primary contexts of the devices the pool serves.
///
/// Dropping it releases them with the thread's current context put back:
/// cudarc's `CudaContext::drop` binds the context it releases and leaves it
/// bound. A pool's state holds its backend last, so these are the last of
/// its references to the contexts (see [`Shared`](crate::pool::Shared)).
#[derive(Debug)]
pub(crate) struct CudaBackend {
    contexts: Vec<Arc<CudaContext>>,
}

/// Why [`CudaBackend::new`] built no backend.
#[derive(Debug)]
pub(crate) enum Unusable {
    /// There is no driver to use: the library cannot be loaded, `cuInit`
    /// fails, or the driver reports no device. [`BackendKind::Auto`] runs
    /// on the host backend instead.
    NoDriver(Error),
    /// The driver works, but serving the devices asked for failed (a
    /// context cannot be retained, too many devices): an error for every
    /// backend kind.
    Failed(Error),
}

impl From<Unusable> for Error {
    fn from(why: Unusable) -> Self {
        match why {
            Unusable::NoDriver(e) | Unusable::Failed(e) => e,
        }
    }
}

fn cuda(op: &'static str) -> impl FnOnce(DriverError) -> Error {
    move |source| Error::cuda(op, source)
}

impl CudaBackend {
    /// Loads the driver and retains the primary context of the first
    /// `devices` devices (all of them if `None`), leaving the caller's
    /// current context as it was, on failure too.
    pub(crate) fn new(devices: Option<usize>) -> Result<Self, Unusable> {
        use Unusable::{Failed, NoDriver};
        // Loaded at run time, the driver may be missing; linked, the program
        // would not have started without it.
        #[cfg(feature = "dynamic-loading")]
        // SAFETY: only tries to open the driver library, with no side effects.
        if !unsafe { sys::is_culib_present() } {
            return Err(NoDriver(Error::BackendUnavailable(
                "libcuda could not be loaded".into(),
            )));
        }
        // `cuInit` fails with CUDA_ERROR_NO_DEVICE where the driver is
        // installed but no GPU is visible, and with other codes where the
        // driver cannot run at all (a kernel module of another version,
        // no device nodes in a container): either way nothing can be pinned.
        result::init().map_err(|e| NoDriver(Error::cuda("cuInit", e)))?;
        let count =
            result::device::get_count().map_err(|e| Failed(Error::cuda("cuDeviceGetCount", e)))?;
        let count = usize::try_from(count).unwrap_or(0);
        if count == 0 {
            return Err(NoDriver(Error::BackendUnavailable(
                "the driver reports no device".into(),
            )));
        }
        let wanted = devices.unwrap_or(count);
        if wanted > count {
            return Err(Failed(Error::InvalidConfig(format!(
                "{wanted} devices requested, but the driver reports {count}"
            ))));
        }
        if wanted > super::MAX_DEVICES {
            // Before any context is retained (hundreds of milliseconds
            // each on a real device).
            return Err(Failed(super::too_many_devices(wanted)));
        }
        // Creating a context binds it; the guard puts back the caller's,
        // after the contexts of devices already done are released if a
        // later one fails.
        let _bound = Bound::restoring().map_err(Failed)?;
        let contexts = (0..wanted)
            .map(retain)
            .collect::<Result<Vec<_>, _>>()
            .map_err(Failed)?;
        Ok(Self { contexts })
    }

    /// Binds the primary context of `device` (a device the pool serves;
    /// `current_device` may name one it does not).
    fn bind(&self, device: usize) -> Result<Bound, Error> {
        let ctx = self.contexts.get(device).ok_or(Error::UnknownDevice {
            device,
            devices: self.contexts.len(),
        })?;
        Bound::to(ctx.cu_ctx())
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // cudarc's drop of the last reference binds the context and
        // releases it; put the thread's own back. If even reading it fails
        // (the driver is shutting down), the releases go ahead regardless.
        let bound = Bound::restoring();
        self.contexts.clear();
        drop(bound);
    }
}

/// Device `ordinal`'s primary context, as cudarc's `CudaContext::new`
/// makes it, with each driver call that can fail made here first so that
/// an error names the call that failed. A reference of its own is held
/// meanwhile, so that the context stays the same one (releasing the last
/// reference destroys a primary context). Leaves the context bound (the
/// caller restores the thread's).
fn retain(ordinal: usize) -> Result<Arc<CudaContext>, Error> {
    let index = i32::try_from(ordinal).map_err(|_| {
        Error::InvalidConfig(format!("device {ordinal} is beyond the driver's range"))
    })?;
    let device = result::device::get(index).map_err(cuda("cuDeviceGet"))?;
    // SAFETY: `device` is a device handle the driver just returned.
    let held =
        unsafe { result::primary_ctx::retain(device) }.map_err(cuda("cuDevicePrimaryCtxRetain"))?;
    let made = (|| {
        // SAFETY: as above; the attribute is one cudarc reads of every
        // context it makes.
        unsafe {
            result::device::get_attribute(
                device,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
            )
        }
        .map_err(cuda("cuDeviceGetAttribute"))?;
        // SAFETY: `held` is a live context: this function holds a
        // reference to it.
        unsafe { result::ctx::set_current(held) }.map_err(cuda("cuCtxSetCurrent"))?;
        // Every call it makes has just succeeded.
        CudaContext::new(ordinal).map_err(cuda("CudaContext::new"))
    })();
    // SAFETY: releases the reference retained above; a context made since
    // holds its own.
    if let Err(e) = unsafe { result::primary_ctx::release(device) } {
        // Only keeps the primary context alive until the process exits.
        tracing::warn!(device = ordinal, error = %e,
            "pinpool: cuDevicePrimaryCtxRelease failed; the device's context stays retained");
    }
    made
}

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn device_count(&self) -> usize {
        self.contexts.len()
    }

    fn current_device(&self) -> usize {
        let Ok(Some(current)) = result::ctx::get_current() else {
            return 0;
        };
        if let Some(index) = self.contexts.iter().position(|c| c.cu_ctx() == current) {
            return index;
        }
        let mut device: sys::CUdevice = 0;
        // SAFETY: `device` is a valid out-pointer; a context is current.
        match unsafe { sys::cuCtxGetDevice(&mut device) }.result() {
            Ok(()) => usize::try_from(device).unwrap_or(0),
            Err(_) => 0,
        }
    }

    fn pins(&self) -> bool {
        true
    }

    unsafe fn register(&self, device: usize, ptr: *mut u8, len: usize) -> Result<(), Error> {
        let _bound = self.bind(device)?;
        // SAFETY: the caller guarantees `[ptr, ptr + len)` is a live
        // allocation that stays mapped until unregistered.
        unsafe { sys::cuMemHostRegister_v2(ptr.cast(), len, sys::CU_MEMHOSTREGISTER_PORTABLE) }
            .result()
            .map_err(cuda("cuMemHostRegister"))
    }

    unsafe fn unregister(&self, device: usize, ptr: *mut u8) -> Result<(), Error> {
        let _bound = self.bind(device)?;
        // SAFETY: the caller guarantees `ptr` was registered and is idle.
        unsafe { sys::cuMemHostUnregister(ptr.cast()) }
            .result()
            .map_err(cuda("cuMemHostUnregister"))
    }

    fn synchronize(&self, device: usize) -> Result<(), Error> {
        let _bound = self.bind(device)?;
        result::ctx::synchronize().map_err(cuda("cuCtxSynchronize"))
    }

    fn context(&self, device: usize) -> Option<&Arc<CudaContext>> {
        self.contexts.get(device)
    }

    fn numa_hints(&self) -> Vec<DeviceHint> {
        self.contexts
            .iter()
            .map(|ctx| DeviceHint {
                driver_node: host_numa_id(ctx),
                pci_bus_id: pci_bus_id(ctx),
            })
            .collect()
    }
}

/// The device's host NUMA node as the driver reports it
/// (`CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID`, `-1` when unknown), or `None` when
/// the driver rejects the attribute (before CUDA 12.2) or the bindings
/// chosen predate it.
fn host_numa_id(ctx: &CudaContext) -> Option<i32> {
    #[cfg(pinpool_host_numa_attribute)]
    {
        ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID)
            .ok()
    }
    #[cfg(not(pinpool_host_numa_attribute))]
    {
        let _ = ctx;
        None
    }
}

/// The device's PCI bus id (`0000:3b:00.0`), for its node in sysfs.
fn pci_bus_id(ctx: &CudaContext) -> Option<String> {
    let mut id: [std::ffi::c_char; 64] = [0; 64];
    // SAFETY: `id` is a writable buffer of the length passed; the driver
    // writes a NUL-terminated string of at most that many bytes.
    unsafe { sys::cuDeviceGetPCIBusId(id.as_mut_ptr(), id.len() as i32, ctx.cu_device()) }
        .result()
        .ok()?;
    // SAFETY: `c_char` and `u8` have the same size and alignment, and `id`
    // lives for the borrow.
    let bytes = unsafe { std::slice::from_raw_parts(id.as_ptr().cast::<u8>(), id.len()) };
    let id = std::ffi::CStr::from_bytes_until_nul(bytes).ok()?;
    Some(id.to_string_lossy().into_owned())
}
