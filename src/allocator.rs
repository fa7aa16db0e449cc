//! [`PinnedAlloc`]: pooled buffers as the memory of growable collections
//! (`allocator_api2::vec::Vec` and the other collections written against
//! `allocator_api2::alloc::Allocator`), behind the `allocator-api2` feature.
//!
//! An allocation is a taken [`PinnedBuffer`], kept in a table keyed by its
//! address until it is deallocated, when the buffer is dropped as any
//! other: through the cleaner, which waits for the copies recorded for it
//! (or synchronizes its device), re-zeroes it and pools it again. The table
//! is split by address into a few shards, each under its own lock; it is
//! reached only when a collection allocates, grows, shrinks or frees, or
//! when a copy is recorded, never on element access.

use std::collections::HashMap;
use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

use allocator_api2::alloc::{AllocError, Allocator, Layout};
use cudarc::driver::{sys, CudaStream};

use crate::{Error, PinnedBuffer, Pool};

/// How many locks the table of live allocations is split into.
const SHARDS: usize = 16;

/// The largest alignment a buffer shorter than a page has: sub-page buffers
/// are carved from page-aligned slabs at 256-byte steps (see `size_class`).
/// A request for more takes at least a page, whose buffers are page-aligned.
const SUB_PAGE_ALIGN: usize = 256;

/// An allocator that serves collections from a [`Pool`]'s buffers on one
/// device: `allocate` takes, `deallocate` drops, `grow` takes the next size
/// and copies, and `allocate_zeroed` costs nothing more than `allocate`,
/// because every buffer is all-zero when taken.
///
/// An allocation is the whole buffer: the block returned is the buffer's
/// length (its size class), and growing or shrinking within that length
/// moves nothing. (`allocator_api2::vec::Vec` keeps the capacity it asked
/// for rather than the block's length, so a `reserve_exact` up to the
/// buffer's length stays in place, while its doubling growth moves.)
/// Alignments up to a page are honoured; a larger one fails to allocate.
/// Clones share one table of allocations and free each other's.
///
/// # Copies from the memory
///
/// Freeing an allocation drops its buffer, which the cleaner reuses only
/// once nothing can still read it: once the copies recorded for it have
/// finished, or, when none was recorded, after synchronizing its device. A
/// copy made from a collection's memory is recorded with
/// [`record_last_use`](Self::record_last_use) (a cudarc stream) or
/// [`record_last_use_raw`](Self::record_last_use_raw) (a raw stream),
/// given the collection's pointer (`Vec::as_ptr`). A collection that grows
/// moves to a new allocation, and the copies recorded for the old one stay
/// with it; record again after the last growth, with the pointer the
/// collection has then. (Allocations are found by address: a pointer kept
/// from before a move may by then begin another live allocation of this
/// allocator, and a use recorded with it lands on that one.)
///
/// # Pinned or not
///
/// An allocation served by a pool miss is pageable, as a miss's buffer is
/// (see [`Pool::take`]); it becomes pinned for a later allocation of its
/// size once it has been freed. [`is_pinned`](Self::is_pinned) says which
/// an allocation got. The bytes the cleaner re-zeroes are the whole
/// allocation unless narrowed with [`set_dirty_len`](Self::set_dirty_len).
///
/// # Examples
///
/// ```
/// use allocator_api2::vec::Vec;
/// use pinpool::{BackendKind, PinnedAlloc, Pool};
///
/// let pool = Pool::builder().backend(BackendKind::Host).build()?;
/// let alloc = PinnedAlloc::new(&pool, 0)?;
/// let mut records: Vec<u64, _> = Vec::new_in(alloc.clone());
/// records.extend(0..100_000u64);
/// assert_eq!(records[99_999], 99_999);
/// assert_eq!(alloc.allocations(), 1);
/// drop(records); // the buffer goes back through the cleaner
/// assert_eq!(alloc.allocations(), 0);
/// # Ok::<(), pinpool::Error>(())
/// ```
#[derive(Clone)]
pub struct PinnedAlloc {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    device: usize,
    live: [Mutex<HashMap<usize, PinnedBuffer>>; SHARDS],
}

// === impl PinnedAlloc ===

