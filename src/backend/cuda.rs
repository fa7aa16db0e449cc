//! The CUDA driver backend, through cudarc with the driver loaded at run time.
//!
//! Registration needs a current context on the calling thread, so every
//! call that needs one makes the device's primary context current for its
//! duration and then restores whatever the thread had before: user threads
//! that reach these paths (`clear`, `shutdown`, `register_region`) keep
//! their current device.

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, DriverError};

use super::{Backend, BackendKind};
use crate::error::Error;

/// The primary contexts of the devices the pool serves.
#[derive(Debug)]
pub(crate) struct CudaBackend {
    contexts: Vec<Arc<CudaContext>>,
}

fn cuda(op: &'static str) -> impl FnOnce(DriverError) -> Error {
    move |source| Error::Cuda { op, source }
}

impl CudaBackend {
    /// Loads the driver and retains the primary context of the first
    /// `devices` devices (all of them if `None`).
    pub(crate) fn new(devices: Option<usize>) -> Result<Self, Error> {
        // SAFETY: only tries to open the driver library, with no side effects.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::BackendUnavailable(
                "libcuda could not be loaded".into(),
            ));
        }
        result::init().map_err(cuda("cuInit"))?;
        let count = result::device::get_count().map_err(cuda("cuDeviceGetCount"))? as usize;
        if count == 0 {
            return Err(Error::BackendUnavailable(
                "the driver reports no device".into(),
            ));
        }
        let wanted = devices.unwrap_or(count);
        if wanted > count {
            return Err(Error::InvalidConfig(format!(
                "{wanted} devices requested, but the driver reports {count}"
            )));
        }
        let previous = result::ctx::get_current().map_err(cuda("cuCtxGetCurrent"))?;
        let contexts = (0..wanted)
            .map(CudaContext::new)
            .collect::<Result<Vec<_>, _>>();
        // `CudaContext::new` binds each context; put back the caller's.
        restore(previous);
        let contexts = contexts.map_err(cuda("cuDevicePrimaryCtxRetain"))?;
        Ok(Self { contexts })
    }

    /// Runs `f` with `device`'s primary context current, then restores the
    /// thread's previous context.
    fn with_context<R>(
        &self,
        device: usize,
        f: impl FnOnce() -> Result<R, DriverError>,
    ) -> Result<R, DriverError> {
        let previous = result::ctx::get_current()?;
        let ctx = self.contexts[device].cu_ctx();
        let switch = previous != Some(ctx);
        if switch {
            // SAFETY: `ctx` is a primary context retained by `self`.
            unsafe { result::ctx::set_current(ctx) }?;
        }
        let out = f();
        if switch {
            restore(previous);
        }
        out
    }
}

/// Makes `previous` (or no context) current again.
fn restore(previous: Option<sys::CUcontext>) {
    let ctx = previous.unwrap_or(std::ptr::null_mut());
    // SAFETY: `ctx` was current on this thread moments ago (or is null,
    // which unbinds); the driver keeps it alive while it is in use.
    if let Err(e) = unsafe { result::ctx::set_current(ctx) } {
        tracing::warn!(error = %e, "could not restore the thread's CUDA context");
    }
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
        self.with_context(device, || {
            // SAFETY: the caller guarantees `[ptr, ptr + len)` is a live
            // allocation that stays mapped until unregistered.
            unsafe { sys::cuMemHostRegister_v2(ptr.cast(), len, sys::CU_MEMHOSTREGISTER_PORTABLE) }
                .result()
        })
        .map_err(cuda("cuMemHostRegister"))
    }

    unsafe fn unregister(&self, device: usize, ptr: *mut u8) -> Result<(), Error> {
        self.with_context(device, || {
            // SAFETY: the caller guarantees `ptr` was registered and is idle.
            unsafe { sys::cuMemHostUnregister(ptr.cast()) }.result()
        })
        .map_err(cuda("cuMemHostUnregister"))
    }

    fn synchronize(&self, device: usize) -> Result<(), Error> {
        self.with_context(device, result::ctx::synchronize)
            .map_err(cuda("cuCtxSynchronize"))
    }
}
