//! Size classes: powers of two from 1 byte to [`MAX_CLASS_SIZE`].
//!
//! A class is named by its shift (`size == 1 << shift`). Every buffer owns
//! whole pages whatever its class, because page-locking works on pages and
//! two buffers sharing a page could not be registered separately; the bytes
//! a buffer occupies, its *footprint*, are therefore at least one page.

use crate::error::Error;

/// Shift of the largest size class.
#[cfg(not(all(loom, feature = "loom")))]
pub(crate) const MAX_SHIFT: u32 = 40;
/// Loom models use a few small classes, keeping each execution short.
#[cfg(all(loom, feature = "loom"))]
pub(crate) const MAX_SHIFT: u32 = 3;

/// Number of size classes (shifts `0..=MAX_SHIFT`).
pub(crate) const CLASSES: usize = MAX_SHIFT as usize + 1;

/// The largest size `take` accepts: 1 TiB.
pub const MAX_CLASS_SIZE: usize = 1 << MAX_SHIFT;

/// The cleaner splits work above this many bytes into jobs of this size:
/// a multiple of the 2 MiB huge page, and small enough that 16 MiB is done
/// by several workers at once.
#[cfg(not(all(loom, feature = "loom")))]
pub(crate) const CHUNK: usize = 4 << 20;
/// Loom models split their few-byte buffers into 2-byte chunks.
#[cfg(all(loom, feature = "loom"))]
pub(crate) const CHUNK: usize = 2;

/// The granule of every allocation.
pub(crate) const PAGE: usize = 4096;

/// The shift of the smallest class holding `min_size` bytes. A request for
/// 0 bytes gets the 1-byte class: the pool never hands out an empty buffer.
#[inline]
pub(crate) fn shift_for(min_size: usize) -> Result<u32, Error> {
    if min_size > MAX_CLASS_SIZE {
        return Err(Error::SizeTooLarge {
            requested: min_size,
            max: MAX_CLASS_SIZE,
        });
    }
    Ok(min_size.max(1).next_power_of_two().trailing_zeros())
}

/// The bytes a buffer of class `shift` hands out.
#[inline]
pub(crate) const fn size(shift: u32) -> usize {
    1 << shift
}

/// The bytes a buffer of class `shift` occupies (and pins): at least a page.
#[inline]
pub(crate) const fn footprint(shift: u32) -> usize {
    let size = size(shift);
    if size < PAGE {
        PAGE
    } else {
        size
    }
}

#[cfg(all(test, not(all(loom, feature = "loom"))))]
mod tests {
    use super::*;

    #[test]
    fn rounds_up_to_powers_of_two() {
        let cases = [
            (0, 0),
            (1, 0),
            (3, 2),
            (4, 2),
            (1025, 11),
            (MAX_CLASS_SIZE, MAX_SHIFT),
        ];
        for (min, shift) in cases {
            assert_eq!(shift_for(min).unwrap(), shift, "shift_for({min})");
        }
        assert!(shift_for(MAX_CLASS_SIZE + 1).is_err());
        assert!(shift_for(usize::MAX).is_err());
    }

    #[test]
    fn footprint_is_at_least_a_page() {
        assert_eq!(footprint(0), PAGE);
        assert_eq!(footprint(12), PAGE);
        assert_eq!(footprint(20), 1 << 20);
    }
}
