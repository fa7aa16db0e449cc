//! [`PinnedBuffer`]: the guard `take` hands out.

use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use cudarc::driver::{result, sys, CudaEvent, CudaStream, HostSlice, SyncOnDrop};

use crate::alloc::Block;
use crate::backend::cuda::Bound;
use crate::error::Error;
#[cfg(feature = "testing")]
use crate::fence::TestFence;
use crate::fence::{must_sync, Fence, Fences};
use crate::sync::{AtomicU8, Ordering};
use crate::thread_cache::ThreadCache;
use crate::tune::{Tune, Tuning};

/// [`PinnedBuffer::copies_pending`]: a copy through cudarc reads the buffer.
const READS: u8 = 1;
/// [`PinnedBuffer::copies_pending`]: a copy through cudarc writes into it.
const WRITES: u8 = 2;

// The guard is two pointers: a move keeps it in two registers (a larger
// one is copied through memory, and reading back fields just written
// stalls the copy on store forwarding).
const _: () = assert!(std::mem::size_of::<PinnedBuffer>() == 2 * std::mem::size_of::<usize>());

/// Set in the address `PinnedBuffer::home` holds while the dirty prefix is
/// at most [`Tuning::SELF_CLEAN_BYTES`] (a cache's address has the bit
/// clear: it is aligned to more than 2).
const SMALL_DIRTY: usize = 1;
const _: () = assert!(std::mem::align_of::<ThreadCache>() > SMALL_DIRTY);

/// A host staging buffer owned by a pool, handed out by
/// [`Pool::take`](crate::Pool::take).
///
/// Dereferences to `[u8]` of exactly the class size. The memory never moves
/// or grows, and dropping the guard is the only way to let it go: it goes
/// back through the pool's cleaner, which waits for the copies still
/// reading it, re-zeroes what was written and makes it ready again.
/// Dropping never blocks and never calls CUDA, in every state of the pool.
///
/// Copies made through cudarc (the buffer and its views are cudarc
/// [`HostSlice`]s) record the buffer's last use by themselves, and host
/// access waits for the ones it could race with: reading (`Deref`, the
/// read-only views) waits for copies *into* the buffer, writing
/// (`DerefMut`, the writable views) for every copy, reads of the buffer
/// included. So `buf.as_ptr()` or a host read after an upload does not
/// block on the upload. Copies enqueued by other means are
/// marked with [`record_last_use`](Self::record_last_use); host access does
/// not wait for those: ordering them with host writes is the caller's job.
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
    /// The block, whose metadata also holds the guard's own state while
    /// the buffer is out: the length shown (the size class taken: the
    /// block's own length, or less for a block borrowed from a larger
    /// class, whose bytes past it stay untouched, and zero), the dirty
    /// prefix, whether the take was a hit, and the copies made through
    /// cudarc since the last wait for them (bits [`READS`], copies from the
    /// buffer, and [`WRITES`], copies into it).
    block: ManuallyDrop<Block>,
    /// The cache the buffer goes back to, with [`SMALL_DIRTY`] set in the
    /// address while the dirty prefix is small enough for the taker to
    /// re-zero: so that a drop, by another thread too, chooses where the
    /// buffer goes without reading the metadata line the prefix is written
    /// in (which its owner writes on every trip).
    home: NonNull<ThreadCache>,
}

// SAFETY: the buffer owns its block; `home` points into the pool's caches,
// which outlive every buffer (a closed pool is kept for its late drops).
unsafe impl Send for PinnedBuffer {}
// SAFETY: shared access reads the bytes (after waiting for copies through
// cudarc, under the block's fence lock) or records a copy under that lock.
unsafe impl Sync for PinnedBuffer {}

// === impl PinnedBuffer ===

impl PinnedBuffer {
    #[inline]
    pub(crate) fn new(mut block: Block, home: &ThreadCache, pooled: bool, len: usize) -> Self {
        debug_assert!(len <= block.len());
        let meta = block.meta_mut();
        meta.shown = len;
        meta.dirty = len;
        meta.pooled = pooled;
        // Relaxed: the block is exclusively this thread's (`&mut`); the
        // guard is shared with other threads only through whatever hands
        // it over, which orders this store before their accesses.
        meta.copies_pending.store(0, Ordering::Relaxed);
        Self {
            block: ManuallyDrop::new(block),
            home: Self::tag(NonNull::from(home), len),
        }
    }

    /// The length shown (see the `block` field).
    #[inline]
    fn shown(&self) -> usize {
        self.block.shown()
    }