impl PinnedAlloc {
    /// An allocator taking from `pool`'s shard of `device`.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownDevice`] if the pool does not serve `device`.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinpool::{BackendKind, PinnedAlloc, Pool};
    ///
    /// let pool = Pool::builder().backend(BackendKind::Host).devices(2).build()?;
    /// assert_eq!(PinnedAlloc::new(&pool, 1)?.device(), 1);
    /// assert!(PinnedAlloc::new(&pool, 2).is_err());
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn new(pool: &Pool, device: usize) -> Result<Self, Error> {
        let devices = pool.devices();
        if device >= devices {
            return Err(Error::UnknownDevice { device, devices });
        }
        Ok(Self {
            inner: Arc::new(Inner {
                pool: pool.clone(),
                device,
                live: std::array::from_fn(|_| Mutex::new(HashMap::new())),
            }),
        })
    }

    /// The pool the allocations come from.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinpool::{BackendKind, PinnedAlloc, Pool};
    ///
    /// let pool = Pool::builder().backend(BackendKind::Host).build()?;
    /// let alloc = PinnedAlloc::new(&pool, 0)?;
    /// assert_eq!(alloc.pool().backend(), BackendKind::Host);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The device whose shard the allocations come from.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinpool::{BackendKind, PinnedAlloc, Pool};
    ///
    /// let pool = Pool::builder().backend(BackendKind::Host).build()?;
    /// assert_eq!(PinnedAlloc::new(&pool, 0)?.device(), 0);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn device(&self) -> usize {
        self.inner.device
    }

    /// The allocations made through this allocator (or a clone) and not
    /// yet freed. Zero-sized allocations take nothing and are not counted.
    ///
    /// # Examples
    ///
    /// ```
    /// use allocator_api2::vec::Vec;
    /// use pinpool::{BackendKind, PinnedAlloc, Pool};
    ///
    /// let pool = Pool::builder().backend(BackendKind::Host).build()?;
    /// let alloc = PinnedAlloc::new(&pool, 0)?;
    /// let a: Vec<u8, _> = Vec::with_capacity_in(10, alloc.clone());
    /// let b: Vec<u8, _> = Vec::with_capacity_in(10, alloc.clone());
    /// assert_eq!(alloc.allocations(), 2);
    /// drop((a, b));
    /// assert_eq!(alloc.allocations(), 0);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn allocations(&self) -> usize {
        self.inner.live.iter().map(|shard| lock(shard).len()).sum()
    }

    /// Records the point on `stream` after which the allocation at `ptr`
    /// is no longer read, as [`PinnedBuffer::record_last_use`] does for a
    /// buffer: call it right after enqueueing the last copy out of the
    /// allocation on `stream`. `ptr` is where the allocation begins (a
    /// `Vec`'s `as_ptr`).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownAllocation`] if no live allocation of this allocator
    /// begins at `ptr`, or the errors of `record_last_use`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(pool: &pinpool::Pool, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), pinpool::Error> {
    /// use allocator_api2::vec::Vec;
    ///
    /// let alloc = pinpool::PinnedAlloc::new(pool, 0)?;
    /// let mut records: Vec<u32, _> = Vec::with_capacity_in(1 << 20, alloc.clone());
    /// records.resize(1 << 20, 7);
    /// // ... enqueue the copies out of `records` on `stream`, then:
    /// alloc.record_last_use(records.as_ptr(), stream)?;
    /// drop(records); // reused once the copies have finished
    /// # Ok(()) }
    /// ```
    pub fn record_last_use<T>(&self, ptr: *const T, stream: &CudaStream) -> Result<(), Error> {
        self.with_buffer(ptr.cast(), |buf| buf.record_last_use(stream))?
    }

    /// Like [`record_last_use`](Self::record_last_use), for a stream known
    /// only by its raw handle; see [`PinnedBuffer::record_last_use_raw`].
    ///
    /// # Safety
    ///
    /// As for [`PinnedBuffer::record_last_use_raw`]: `stream` is a live
    /// stream of the primary context of the allocator's
    /// [`device`](Self::device), and the copies it should cover were
    /// enqueued on it before this call.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownAllocation`] if no live allocation of this allocator
    /// begins at `ptr`, or the errors of `record_last_use_raw`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(alloc: &pinpool::PinnedAlloc, raw: cudarc::driver::sys::CUstream) -> Result<(), pinpool::Error> {
    /// let mut staged = allocator_api2::vec::Vec::<u8, _>::with_capacity_in(4096, alloc.clone());
    /// staged.resize(4096, 1);
    /// // ... enqueue the copies out of `staged` on `raw`, then:
    /// // SAFETY: `raw` is a live stream of the device's primary context.
    /// unsafe { alloc.record_last_use_raw(staged.as_ptr(), raw) }?;
    /// # Ok(()) }
    /// ```
    pub unsafe fn record_last_use_raw<T>(
        &self,
        ptr: *const T,
        stream: sys::CUstream,
    ) -> Result<(), Error> {
        self.with_buffer(ptr.cast(), |buf| {
            // SAFETY: forwarded from the caller; the buffer is this
            // allocator's device's.
            unsafe { buf.record_last_use_raw(stream) }
        })?
    }

    /// Narrows the prefix of the allocation at `ptr` that the cleaner
    /// re-zeroes when it is freed (by default all of it), as
    /// [`PinnedBuffer::set_dirty_len`] does: the caller asserts that the
    /// allocation's bytes at `bytes..` have not been written, and will not
    /// be before it is freed: call it after the last write. A growth or a
    /// shrink, moving or not, makes the allocation wholly dirty again (a
    /// `Vec` fills its allocation before it grows), so narrow again after
    /// the last one.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownAllocation`] if no live allocation of this allocator
    /// begins at `ptr`.
    ///
    /// # Examples
    ///
    /// ```
    /// use allocator_api2::vec::Vec;
    /// use pinpool::{BackendKind, PinnedAlloc, Pool};
    ///
    /// let pool = Pool::builder().backend(BackendKind::Host).build()?;
    /// let alloc = PinnedAlloc::new(&pool, 0)?;
    /// let mut v: Vec<u32, _> = Vec::with_capacity_in(1 << 20, alloc.clone());
    /// v.extend([1, 2, 3]);
    /// alloc.set_dirty_len(v.as_ptr(), v.len() * 4)?; // only 12 bytes to re-zero
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn set_dirty_len<T>(&self, ptr: *const T, bytes: usize) -> Result<(), Error> {
        self.with_buffer(ptr.cast(), |buf| buf.set_dirty_len(bytes))
    }

    /// Whether the allocation at `ptr` is page-locked: `false` for one a
    /// pool miss served, and on the host backend.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownAllocation`] if no live allocation of this allocator
    /// begins at `ptr`.
    ///
    /// # Examples
    ///
    /// ```
    /// use allocator_api2::vec::Vec;
    /// use pinpool::{BackendKind, PinnedAlloc, Pool};
    ///
    /// let pool = Pool::builder().backend(BackendKind::Host).build()?;
    /// let alloc = PinnedAlloc::new(&pool, 0)?;
    /// let v: Vec<u8, _> = Vec::with_capacity_in(4096, alloc.clone());
    /// assert!(!alloc.is_pinned(v.as_ptr())?); // the host backend never pins
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn is_pinned<T>(&self, ptr: *const T) -> Result<bool, Error> {
        self.with_buffer(ptr.cast(), |buf| buf.is_pinned())
    }

    /// Runs `f` on the buffer of the live allocation beginning at `ptr`,
    /// under its shard's lock. `f` must not touch the buffer's bytes: the
    /// collection holding the allocation may be using them.
    pub(crate) fn with_buffer<R>(
        &self,
        ptr: *const u8,
        f: impl FnOnce(&mut PinnedBuffer) -> R,
    ) -> Result<R, Error> {
        let addr = ptr.addr();
        let mut shard = lock(self.inner.shard(addr));
        match shard.get_mut(&addr) {
            Some(buf) => Ok(f(buf)),
            None => Err(Error::UnknownAllocation { addr }),
        }
    }

    /// Takes a buffer for `layout` and enters it into the table; `None`
    /// (the caller's `AllocError`) if the pool cannot serve it.
    fn take(&self, layout: Layout) -> Option<NonNull<[u8]>> {
        let align = layout.align();
        let size = buffer_size(layout)?;
        let mut buf = self.inner.pool.take_on(self.inner.device, size).ok()?;
        let len = buf.len();
        let ptr = NonNull::new(buf.as_mut_ptr())?;
        if !ptr.as_ptr().addr().is_multiple_of(align) {
            // Not reached with the alignments above; the buffer goes back.
            debug_assert!(false, "a pool buffer of {len} bytes is not {align}-aligned");
            return None;
        }
        let addr = ptr.as_ptr().addr();
        let previous = lock(self.inner.shard(addr)).insert(addr, buf);
        debug_assert!(previous.is_none(), "two live buffers at {addr:#x}");
        Some(NonNull::slice_from_raw_parts(ptr, len))
    }

    /// Removes the allocation at `ptr` from the table.
    fn remove(&self, ptr: NonNull<u8>) -> Option<PinnedBuffer> {
        let addr = ptr.as_ptr().addr();
        lock(self.inner.shard(addr)).remove(&addr)
    }

    /// The length of the live allocation at `ptr`, which a collection is
    /// growing or shrinking: its dirty prefix is widened to all of it
    /// again, since the collection may have written anywhere in it after a
    /// narrowing (`Vec::extend` fills the allocation before it grows), so
    /// a narrowing holds only until the next growth or shrink, whether the
    /// allocation moves or not.
    fn resizing(&self, ptr: NonNull<u8>) -> Option<usize> {
        self.with_buffer(ptr.as_ptr(), |buf| {
            buf.set_dirty_len(usize::MAX);
            buf.len()
        })
        .ok()
    }

    /// Moves the allocation at `ptr` (whose first `keep` bytes are in use)
    /// to a new one for `layout`, and frees the old one.
    ///
    /// # Safety
    /// `ptr` is a live allocation of this allocator at least `keep` bytes
    /// long, not used by anyone else for the length of the call.
    unsafe fn relocate(
        &self,
        ptr: NonNull<u8>,
        keep: usize,
        layout: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        let new = self.take(layout).ok_or(AllocError)?;
        // SAFETY: both allocations are live and at least `keep` bytes long
        // (the new one is at least `layout.size() >= keep`), and distinct
        // buffers do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(ptr.as_ptr(), new.cast::<u8>().as_ptr(), keep) };
        // The old buffer goes back through the cleaner.
        drop(self.remove(ptr));
        Ok(new)
    }
}

