//! [`PinnedBuffer`]: the guard `take` hands out.

use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};

use std::marker::PhantomData;

use bytemuck::Pod;
use cudarc::driver::{CudaEvent, CudaStream, HostSlice, SyncOnDrop};

use crate::alloc::Block;
use crate::backend::Fence;
use crate::cleaner::Inbox;
use crate::error::Error;
use crate::sync::{Arc, Mutex};
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
    /// Events after copies that cudarc enqueued through `HostSlice`; boxed
    /// so that an event keeps its address while the list grows, and only
    /// moved out when the buffer drops.
    #[allow(clippy::vec_box)] // the boxes are what keep the addresses fixed
    copies: Mutex<Vec<Box<CudaEvent>>>,
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
            copies: Mutex::new(Vec::new()),
            pooled,
        }
    }

    /// Whether the buffer is page-locked. `false` for pool-miss buffers
    /// (until their first trip through the cleaner) and on the host backend.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// let buf = pool.take(4096);
    /// assert!(!buf.is_pinned()); // the host backend never pins
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    #[inline]
    pub fn is_pinned(&self) -> bool {
        self.block.is_pinned()
    }

    /// Whether the take was served from the pool (a hit) rather than by a
    /// fresh allocation (a miss).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// assert!(!pool.take(4096).was_pooled()); // first take: a miss
    /// pool.flush();
    /// assert!(pool.take(4096).was_pooled());
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    #[inline]
    pub fn was_pooled(&self) -> bool {
        self.pooled
    }

    /// The device whose shard the buffer belongs to, and returns to.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).devices(2).build()?;
    /// assert_eq!(pool.take_on(1, 64)?.device(), 1);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    #[inline]
    pub fn device(&self) -> usize {
        self.block.device()
    }

    /// Narrows the prefix the cleaner re-zeroes (by default the whole
    /// buffer). The caller asserts that bytes at `len..` have not been
    /// written since the take. Values past the end are clamped to `len()`.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// let mut buf = pool.take(4096);
    /// buf[..10].fill(1);
    /// buf.set_dirty_len(10);
    /// assert_eq!(buf.dirty_len(), 10);
    /// buf.set_dirty_len(usize::MAX);
    /// assert_eq!(buf.dirty_len(), 4096);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    #[inline]
    pub fn set_dirty_len(&mut self, len: usize) {
        self.dirty = len.min(self.block.len());
    }

    /// The prefix the cleaner will re-zero.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// assert_eq!(pool.take(100).dirty_len(), 128); // all of it, until narrowed
    /// # Ok::<(), pinpool::Error>(())
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(pool: &pinpool::Pool, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), pinpool::Error> {
    /// let mut buf = pool.take(1 << 20);
    /// // ... enqueue the copies out of `buf` on `stream`, then:
    /// buf.record_last_use(stream)?;
    /// drop(buf); // reused once the event completes
    /// # Ok(()) }
    /// ```
    pub fn record_last_use(&mut self, stream: &CudaStream) -> Result<(), Error> {
        let event = stream.record_event(None).map_err(|source| Error::Cuda {
            op: "cuEventRecord",
            source,
        })?;
        self.fences.push(Fence::new(event));
        Ok(())
    }
}

#[cfg(any(all(loom, feature = "loom"), feature = "testing"))]
impl PinnedBuffer {
    /// Records a fence that completes when `done` is set and fails when
    /// `failed` is (loom models and the `testing` feature).
    pub(crate) fn record_flag(
        &mut self,
        done: Arc<crate::sync::AtomicBool>,
        failed: Arc<crate::sync::AtomicBool>,
    ) {
        self.fences.push(Fence::flag(done, failed));
    }
}

impl PinnedBuffer {
    /// What cudarc should do after the copy it is about to enqueue on
    /// `stream`: record an event that the cleaner will wait on, or, where
    /// cudarc would not record one (its context is not tracking events),
    /// synchronize the stream.
    fn copy_fence<'a>(&'a self, stream: &'a CudaStream) -> SyncOnDrop<'a> {
        if !stream.context().is_managing_stream_synchronization() {
            return SyncOnDrop::Sync(Some(stream));
        }
        let Ok(event) = stream.context().new_event(None) else {
            return SyncOnDrop::Sync(Some(stream));
        };
        let event = Box::new(event);
        let ptr: *const CudaEvent = &*event;
        self.copies.lock().push(event);
        // SAFETY:
        // - the event is boxed, so its address survives the list growing;
        // - it leaves the list only in `Drop`, which needs the buffer by
        //   value, after every borrow `'a` of it has ended.
        SyncOnDrop::Record(Some((unsafe { &*ptr }, stream)))
    }

    /// Views the bytes as elements of a plain-old-data type (the tail
    /// shorter than one element is left out), for staging typed data with
    /// cudarc: `stream.memcpy_htod(&buf.typed::<u32>(), &mut dst)` records
    /// the buffer's last use like a copy of the buffer itself.
    ///
    /// # Panics
    ///
    /// If `T` is zero-sized or needs more than page alignment.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// let mut buf = pool.take(64);
    /// buf.typed_mut::<u32>()[3] = 7;
    /// assert_eq!(buf.typed::<u32>().len(), 16);
    /// assert_eq!(buf.typed::<u32>()[3], 7);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn typed<T: Pod>(&self) -> Typed<'_, T> {
        check_element::<T>();
        Typed {
            buf: self,
            _element: PhantomData,
        }
    }

    /// Like [`typed`](Self::typed), writable.
    pub fn typed_mut<T: Pod>(&mut self) -> TypedMut<'_, T> {
        check_element::<T>();
        TypedMut {
            buf: self,
            _element: PhantomData,
        }
    }

    /// The bytes covered by whole elements of `T`.
    fn element_bytes<T>(&self) -> usize {
        self.block.len() / std::mem::size_of::<T>() * std::mem::size_of::<T>()
    }

    /// The whole elements of `T` (what both typed views show).
    fn elements<T: Pod>(&self) -> &[T] {
        bytemuck::cast_slice(&self[..self.element_bytes::<T>()])
    }
}

