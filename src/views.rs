//! Views of a [`PinnedBuffer`]: as elements of a plain-old-data type, and
//! of a prefix, each a cudarc [`HostSlice`] that records the buffer's last
//! use like the buffer itself.
//!
//! A [`Typed`] view is `count` elements of `T` from the start of the
//! buffer: the whole buffer's worth with [`PinnedBuffer::typed`], or a
//! prefix with [`PinnedBuffer::typed_prefix`]; [`Prefix`] is the byte case.
//! A copy into a [`TypedMut`] widens the buffer's dirty length to the
//! view's bytes.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use bytemuck::Pod;
use cudarc::driver::{CudaStream, HostSlice, SyncOnDrop};

use crate::buffer::PinnedBuffer;

/// A read-only view of a buffer's first `len()` elements of `T`; see
/// [`PinnedBuffer::typed`] and [`PinnedBuffer::typed_prefix`].
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
    count: usize,
    _element: PhantomData<T>,
}

/// A writable view of a buffer's first `len()` elements of `T`; see
/// [`PinnedBuffer::typed_mut`] and [`PinnedBuffer::typed_prefix_mut`].
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
    count: usize,
    _element: PhantomData<T>,
}

/// The first bytes of a buffer; see [`PinnedBuffer::prefix`].
pub type Prefix<'a> = Typed<'a, u8>;

/// The first bytes of a buffer, writable; see [`PinnedBuffer::prefix_mut`].
pub type PrefixMut<'a> = TypedMut<'a, u8>;

/// Checks that `count` elements of `T` fit `buf` and that `T` can be viewed
/// there; panics with a clear message otherwise.
#[track_caller]
fn check<T>(buf: &PinnedBuffer, count: usize) {
    let size = std::mem::size_of::<T>();
    assert!(size > 0, "pinpool: views need a sized element type");
    assert!(
        (buf.raw_bytes().as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()),
        "pinpool: the buffer is not aligned for a {}-byte-aligned element",
        std::mem::align_of::<T>()
    );
    let fits = count
        .checked_mul(size)
        .is_some_and(|bytes| bytes <= buf.raw_bytes().len());
    assert!(
        fits,
        "pinpool: a view of {count} elements of {size} bytes does not fit a {}-byte buffer",
        buf.raw_bytes().len()
    );
}

impl PinnedBuffer {
    /// Views the bytes as elements of a plain-old-data type (a tail shorter
    /// than one element is left out), for staging typed data with cudarc:
    /// `stream.memcpy_htod(&buf.typed::<u32>(), &mut dst)` records the
    /// buffer's last use like a copy of the buffer itself. The buffer is
    /// usually longer than asked (its size class): to copy exactly `n`
    /// elements, use [`typed_prefix`](Self::typed_prefix).
    ///
    /// # Panics
    ///
    /// If `T` is zero-sized, or aligned more strictly than the buffer.
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
    #[track_caller]
    pub fn typed<T: Pod>(&self) -> Typed<'_, T> {
        let count = self.raw_bytes().len() / std::mem::size_of::<T>().max(1);
        self.typed_prefix(count)
    }

    /// Like [`typed`](Self::typed), writable.
    #[track_caller]
    pub fn typed_mut<T: Pod>(&mut self) -> TypedMut<'_, T> {
        let count = self.raw_bytes().len() / std::mem::size_of::<T>().max(1);
        self.typed_prefix_mut(count)
    }

    /// The first `count` elements of `T`.
    ///
    /// # Panics
    ///
    /// If they do not fit the buffer, `T` is zero-sized, or aligned more
    /// strictly than the buffer.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// let mut buf = pool.take(10 * 4); // 64 bytes: the class is larger
    /// buf.typed_prefix_mut::<u32>(10).copy_from_slice(&[1; 10]);
    /// assert_eq!(buf.typed_prefix::<u32>(10).len(), 10);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    #[track_caller]
    pub fn typed_prefix<T: Pod>(&self, count: usize) -> Typed<'_, T> {
        check::<T>(self, count);
        Typed {
            buf: self,
            count,
            _element: PhantomData,
        }
    }

    /// Like [`typed_prefix`](Self::typed_prefix), writable.
    #[track_caller]
    pub fn typed_prefix_mut<T: Pod>(&mut self, count: usize) -> TypedMut<'_, T> {
        check::<T>(self, count);
        TypedMut {
            buf: self,
            count,
            _element: PhantomData,
        }
    }

    /// The first `len` bytes, as a cudarc `HostSlice` that records the
    /// buffer's last use: `stream.memcpy_htod(&buf.prefix(n), &mut dst)`
    /// copies exactly `n` bytes.
    ///
    /// # Panics
    ///
    /// If `len` is past the end of the buffer.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// let mut buf = pool.take(100);
    /// buf.prefix_mut(3).copy_from_slice(b"abc");
    /// assert_eq!(&*buf.prefix(3), b"abc");
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    #[track_caller]
    pub fn prefix(&self, len: usize) -> Prefix<'_> {
        self.typed_prefix(len)
    }

    /// Like [`prefix`](Self::prefix), writable.
    #[track_caller]
    pub fn prefix_mut(&mut self, len: usize) -> PrefixMut<'_> {
        self.typed_prefix_mut(len)
    }
}

