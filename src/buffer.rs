//! [`PinnedBuffer`]: the guard `take` hands out.

use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};

use cudarc::driver::CudaStream;

use crate::alloc::Block;
use crate::backend::Fence;
use crate::cleaner::Inbox;
use crate::error::Error;
use crate::sync::Arc;
use crate::thread_cache::ThreadCache;

/// A host staging buffer owned by a pool, handed out by
/// [`Pool::take`](crate::Pool::take).
///
/// Dereferences to `[u8]` of exactly the class size. The memory never moves
/// or grows, and dropping the guard is the only way to let it go: it goes
/// back through the pool's cleaner, which waits for the copies still
/// reading it, re-zeroes what was written and makes it ready again. A drop
/// never blocks and never calls CUDA.
///
/// # Examples
///
/// ```
/// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
/// let mut buf = pool.take(1 << 16);
/// buf[..5].copy_from_slice(b"hello");
/// buf.set_dirty_len(5); // only these bytes need re-zeroing
/// drop(buf);
/// # Ok::<(), pinpool::Error>(())
/// ```
pub struct PinnedBuffer {
    block: ManuallyDrop<Block>,
    home: ManuallyDrop<Arc<ThreadCache>>,
    dirty: usize,
    fences: Vec<Fence>,
    pooled: bool,
}

// === impl PinnedBuffer ===

impl PinnedBuffer {
    #[inline]
    pub(crate) fn new(block: Block, home: Arc<ThreadCache>, pooled: bool) -> Self {
        let dirty = block.len();
        Self {
            block: ManuallyDrop::new(block),
            home: ManuallyDrop::new(home),
            dirty,
            fences: Vec::new(),
            pooled,
        }
    }

    /// Whether the buffer is page-locked. `false` for pool-miss buffers
    /// (until their first trip through the cleaner) and on the host backend.
    #[inline]
    pub fn is_pinned(&self) -> bool {
        self.block.is_pinned()
    }

    /// Whether the take was served from the pool (a hit) rather than by a
    /// fresh allocation (a miss).
    #[inline]
    pub fn was_pooled(&self) -> bool {
        self.pooled
    }

    /// The device whose shard the buffer belongs to, and returns to.
    #[inline]
    pub fn device(&self) -> usize {
        self.block.device()
    }

    /// Narrows the prefix the cleaner re-zeroes (by default the whole
    /// buffer). The caller asserts that bytes at `len..` have not been
    /// written since the take. Values past the end are clamped to `len()`.
    #[inline]
    pub fn set_dirty_len(&mut self, len: usize) {
        self.dirty = len.min(self.block.len());
    }

    /// The prefix the cleaner will re-zero.
    #[inline]
    pub fn dirty_len(&self) -> usize {
        self.dirty
    }

    /// Records the point on `stream` after which the buffer is no longer
    /// read: call it right after enqueueing the last copy out of the buffer
    /// on that stream. The cleaner then waits on exactly these events before
    /// reusing the buffer, instead of synchronizing the whole device. If
    /// several streams read the buffer, record on each.
    ///
    /// Without any recorded event, the cleaner synchronizes the buffer's
    /// device (see [`device`](Self::device)) before reusing a pinned buffer.
    ///
    /// # Errors
    ///
    /// If the event cannot be created or recorded.
    pub fn record_last_use(&mut self, stream: &CudaStream) -> Result<(), Error> {
        let event = stream.record_event(None).map_err(|source| Error::Cuda {
            op: "cuEventRecord",
            source,
        })?;
        self.fences.push(Fence::new(event));
        Ok(())
    }
}

#[cfg(all(loom, feature = "loom"))]
impl PinnedBuffer {
    /// Records a fence that completes when `done` is set (loom models).
    pub(crate) fn record_flag(&mut self, done: Arc<crate::sync::AtomicBool>) {
        self.fences.push(Fence::flag(done));
    }
}

impl Deref for PinnedBuffer {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        self.block.as_slice()
    }
}

impl DerefMut for PinnedBuffer {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        self.block.as_mut_slice()
    }
}

impl AsRef<[u8]> for PinnedBuffer {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl AsMut<[u8]> for PinnedBuffer {
    fn as_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("len", &self.block.len())
            .field("device", &self.device())
            .field("pinned", &self.is_pinned())
            .field("dirty_len", &self.dirty)
            .field("fences", &self.fences.len())
            .finish()
    }
}

impl Drop for PinnedBuffer {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: both fields are taken exactly once, here, and never used
        // again.
        let (block, home) = unsafe {
            (
                ManuallyDrop::take(&mut self.block),
                ManuallyDrop::take(&mut self.home),
            )
        };
        Inbox::submit(&home, block, self.dirty, std::mem::take(&mut self.fences));
    }
}