    #[inline]
    fn copies_pending(&self) -> &AtomicU8 {
        self.block.copies_pending()
    }

    /// Whether the buffer is page-locked. `false` for pool-miss buffers
    /// (freed when dropped, or, with regions off, registered on their first
    /// trip through the cleaner) and on the host backend.
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
        self.block.was_pooled()
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
    /// A copy through cudarc *into* the buffer (or a writable view) widens
    /// the prefix to what it can write.
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
        self.set_dirty(len.min(self.shown()));
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
        self.block.dirty()
    }

    /// The bytes the buffer occupies (and, when pinned, pins): `len()`, or
    /// more for a buffer borrowed from a larger idle class (see
    /// [`PoolBuilder::borrow_slack`](crate::PoolBuilder::borrow_slack)),
    /// which goes back to that class when dropped.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// let buf = pool.take(4096);
    /// assert!(buf.capacity() >= buf.len());
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    #[inline]
    pub fn capacity(&self) -> usize {
        self.block.len()
    }

    /// Widens the dirty prefix to at least `len` bytes (a copy into them).
    #[inline]
    pub(crate) fn widen_dirty(&mut self, len: usize) {
        let dirty = self.block.dirty().max(len.min(self.shown()));
        self.set_dirty(dirty);
    }

    /// Records the point on `stream` after which the buffer is no longer
    /// read: call it right after enqueueing the last copy out of the buffer
    /// on that stream. The cleaner then waits on exactly this event before
    /// reusing the buffer, instead of synchronizing the whole device. If
    /// several streams read the buffer, record on each. Events come from a
    /// pool and are reused: none is created in the steady state.
    ///
    /// Copies made through cudarc need no call: they record by themselves.
    /// Without any recorded event, the cleaner synchronizes the buffer's
    /// device (its primary context; see [`device`](Self::device)) before
    /// reusing a pinned buffer.
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
        // Borrowed, not cloned: every thread's streams share their
        // context's reference count, a line a clone would move between
        // their cores at every call.
        let ctx = stream.context();
        // SAFETY: `stream` is a live stream of `ctx`, alive for this call.
        unsafe { self.record_on(ctx, stream.cu_stream()) }
    }

    /// Like [`record_last_use`](Self::record_last_use), for a stream known
    /// only by its raw handle (openvm's own stream type, cust, or another
    /// library's): records a pooled event of the buffer's device's primary
    /// context on `stream`.
    ///
    /// # Safety
    ///
    /// `stream` is a live stream (not yet destroyed) of the *primary
    /// context* of the buffer's [`device`](Self::device) (the context
    /// `cuDevicePrimaryCtxRetain` returns, which cudarc's
    /// `CudaContext::new` and the runtime API use), and the copies it should
    /// cover were enqueued on it before this call.
    ///
    /// # Errors
    ///
    /// If the pool does not run on the CUDA backend, or the event cannot be
    /// created or recorded.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(pool: &pinpool::Pool, raw: cudarc::driver::sys::CUstream) -> Result<(), pinpool::Error> {
    /// let mut buf = pool.take(1 << 20);
    /// // ... enqueue the copies out of `buf` on `raw` (device 0's primary context), then:
    /// // SAFETY: `raw` is a live stream of device 0's primary context.
    /// unsafe { buf.record_last_use_raw(raw) }?;
    /// drop(buf);
    /// # Ok(()) }
    /// ```
    pub unsafe fn record_last_use_raw(&mut self, stream: sys::CUstream) -> Result<(), Error> {
        let home = self.home_ptr();
        // SAFETY: as in `home` (the caches, and the backend's contexts,
        // outlive every buffer out); read through the pointer so that the
        // context stays borrowed (not cloned: see `record_last_use`) while
        // the block is borrowed mutably.
        let backend = unsafe { home.as_ref() }.caches().backend();
        let Some(ctx) = backend.context(self.device()) else {
            return Err(Error::BackendUnavailable(
                "record_last_use_raw needs a pool on the CUDA backend".into(),
            ));
        };
        // SAFETY: forwarded from the caller.
        unsafe { self.record_on(ctx, stream) }
    }

    /// Records a pooled event of `ctx` on `stream`.
    ///
    /// # Safety
    /// `stream` is a live stream of `ctx`.
    unsafe fn record_on(
        &mut self,
        ctx: &std::sync::Arc<cudarc::driver::CudaContext>,
        stream: sys::CUstream,
    ) -> Result<(), Error> {
        let home = self.home_ptr();
        // SAFETY: as in `home` (the caches outlive every buffer out); read
        // through the pointer so that the block can be borrowed mutably.
        let events = &unsafe { home.as_ref() }.caches().events;
        let fences = self.block.fences_mut();
        let event = fences.event(ctx, events)?;
        // SAFETY: `stream` is a live stream of the event's context (the
        // caller's promise; the event was taken for `ctx`).
        if let Err(e) = unsafe { event.record(stream) } {
            fences.spare(event);
            return Err(e);
        }
        fences.push(Fence::Event(event));
        Ok(())
    }

    /// Waits for copies made through cudarc into the buffer before the host
    /// reads it (copies from it may go on: both only read).
    #[inline]
    fn sync_host(&self) {
        // Acquire pairs with the Release that set or cleared the bit (a
        // copy into the buffer is recorded through `&mut self`, which ended
        // before this `&self` borrow began; or another reader's wait): what
        // that thread saw of the copies, this one sees.
        if self.copies_pending().load(Ordering::Acquire) & WRITES != 0 {
            self.wait_copies();
        }
    }

    /// Waits for every copy made through cudarc before the host writes the
    /// buffer.
    #[inline]
    fn sync_host_mut(&mut self) {
        // Relaxed: with `&mut self`, every copy was recorded through a
        // borrow that ended before this one began (whatever handed the
        // buffer over ordered them), so the bits are current.
        if self.copies_pending().load(Ordering::Relaxed) != 0 {
            let fences = self.block.fences_mut();
            if let Err(e) = fences.wait_copies() {
                panic!("pinpool: waiting for a copy made through cudarc failed: {e}");
            }
            // Every copy has finished: their events go back to the spares,
            // so a buffer used for many copies keeps no more events.
            fences.retire_copies();
            // Relaxed: `&mut self`, as above.
            self.copies_pending().store(0, Ordering::Relaxed);
        }
    }

    /// The shared-borrow wait: for the copies into the buffer only.
    #[cold]
    fn wait_copies(&self) {
        let fences = self.block.fences_locked();
        if let Err(e) = fences.wait_copies() {
            panic!("pinpool: waiting for a copy made through cudarc failed: {e}");
        }
        // Only the copies into the buffer are known to be done: a copy from
        // it that another thread is setting up may have pushed its event
        // before cudarc records it (so the wait above passed it), and its
        // READS bit must stay for the next host write. Release pairs with
        // the Acquire load in `sync_host`.
        self.copies_pending().fetch_and(!WRITES, Ordering::Release);
    }

    /// What cudarc should do after the copy it is about to enqueue on
    /// `stream` (from the buffer, or into it with `writes`): record a pooled event that host access and the cleaner
    /// will wait on, or, where cudarc would not record it (the legacy
    /// default stream, or a context whose events cudarc does not manage),
    /// synchronize the stream. The stream is made to wait for earlier
    /// copies made through cudarc on other streams.
    pub(crate) fn copy_fence<'a>(&'a self, stream: &'a CudaStream, writes: bool) -> SyncOnDrop<'a> {
        let mut fences = self.block.fences_locked();
        if fences.has_copies() {
            self.order_after_copies(&fences, stream);
        }
        if must_sync(stream) {
            return SyncOnDrop::Sync(Some(stream));
        }
        let events = &self.home().caches().events;
        let Ok(event) = fences.event(stream.context(), events) else {
            return SyncOnDrop::Sync(Some(stream));
        };
        let event: *const CudaEvent = fences.push_copy(event);
        // Release pairs with the Acquire load in `sync_host` on a thread
        // that shares the buffer.
        let bit = if writes { WRITES } else { READS };
        self.copies_pending().fetch_or(bit, Ordering::Release);
        drop(fences);
        // SAFETY: the event is boxed and stays in `copies` until the buffer
        // is accessed through `&mut self` (drop, `DerefMut`), which cannot
        // happen while this `&'a self` borrow lives.
        SyncOnDrop::Record(Some((unsafe { &*event }, stream)))
    }

    /// Makes `stream` wait for the copies made through cudarc so far.
    fn order_after_copies(&self, fences: &Fences, stream: &CudaStream) {
        let Ok(_bound) = Bound::to(stream.context().cu_ctx()) else {
            return;
        };
        for event in fences.copy_events() {
            // SAFETY: a live stream and a live event; the wait only orders
            // work on the device.
            let waited = unsafe {
                result::stream::wait_event(
                    stream.cu_stream(),
                    event,
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
            };
            if let Err(e) = waited {
                tracing::warn!(error = %e, "pinpool: cuStreamWaitEvent failed");
            }
        }
    }

    /// The bytes, for the views: after waiting for copies.
    #[inline]
    pub(crate) fn bytes(&self) -> &[u8] {
        self.sync_host();
        &self.block.as_slice()[..self.shown()]
    }

    /// The bytes, writable: after waiting for copies.
    #[inline]
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        self.sync_host_mut();
        let len = self.shown();
        &mut self.block.as_mut_slice()[..len]
    }

    /// The bytes without waiting, for cudarc's copy path (the stream orders
    /// the copy after earlier ones).
    pub(crate) fn raw_bytes(&self) -> &[u8] {
        &self.block.as_slice()[..self.shown()]
    }

    /// The bytes without waiting, writable, for cudarc's copy path.
    pub(crate) fn raw_bytes_mut(&mut self) -> *mut u8 {
        self.block.as_ptr()
    }

    fn home(&self) -> &ThreadCache {
        // SAFETY: see the `Send` impl.
        unsafe { self.home_ptr().as_ref() }
    }

    /// The home cache's address, its tag cleared (with the provenance of
    /// the pointer it was made from).
    #[inline]
    fn home_ptr(&self) -> NonNull<ThreadCache> {
        // Never 0: a cache's address is nonzero and has the tag's bit clear.
        self.home
            .map_addr(|a| std::num::NonZeroUsize::new(a.get() & !SMALL_DIRTY).unwrap_or(a))
    }

    /// `home` (untagged) tagged for a dirty prefix of `dirty` bytes.
    #[inline]
    fn tag(home: NonNull<ThreadCache>, dirty: usize) -> NonNull<ThreadCache> {
        let tag = if dirty <= Tune::SELF_CLEAN_BYTES {
            SMALL_DIRTY
        } else {
            0
        };
        home.map_addr(|a| a | tag)
    }

    /// Sets the dirty prefix (in the metadata) and its tag. The guard is
    /// written only when the tag changes: a move of the guard right after a
    /// store into it would stall on store forwarding (see the size
    /// assertion above), and most narrowings keep the tag.
    #[inline]
    fn set_dirty(&mut self, dirty: usize) {
        self.block.meta_mut().dirty = dirty;
        let tagged = Self::tag(self.home_ptr(), dirty);
        if tagged != self.home {
            self.home = tagged;
        }
    }
}

