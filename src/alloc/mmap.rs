//! The system's side of a block: anonymous mappings (aligned to the
//! transparent huge page and advised for huge pages when they are at least
//! one), the huge-page size and the host's memory as the kernel reports
//! them, and the cleaner's zeroing and pre-faulting of a range.

use std::ptr::NonNull;

use crate::error::Error;
use crate::size_class::page_size;
use crate::sync::OnceLock;

/// The transparent huge page size (`hpage_pmd_size`), or 2 MiB if the
/// kernel does not say.
pub(super) fn huge_page_size() -> usize {
    static HUGE: OnceLock<usize> = OnceLock::new();
    *HUGE.get_or_init(|| {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .filter(|n| n.is_power_of_two() && *n >= page_size())
            .unwrap_or(2 << 20)
    })
}

/// The host's physical memory in bytes (`_SC_PHYS_PAGES` pages), or
/// `u64::MAX` if the system does not say.
pub(crate) fn host_memory() -> u64 {
    static MEMORY: OnceLock<u64> = OnceLock::new();
    *MEMORY.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
        u64::try_from(pages)
            .ok()
            .filter(|&p| p > 0)
            .map_or(u64::MAX, |p| p.saturating_mul(page_size() as u64))
    })
}

/// Dirty prefixes of this many bytes or more are zeroed with stores that
/// bypass the caches ([`zero_streaming`]). A prefix this long was written
/// long enough ago that most of it has left the caches: ordinary stores
/// then read each line from memory before writing it (twice the memory
/// traffic), while streaming stores only write. Below it, much of the
/// prefix may still be cached, where ordinary stores can be faster (on a
/// 2-core Xeon, a prefix written just before it is zeroed: up to 2.5 times
/// at 1 MiB, 1.4 times at 32-48 MiB written by the zeroing core itself;
/// from 64 MiB up streaming stores were 1.4-2 times faster in every case
/// measured there).
pub(crate) const STREAM_ZERO_MIN: usize = 32 << 20;

/// Zeroes `len` bytes at `ptr` with non-temporal (streaming) stores on
/// x86_64, ordinary ones elsewhere and for the unaligned ends. Ends with a
/// store fence, so that a later Release (the cleaner publishing the
/// buffer) orders the zeroes as it orders ordinary stores: streaming
/// stores are weakly ordered, and without the fence another thread could
/// see the buffer published before its zeroes.
///
/// # Safety
/// `[ptr, ptr + len)` is valid for writes and owned by the caller.
pub(crate) unsafe fn zero_streaming(ptr: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_setzero_si128, _mm_sfence, _mm_stream_si128};
        let head = ptr.align_offset(16).min(len);
        let body = (len - head) & !63;
        // SAFETY: `head <= len`: inside the caller's range.
        unsafe { std::ptr::write_bytes(ptr, 0, head) };
        // SAFETY: `head + body <= len`: both ends inside the caller's range.
        let (mut at, end) = unsafe { (ptr.add(head), ptr.add(head + body)) };
        #[allow(unused_unsafe)]
        // SAFETY: SSE2 is part of every x86_64 processor.
        let zero = unsafe { _mm_setzero_si128() };
        while at < end {
            // SAFETY: `at` is 16-byte aligned (`head` aligned it, and it
            // moves by 64), and `[at, at + 64)` lies below `end`, inside the
            // caller's range; SSE2 is part of every x86_64 processor.
            unsafe {
                let line = at.cast::<__m128i>();
                _mm_stream_si128(line, zero);
                _mm_stream_si128(line.add(1), zero);
                _mm_stream_si128(line.add(2), zero);
                _mm_stream_si128(line.add(3), zero);
                at = at.add(64);
            }
        }
        // SAFETY: the tail `[head + body, len)` is inside the caller's range.
        unsafe { std::ptr::write_bytes(end, 0, len - head - body) };
        #[allow(unused_unsafe)]
        // SAFETY: SSE2 is part of every x86_64 processor.
        unsafe {
            _mm_sfence()
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's range.
    unsafe {
        std::ptr::write_bytes(ptr, 0, len)
    };
}

/// Zeroes `[start, end) ∩ [0, dirty)` of the block at `base` and pre-faults
/// `[start, end)` beyond `dirty` (already zero), writing one zero byte per
/// page so that a later registration finds every page resident. Writing
/// (rather than reading) matters: a read would map the shared zero page,
/// which the registration would then have to replace. A dirty prefix of
/// [`STREAM_ZERO_MIN`] or more is zeroed with streaming stores, every
/// chunk of it alike.
///
/// # Safety
/// The caller owns `[base + start, base + end)` of a live block exclusively.
pub(crate) unsafe fn clean_range(base: *mut u8, start: usize, end: usize, dirty: usize) {
    let zero_end = dirty.clamp(start, end);
    if dirty >= STREAM_ZERO_MIN {
        // SAFETY: `[start, zero_end)` lies in the caller's exclusive range.
        unsafe { zero_streaming(base.add(start), zero_end - start) };
    } else {
        // SAFETY: as above.
        unsafe { std::ptr::write_bytes(base.add(start), 0, zero_end - start) };
    }
    let page = page_size();
    let mut offset = zero_end.next_multiple_of(page).min(end);
    while offset < end {
        // SAFETY: `offset < end`, inside the caller's range; the byte is
        // already zero, so writing zero leaves the contents intact.
        unsafe { std::ptr::write_volatile(base.add(offset), 0) };
        offset += page;
    }
}