/// The length of buffer to take for `layout`, `None` if its alignment is
/// above a page: a buffer of a page or more is page-aligned, a shorter one
/// aligned to `SUB_PAGE_ALIGN` at least, so a larger alignment takes a
/// page at least.
fn buffer_size(layout: Layout) -> Option<usize> {
    let page = crate::size_class::page_size();
    match layout.align() {
        align if align > page => None,
        align if align > SUB_PAGE_ALIGN => Some(layout.size().max(page)),
        _ => Some(layout.size()),
    }
}

/// A dangling, aligned pointer: a zero-sized allocation.
fn dangling(layout: Layout) -> NonNull<[u8]> {
    // An alignment is never zero.
    let ptr = NonNull::new(layout.align() as *mut u8).unwrap_or(NonNull::dangling());
    NonNull::slice_from_raw_parts(ptr, 0)
}

/// Locks a shard of the table; a panic elsewhere while it was held leaves
/// nothing half-done (each operation is one map insert, removal or
/// lookup), so a poisoned lock is used as it is.
fn lock(
    shard: &Mutex<HashMap<usize, PinnedBuffer>>,
) -> MutexGuard<'_, HashMap<usize, PinnedBuffer>> {
    shard
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Inner {
    fn shard(&self, addr: usize) -> &Mutex<HashMap<usize, PinnedBuffer>> {
        // Sub-page buffers sit 256 bytes apart at least, so the bits above
        // the 256-byte offset spread neighbours over the shards.
        &self.live[(addr >> 8) % SHARDS]
    }
}

