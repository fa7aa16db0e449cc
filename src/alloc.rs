//! Page-aligned host allocations: the memory behind every buffer.
//!
//! A [`Block`] is one anonymous `mmap`, so it arrives zeroed and its pages
//! are faulted in lazily: a pool miss costs a system call, not a memset of
//! the whole buffer on the caller's path. Blocks of 2 MiB and more are
//! 2 MiB-aligned and advised for transparent huge pages, which makes the
//! first touch and the registration of large buffers several times faster
//! (DESIGN.md has the measured figures).
//!
//! A block never moves and never changes size, so the base pointer a
//! registration was made for stays valid for the block's whole life.

use std::ptr::NonNull;

use crate::error::Error;
use crate::size_class::{footprint, size, CHUNK, PAGE};
use crate::sync::Contents;

/// Alignment and threshold for transparent huge pages.
const HUGE_PAGE: usize = 2 << 20;

/// One buffer's memory and what the pool knows about it.
///
/// Dropping a block unmaps it. A block that is still page-locked must be
/// unregistered first (see `Shared::release`); dropping it while pinned
/// leaks the mapping instead of handing registered memory back to the OS.
#[derive(Debug)]
pub(crate) struct Block {
    ptr: NonNull<u8>,
    shift: u8,
    device: u16,
    pinned: bool,
    /// Reports accesses to the bytes to loom (nothing in normal builds).
    contents: Contents,
    /// Under loom, a tracked allocation: loom fails a model whose execution
    /// ends with a block neither freed nor dropped.
    #[cfg(all(loom, feature = "loom"))]
    _track: loom::alloc::Track<()>,
}

// SAFETY: a block exclusively owns its mapping, like a `Box<[u8]>`; the raw
// pointer carries no thread affinity.
unsafe impl Send for Block {}
// SAFETY: shared access only reads the pointer and flags; the bytes are
// reached through `&mut self` or the owner's exclusive handle.
unsafe impl Sync for Block {}

impl Block {
    /// Maps a fresh, zeroed, unpinned block of class `shift` for `device`.
    pub(crate) fn allocate(shift: u32, device: usize) -> Result<Self, Error> {
        let bytes = footprint(shift);
        let ptr = if bytes >= HUGE_PAGE {
            map_huge(bytes)?
        } else {
            map(bytes)?
        };
        Ok(Self {
            ptr,
            shift: shift as u8,
            device: device as u16,
            pinned: false,
            contents: Contents::new(size(shift).div_ceil(CHUNK)),
            #[cfg(all(loom, feature = "loom"))]
            _track: loom::alloc::Track::new(()),
        })
    }

    /// The size class shift.
    #[inline]
    pub(crate) fn shift(&self) -> u32 {
        u32::from(self.shift)
    }

    /// The bytes the block hands out (its class size).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        size(self.shift())
    }

    /// The bytes the block occupies (and pins).
    #[inline]
    pub(crate) fn footprint(&self) -> usize {
        footprint(self.shift())
    }

    /// The device shard the block belongs to.
    #[inline]
    pub(crate) fn device(&self) -> usize {
        usize::from(self.device)
    }

    #[inline]
    pub(crate) fn is_pinned(&self) -> bool {
        self.pinned
    }

    pub(crate) fn set_pinned(&mut self, pinned: bool) {
        self.pinned = pinned;
    }

    #[inline]
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The stand-in for the bytes, for writers that work through raw
    /// pointers (the cleaner's chunks).
    pub(crate) fn contents(&self) -> &Contents {
        &self.contents
    }

    #[inline]
    pub(crate) fn as_slice(&self) -> &[u8] {
        self.contents.read();
        // SAFETY:
        // - `ptr` is a live mapping of `footprint() >= len()` bytes;
        // - the bytes are initialised (anonymous mappings are zero-filled);
        // - `&self` excludes writers: every writer holds `&mut self` or is a
        //   cleaner worker that owns the block.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len()) }
    }

    #[inline]
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        self.contents.write();
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len()) }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if self.pinned {
            // Unmapping page-locked memory would hand registered pages back
            // to the OS; losing the mapping is the lesser harm.
            tracing::error!(
                bytes = self.footprint(),
                "pinned block dropped without unregistering; leaking it"
            );
            return;
        }
        // SAFETY: `ptr` is the start of a mapping of `footprint()` bytes made
        // by `map`/`map_huge` and owned by this block alone.
        let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.footprint()) };
        if rc != 0 {
            tracing::error!(error = %std::io::Error::last_os_error(), "munmap failed");
        }
    }
}

/// Zeroes `len` bytes at `ptr`.
///
/// # Safety
/// `[ptr, ptr + len)` lies inside a live block that the caller may write
/// and no one else reads or writes meanwhile.
pub(crate) unsafe fn zero(ptr: *mut u8, len: usize) {
    // SAFETY: the caller guarantees exclusive, in-bounds access.
    unsafe { std::ptr::write_bytes(ptr, 0, len) };
}

/// Faults in every page of `[ptr, ptr + len)` by writing a zero byte to it,
/// so that a later registration finds the pages resident. Writing (rather
/// than reading) matters: a read would map the shared zero page, which the
/// registration would then have to copy.
///
/// # Safety
/// As for [`zero`]; the bytes must already be zero.
pub(crate) unsafe fn touch(ptr: *mut u8, len: usize) {
    let mut offset = 0;
    while offset < len {
        // SAFETY: `offset < len`, inside the caller's exclusive range; the
        // byte is already zero, so writing zero leaves the contents intact.
        unsafe { std::ptr::write_volatile(ptr.add(offset), 0) };
        offset += PAGE;
    }
}

fn map(bytes: usize) -> Result<NonNull<u8>, Error> {
    // SAFETY: an anonymous private mapping with no address hint touches no
    // existing memory; the result is checked below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(Error::AllocationFailed {
            bytes,
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(NonNull::new(ptr.cast()).expect("mmap never returns null on success"))
}

/// Maps `bytes` (a multiple of 2 MiB) aligned to 2 MiB and advises huge
/// pages: over-maps by one huge page, then unmaps the unaligned head and tail.
fn map_huge(bytes: usize) -> Result<NonNull<u8>, Error> {
    let raw = map(bytes + HUGE_PAGE)?.as_ptr() as usize;
    let start = (raw + HUGE_PAGE - 1) & !(HUGE_PAGE - 1);
    let head = start - raw;
    let tail = HUGE_PAGE - head;
    // SAFETY: both ranges lie inside the mapping just made and outside the
    // aligned block kept; unmapping them returns unused address space.
    unsafe {
        if head > 0 {
            libc::munmap(raw as *mut libc::c_void, head);
        }
        if tail > 0 {
            libc::munmap((start + bytes) as *mut libc::c_void, tail);
        }
        // Advice only: a kernel without THP keeps 4 KiB pages.
        libc::madvise(start as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE);
    }
    Ok(NonNull::new(start as *mut u8).expect("aligned address inside a mapping"))
}