pub(super) fn map(bytes: usize) -> Result<NonNull<u8>, Error> {
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

/// Moves the pages of the `len` bytes at `from` to `to`, in place of what
/// is mapped there, without copying or faulting them again (`mremap`), and
/// returns how many bytes from the front moved (`len` unless the kernel
/// refused a part); the range they left is unmapped, the rest of `from`
/// stays mapped. A range over several mappings (a region grown by a fold:
/// its moved and fresh parts stay apart), which kernels before Linux 6.17
/// refuse to move at once, moves a huge page at a time (a page at a time
/// where a huge page would cross the boundary of two mappings).
///
/// # Safety
/// `[from, from + len)` is mapped and nobody reads or writes it from now
/// on, and `[to, to + len)` lies in a mapping the caller owns and nobody
/// else uses.
pub(super) unsafe fn move_pages(from: *mut u8, len: usize, to: *mut u8) -> usize {
    // SAFETY: the caller's guarantee, for the whole range and any part.
    let remap = |at: usize, n: usize| unsafe { remap(from.add(at), n, to.add(at)) };
    if !piecewise() && remap(0, len) {
        return len;
    }
    let (huge, page) = (huge_page_size(), page_size());
    let mut moved = 0;
    while moved < len {
        let step = if len - moved >= huge && moved % huge == 0 {
            huge
        } else {
            page
        };
        if remap(moved, step) {
            moved += step;
        } else if step == huge {
            // Over a boundary: this huge page a page at a time.
            let end = moved + huge;
            while moved < end && remap(moved, page) {
                moved += page;
            }
            if moved < end {
                break;
            }
        } else {
            break;
        }
    }
    moved
}

/// One `mremap` of `n` bytes from `from` to `to`; whether it moved them.
///
/// # Safety
/// As [`move_pages`], for these `n` bytes.
unsafe fn remap(from: *mut u8, n: usize, to: *mut u8) -> bool {
    // SAFETY: the caller's guarantee.
    let moved = unsafe {
        libc::mremap(
            from.cast(),
            n,
            n,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            to.cast::<libc::c_void>(),
        )
    };
    moved != libc::MAP_FAILED
}

/// Whether [`move_pages`] skips its move in one call, as the kernels that
/// refuse to move a range over several mappings make it do: set by tests
/// of the fallback, never otherwise.
#[cfg(test)]
pub(super) static PIECEWISE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

fn piecewise() -> bool {
    #[cfg(test)]
    {
        PIECEWISE.load(std::sync::atomic::Ordering::Relaxed)
    }
    #[cfg(not(test))]
    {
        false
    }
}

/// Maps `bytes` aligned to the huge page and advises huge pages: over-maps
/// by one huge page, then unmaps the unaligned head and tail.
pub(super) fn map_huge(bytes: usize) -> Result<NonNull<u8>, Error> {
    let huge = huge_page_size();
    let raw = map(bytes + huge)?.as_ptr() as usize;
    let start = raw.next_multiple_of(huge);
    let head = start - raw;
    let tail = huge - head;
    // SAFETY: both ranges lie inside the mapping just made and outside the
    // aligned block kept; unmapping them returns unused address space.
    unsafe {
        if head > 0 {
            libc::munmap(raw as *mut libc::c_void, head);
        }
        if tail > 0 {
            libc::munmap((start + bytes) as *mut libc::c_void, tail);
        }
        // Advice only: a kernel without THP keeps small pages.
        libc::madvise(start as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE);
    }
    Ok(NonNull::new(start as *mut u8).expect("aligned address inside a mapping"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Streaming zeroes cover exactly `[ptr, ptr + len)`, whatever the
    /// alignment of either end: an unaligned head, the 64-byte body and a
    /// tail each zeroed, the bytes around left alone.
    #[test]
    fn streaming_zeroes_cover_exactly_their_range() {
        let mut bytes = vec![0u8; 4096 + 256];
        for offset in 0..20 {
            for len in [0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000, 4096 + 7] {
                bytes.fill(0xA5);
                // SAFETY: `offset + len <= bytes.len()`, and `bytes` is
                // borrowed mutably here.
                unsafe { zero_streaming(bytes.as_mut_ptr().add(offset), len) };
                let (before, rest) = bytes.split_at(offset);
                let (zeroed, after) = rest.split_at(len);
                assert!(
                    before.iter().chain(after).all(|&b| b == 0xA5),
                    "offset {offset}, len {len}: a byte outside the range changed"
                );
                assert!(
                    zeroed.iter().all(|&b| b == 0),
                    "offset {offset}, len {len}: a byte of the range is not zero"
                );
            }
        }
    }
}
