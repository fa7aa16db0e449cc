//! The GPU, when there is one: contexts, streams and copy targets.

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaStream};

/// Every usable device's primary context, or `None` without a GPU.
pub fn detect() -> Option<Vec<Arc<CudaContext>>> {
    // SAFETY: only tries to load the driver library.
    if !unsafe { sys::is_culib_present() } {
        return None;
    }
    let count = CudaContext::device_count().ok()?;
    let contexts: Vec<_> = (0..count as usize)
        .filter_map(|d| CudaContext::new(d).ok())
        .collect();
    (!contexts.is_empty()).then_some(contexts)
}

/// Where a prover thread's copies go: device memory on its own stream, or,
/// without a GPU, a host buffer standing in for the device.
pub enum Sink {
    /// A device buffer and the prover's non-blocking stream.
    Gpu {
        /// The prover's stream.
        stream: Arc<CudaStream>,
        /// Device memory of at least the largest copy.
        dst: sys::CUdeviceptr,
    },
    /// The stand-in: a memcpy into this buffer.
    Host(Vec<u8>),
}

impl Sink {
    /// A sink on `ctx` (or the host stand-in) for copies of up to `max` bytes.
    pub fn new(ctx: Option<&Arc<CudaContext>>, max: usize) -> Self {
        match ctx {
            Some(ctx) => {
                ctx.bind_to_thread().expect("bind the prover's device");
                let stream = ctx.new_stream().expect("create the prover's stream");
                // SAFETY: a context is bound; the result is checked.
                let dst =
                    unsafe { result::malloc_sync(max.max(1)) }.expect("allocate the copy target");
                Sink::Gpu { stream, dst }
            }
            None => Sink::Host(vec![0; max.max(1)]),
        }
    }

    /// Enqueues (GPU) or performs (host) the copy of `src`.
    ///
    /// On the GPU the copy is asynchronous for pinned memory: `src` must
    /// stay alive and unchanged until the stream passes it.
    pub fn copy(&mut self, src: &[u8]) {
        match self {
            Sink::Gpu { stream, dst } => {
                // SAFETY: `dst` holds at least `max >= src.len()` bytes; the
                // caller keeps `src` alive until the copy is done (recorded
                // events, a stream sync, or pageable staging).
                unsafe { result::memcpy_htod_async(*dst, src, stream.cu_stream()) }
                    .expect("H2D copy");
            }
            Sink::Host(dst) => dst[..src.len()].copy_from_slice(src),
        }
    }

    /// The prover's stream, if on a GPU.
    pub fn stream(&self) -> Option<&Arc<CudaStream>> {
        match self {
            Sink::Gpu { stream, .. } => Some(stream),
            Sink::Host(_) => None,
        }
    }

    /// Waits for every copy enqueued so far.
    pub fn synchronize(&self) {
        if let Sink::Gpu { stream, .. } = self {
            stream.synchronize().expect("stream synchronize");
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        if let Sink::Gpu { stream, dst } = self {
            let _ = stream.synchronize();
            // SAFETY: allocated in `new`, freed once, no copy in flight.
            let _ = unsafe { result::free_sync(*dst) };
        }
    }
}