/// The elements of a view, from bytes `[0, count * size_of::<T>())`.
fn elements<T: Pod>(bytes: &[u8], count: usize) -> &[T] {
    bytemuck::cast_slice(&bytes[..count * std::mem::size_of::<T>()])
}

impl<T: Pod> Deref for Typed<'_, T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        elements(self.buf.bytes(), self.count)
    }
}

impl<T: Pod> Deref for TypedMut<'_, T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        elements(self.buf.bytes(), self.count)
    }
}

impl<T: Pod> DerefMut for TypedMut<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let bytes = self.count * std::mem::size_of::<T>();
        bytemuck::cast_slice_mut(&mut self.buf.bytes_mut()[..bytes])
    }
}

impl<T: Pod> HostSlice<T> for Typed<'_, T> {
    fn len(&self) -> usize {
        self.count
    }

    unsafe fn stream_synced_slice<'a>(
        &'a self,
        stream: &'a CudaStream,
    ) -> (&'a [T], SyncOnDrop<'a>) {
        (
            elements(self.buf.raw_bytes(), self.count),
            self.buf.copy_fence(stream, false),
        )
    }

    /// A read-only view cannot be copied into.
    ///
    /// # Panics
    ///
    /// Always: copy into a [`TypedMut`] (from
    /// [`PinnedBuffer::typed_mut`] or [`PinnedBuffer::prefix_mut`]).
    unsafe fn stream_synced_mut_slice<'a>(
        &'a mut self,
        _stream: &'a CudaStream,
    ) -> (&'a mut [T], SyncOnDrop<'a>) {
        panic!("pinpool: cannot copy into a read-only view; use typed_mut or prefix_mut")
    }
}

impl<T: Pod> HostSlice<T> for TypedMut<'_, T> {
    fn len(&self) -> usize {
        self.count
    }

    unsafe fn stream_synced_slice<'a>(
        &'a self,
        stream: &'a CudaStream,
    ) -> (&'a [T], SyncOnDrop<'a>) {
        (
            elements(self.buf.raw_bytes(), self.count),
            self.buf.copy_fence(stream, false),
        )
    }

    unsafe fn stream_synced_mut_slice<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (&'a mut [T], SyncOnDrop<'a>) {
        let count = self.count;
        self.buf.widen_dirty(count * std::mem::size_of::<T>());
        let ptr = self.buf.raw_bytes_mut();
        let fence = self.buf.copy_fence(stream, true);
        // SAFETY: `ptr` holds at least `count * size_of::<T>()` initialised
        // bytes (checked when the view was made), aligned for `T` (checked
        // too), every bit pattern is a valid `T` (`Pod`), and `&'a mut self`
        // makes this the only access to them.
        let elements = unsafe { std::slice::from_raw_parts_mut(ptr.cast::<T>(), count) };
        (elements, fence)
    }
}