/// Copies from the buffer with cudarc record the buffer's last use on the
/// copying stream; see [`PinnedBuffer`].
impl HostSlice<u8> for PinnedBuffer {
    fn len(&self) -> usize {
        self.shown()
    }

    unsafe fn stream_synced_slice<'a>(
        &'a self,
        stream: &'a CudaStream,
    ) -> (&'a [u8], SyncOnDrop<'a>) {
        (self.raw_bytes(), self.copy_fence(stream, false))
    }

    unsafe fn stream_synced_mut_slice<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (&'a mut [u8], SyncOnDrop<'a>) {
        let len = self.shown();
        self.widen_dirty(len);
        let ptr = self.raw_bytes_mut();
        let fence = self.copy_fence(stream, true);
        // SAFETY: `ptr` holds `len` initialised bytes owned by the buffer,
        // and the `&'a mut self` borrow makes this the only access to them;
        // `copy_fence` touches only the fences, not the bytes.
        (unsafe { std::slice::from_raw_parts_mut(ptr, len) }, fence)
    }
}

impl Deref for PinnedBuffer {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        self.bytes()
    }
}

impl DerefMut for PinnedBuffer {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        self.bytes_mut()
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
            .field("len", &self.shown())
            .field("device", &self.device())
            .field("pinned", &self.is_pinned())
            .field("dirty_len", &self.dirty_len())
            .field("pooled", &self.was_pooled())
            .finish_non_exhaustive()
    }
}

impl Drop for PinnedBuffer {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: taken exactly once, here, and never used again.
        let mut block = unsafe { ManuallyDrop::take(&mut self.block) };
        // `&mut self`: no copy can be recording, so no lock is taken.
        let fences = block.fences_mut();
        if fences.has_copies() {
            fences.seal();
        }
        let small = self.home.addr().get() & SMALL_DIRTY != 0;
        self.home().give_back(block, small);
    }
}

// === impl TestFence ===

// Written here, not in `fence`, so that fences know nothing of buffers.
#[cfg(feature = "testing")]
impl TestFence {
    /// Makes `buf` wait for this fence before it is reused.
    pub fn record(&self, buf: &mut PinnedBuffer) {
        buf.block.fences_mut().push(self.to_fence());
    }
}