fn check_element<T>() {
    assert!(
        std::mem::size_of::<T>() > 0,
        "pinpool: typed views need a sized element type"
    );
    assert!(
        std::mem::align_of::<T>() <= crate::size_class::PAGE,
        "pinpool: typed views support alignments up to a page"
    );
}

/// Copies from the buffer with cudarc record the buffer's last use on the
/// copying stream, as [`PinnedBuffer::record_last_use`] would.
impl HostSlice<u8> for PinnedBuffer {
    fn len(&self) -> usize {
        self.block.len()
    }

    unsafe fn stream_synced_slice<'a>(
        &'a self,
        stream: &'a CudaStream,
    ) -> (&'a [u8], SyncOnDrop<'a>) {
        (self.block.as_slice(), self.copy_fence(stream))
    }

    unsafe fn stream_synced_mut_slice<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (&'a mut [u8], SyncOnDrop<'a>) {
        let (ptr, len) = (self.block.as_ptr(), self.block.len());
        let fence = self.copy_fence(stream);
        // SAFETY: `ptr` holds `len` initialised bytes owned by the buffer,
        // and the `&'a mut self` borrow makes this the only access to them;
        // `copy_fence` touches only the event list, not the bytes.
        (unsafe { std::slice::from_raw_parts_mut(ptr, len) }, fence)
    }
}

/// A view of a [`PinnedBuffer`] as `[T]`; see [`PinnedBuffer::typed`].
///
/// # Examples
///
/// ```
/// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
/// let buf = pool.take(64);
/// let words: pinpool::Typed<'_, u64> = buf.typed();
/// assert_eq!(words.len(), 8);
/// # Ok::<(), pinpool::Error>(())
/// ```
#[derive(Debug)]
pub struct Typed<'a, T> {
    buf: &'a PinnedBuffer,
    _element: PhantomData<T>,
}

impl<T: Pod> Deref for Typed<'_, T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        self.buf.elements()
    }
}

impl<T: Pod> HostSlice<T> for Typed<'_, T> {
    fn len(&self) -> usize {
        self.buf.elements::<T>().len()
    }

    unsafe fn stream_synced_slice<'a>(
        &'a self,
        stream: &'a CudaStream,
    ) -> (&'a [T], SyncOnDrop<'a>) {
        (self, self.buf.copy_fence(stream))
    }

    /// A shared view cannot be copied into.
    ///
    /// # Panics
    ///
    /// Always: copy into a [`TypedMut`] (from [`PinnedBuffer::typed_mut`]).
    unsafe fn stream_synced_mut_slice<'a>(
        &'a mut self,
        _stream: &'a CudaStream,
    ) -> (&'a mut [T], SyncOnDrop<'a>) {
        panic!("pinpool: cannot copy into a shared typed view; use PinnedBuffer::typed_mut")
    }
}

/// A writable view of a [`PinnedBuffer`] as `[T]`; see
/// [`PinnedBuffer::typed_mut`].
///
/// # Examples
///
/// ```
/// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
/// let mut buf = pool.take(64);
/// let mut words: pinpool::TypedMut<'_, u16> = buf.typed_mut();
/// words[0] = 0xABCD;
/// assert_eq!(buf[..2], 0xABCDu16.to_ne_bytes());
/// # Ok::<(), pinpool::Error>(())
/// ```
#[derive(Debug)]
pub struct TypedMut<'a, T> {
    buf: &'a mut PinnedBuffer,
    _element: PhantomData<T>,
}

impl<T: Pod> Deref for TypedMut<'_, T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        self.buf.elements()
    }
}

impl<T: Pod> DerefMut for TypedMut<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let bytes = self.buf.element_bytes::<T>();
        bytemuck::cast_slice_mut(&mut self.buf[..bytes])
    }
}

impl<T: Pod> HostSlice<T> for TypedMut<'_, T> {
    fn len(&self) -> usize {
        self.buf.elements::<T>().len()
    }

    unsafe fn stream_synced_slice<'a>(
        &'a self,
        stream: &'a CudaStream,
    ) -> (&'a [T], SyncOnDrop<'a>) {
        (self, self.buf.copy_fence(stream))
    }

    unsafe fn stream_synced_mut_slice<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (&'a mut [T], SyncOnDrop<'a>) {
        let fence = self.buf.copy_fence(stream);
        let bytes = self.buf.element_bytes::<T>();
        let ptr = self.buf.block.as_ptr();
        // SAFETY: `ptr` holds at least `bytes` initialised bytes, page
        // aligned (so aligned for `T`, checked at construction), every bit
        // pattern is a valid `T` (`Pod`), and `&'a mut self` makes this the
        // only access to them.
        let elements = unsafe {
            std::slice::from_raw_parts_mut(ptr.cast::<T>(), bytes / std::mem::size_of::<T>())
        };
        (elements, fence)
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
        let mut fences = std::mem::take(&mut self.fences);
        // `&mut self`: no copy can be recording, so no lock is taken.
        let copies = std::mem::take(self.copies.get_mut());
        fences.extend(copies.into_iter().map(|event| Fence::new(*event)));
        Inbox::submit(&home, block, self.dirty, fences);
    }
}
