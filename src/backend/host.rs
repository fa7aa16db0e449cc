//! The backend for machines without a GPU: nothing is page-locked.

use super::{Backend, BackendKind};
use crate::error::Error;

/// Serves `devices` simulated devices; registration is never attempted.
#[derive(Debug)]
pub(crate) struct HostBackend {
    devices: usize,
}

impl HostBackend {
    pub(crate) fn new(devices: usize) -> Self {
        Self { devices }
    }
}

impl Backend for HostBackend {
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
        false
    }

    unsafe fn register(&self, _device: usize, _ptr: *mut u8, _len: usize) -> Result<(), Error> {
        Err(Error::BackendUnavailable(
            "the host backend does not pin".into(),
        ))
    }

    unsafe fn unregister(&self, _device: usize, _ptr: *mut u8) -> Result<(), Error> {
        Ok(())
    }

    fn synchronize(&self, _device: usize) -> Result<(), Error> {
        Ok(())
    }
}
