//! The GPU, when there is one: contexts, streams and copy targets.

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaStream, DriverError};

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
    /// A sink on `ctx` (or the host stand-in, its pages faulted in) for
    /// copies of up to `max` bytes.
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
            None => {
                let mut dst = vec![0; max.max(1)];
                // Fresh zeroed pages are mapped on first write: writing the
                // zeros (through `black_box`, so that they are not elided)
                // faults them in now, before the prover's segments.
                std::hint::black_box(&mut dst[..]).fill(0);
                Sink::Host(dst)
            }
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

/// Page-locked host memory from `cuMemHostAlloc`, freed on drop.
///
/// Its owner waits for the copies reading it before dropping it.
#[derive(Debug)]
pub struct HostAlloc {
    ptr: NonNull<u8>,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the memory belongs to this value alone, like a `Box<[u8]>`:
// moving it to another thread moves the only handle, and shared references
// only read it.
unsafe impl Send for HostAlloc {}
// SAFETY: as for `Send`; `&HostAlloc` gives only `&[u8]`.
unsafe impl Sync for HostAlloc {}

impl HostAlloc {
    /// `len` bytes of page-locked memory allocated in `ctx` (which this
    /// binds to the calling thread), page-locked for every context when
    /// `portable`; not zeroed.
    pub fn new(ctx: &Arc<CudaContext>, len: usize, portable: bool) -> Result<Self, DriverError> {
        ctx.bind_to_thread()?;
        let flags = if portable {
            sys::CU_MEMHOSTALLOC_PORTABLE
        } else {
            0
        };
        // SAFETY: a context is bound; the result is checked, and the memory
        // is freed once, in `drop`.
        let ptr = unsafe { result::malloc_host(len.max(1), flags) }?;
        let ptr = NonNull::new(ptr.cast())
            .ok_or(DriverError(sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY))?;
        Ok(Self {
            ptr,
            len,
            ctx: ctx.clone(),
        })
    }
}

impl Deref for HostAlloc {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` holds at least `len` bytes owned by this value.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for HostAlloc {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` holds at least `len` bytes owned by this value, and
        // `&mut self` makes this the only reference to them.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HostAlloc {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by `malloc_host` in `new` and freed only here;
        // the owner has waited for the copies reading it.
        let _ = unsafe { result::free_host(self.ptr.as_ptr().cast()) };
    }
}