impl fmt::Debug for PinnedAlloc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedAlloc")
            .field("device", &self.inner.device)
            .field("allocations", &self.allocations())
            .finish_non_exhaustive()
    }
}

// SAFETY: a block returned by `allocate` is a taken buffer's memory, kept
// (owned by the table in `Inner`, shared by every clone) until
// `deallocate`, or `grow`/`shrink` moving it, removes and drops it; the
// buffers themselves outlive the pool's last handle (a closed pool frees
// them when dropped), and the table holds a handle. Clones share the table,
// so any of them frees what another allocated. Alignment is checked before
// a block is returned, and its length is the buffer's, at least the size
// asked.
unsafe impl Allocator for PinnedAlloc {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            if layout.align() > crate::size_class::page_size() {
                return Err(AllocError);
            }
            return Ok(dangling(layout));
        }
        self.take(layout).ok_or(AllocError)
    }

    fn allocate_zeroed(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        // Every buffer is all-zero when taken.
        self.allocate(layout)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        let buf = self.remove(ptr);
        debug_assert!(buf.is_some(), "deallocate of {ptr:p}, not allocated here");
        // Dropped: through the cleaner, which waits for its copies.
        drop(buf);
    }

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old_layout: Layout,
        new_layout: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        if old_layout.size() == 0 {
            return self.allocate(new_layout);
        }
        // An alignment above a page is an error wherever the block lies.
        buffer_size(new_layout).ok_or(AllocError)?;
        let len = self.resizing(ptr).ok_or(AllocError)?;
        if new_layout.size() <= len && ptr.as_ptr().addr().is_multiple_of(new_layout.align()) {
            return Ok(NonNull::slice_from_raw_parts(ptr, len));
        }
        // SAFETY: the caller's contract: `ptr` is a live allocation of
        // `old_layout` (at least its size), which it does not use meanwhile.
        unsafe { self.relocate(ptr, old_layout.size(), new_layout) }
    }

    unsafe fn grow_zeroed(
        &self,
        ptr: NonNull<u8>,
        old_layout: Layout,
        new_layout: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // The block's bytes past `old_layout.size()` are either its own,
        // kept (growing in place, where the block's length does not
        // change), or a fresh buffer's, all zero.
        // SAFETY: forwarded from the caller.
        unsafe { self.grow(ptr, old_layout, new_layout) }
    }

    unsafe fn shrink(
        &self,
        ptr: NonNull<u8>,
        old_layout: Layout,
        new_layout: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // An alignment above a page is an error wherever the block lies,
        // checked before anything is freed: on an error the caller keeps
        // the block.
        let want = buffer_size(new_layout).ok_or(AllocError)?;
        if new_layout.size() == 0 {
            // SAFETY: forwarded from the caller.
            unsafe { self.deallocate(ptr, old_layout) };
            return Ok(dangling(new_layout));
        }
        let len = self.resizing(ptr).ok_or(AllocError)?;
        let aligned = ptr.as_ptr().addr().is_multiple_of(new_layout.align());
        // Shrinking to half or less of the buffer (counting the page an
        // alignment above `SUB_PAGE_ALIGN` takes) moves to a shorter one,
        // so that the pool gets the longer one back; otherwise, or if no
        // shorter one can be taken, the block stays as it is.
        if aligned && want > len / 2 {
            return Ok(NonNull::slice_from_raw_parts(ptr, len));
        }
        // SAFETY: the caller's contract: `ptr` is live, at least
        // `new_layout.size()` long, and not used meanwhile.
        match unsafe { self.relocate(ptr, new_layout.size(), new_layout) } {
            Ok(new) => Ok(new),
            Err(AllocError) if aligned => Ok(NonNull::slice_from_raw_parts(ptr, len)),
            Err(AllocError) => Err(AllocError),
        }
    }
}

#[cfg(feature = "testing")]
impl crate::testing::TestFence {
    /// Makes the allocation at `ptr` (of `alloc`) wait for this fence
    /// before its buffer is reused, as [`record`](Self::record) does for a
    /// buffer.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownAllocation`] if no live allocation of `alloc` begins
    /// at `ptr`.
    ///
    /// # Examples
    ///
    /// ```
    /// use allocator_api2::vec::Vec;
    /// use pinpool::{testing::TestFence, BackendKind, PinnedAlloc, Pool};
    ///
    /// let pool = Pool::builder().backend(BackendKind::Host).build()?;
    /// let alloc = PinnedAlloc::new(&pool, 0)?;
    /// let v: Vec<u8, _> = Vec::with_capacity_in(4096, alloc.clone());
    /// let fence = TestFence::default();
    /// fence.record_in(&alloc, v.as_ptr())?;
    /// drop(v);
    /// fence.complete(); // until now the cleaner kept the buffer back
    /// pool.flush();
    /// assert_eq!(pool.stats().pooled_buffers, 1);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn record_in<T>(&self, alloc: &PinnedAlloc, ptr: *const T) -> Result<(), Error> {
        alloc.with_buffer(ptr.cast(), |buf| self.record(buf))
    }
}
