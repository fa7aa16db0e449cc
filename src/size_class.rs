//! Size classes: how a requested size rounds up to a buffer's length.
//!
//! [`SizeClasses::Fine`] (the default) has eight classes per octave above
//! one page, `2^k + j * 2^(k-3)` for `j` in `1..=8`, so a buffer is at most
//! 12.5% longer than asked (4.3% on the real client's profile), and powers of
//! two up to one page. [`SizeClasses::PowersOfTwo`] rounds every size up to
//! a power of two, the seed's exact lengths (`take(3).len() == 4`).
//!
//! A class is a [`SizeClass`], an index into the pool's [`Classes`] table;
//! the classes of one device and all devices are laid out as *slots*
//! (`device * classes + class`, see [`Classes::slot`]).
//!
//! A buffer of at least one page owns whole pages, because page-locking
//! works on pages and two buffers sharing a page could not be registered
//! separately: its *footprint*, the bytes it occupies, is its length rounded
//! up to pages. Shorter buffers are carved from one-page *slabs* registered
//! once (see `alloc`): their footprint is their length rounded up to 256
//! bytes, so a 1 KiB buffer occupies 1 KiB. The cap counts footprints.

use crate::error::Error;
use crate::sync::OnceLock;
use crate::tune::{Tune, Tuning};

/// The system's page size.
pub(crate) fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(n)
            .ok()
            .filter(|n| n.is_power_of_two())
            .unwrap_or(4096)
    })
}

/// The largest size `take` accepts: 1 TiB.
pub const MAX_CLASS_SIZE: usize = 1 << Tune::MAX_SHIFT;

/// How requested sizes are rounded up to buffer lengths.
///
/// # Examples
///
/// ```
/// use pinpool::{BackendKind, Pool, SizeClasses};
///
/// let fine = Pool::builder().backend(BackendKind::Host).build()?;
/// assert_eq!(fine.take(5000).len(), 5120); // 4 KiB + 1/8 of 4 KiB
/// let pow2 = Pool::builder()
///     .backend(BackendKind::Host)
///     .size_classes(SizeClasses::PowersOfTwo)
///     .build()?;
/// assert_eq!(pow2.take(5000).len(), 8192);
/// assert_eq!(pow2.take(3).len(), 4);
/// # Ok::<(), pinpool::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SizeClasses {
    /// Eight classes per octave above one page (at most 12.5% over the
    /// request), powers of two below.
    #[default]
    Fine,
    /// Powers of two: the lengths of the pool this crate replaces.
    PowersOfTwo,
}

impl SizeClasses {
    /// The length of the buffer a pool with these classes hands out for a
    /// take of `size` bytes on this system (its pages decide where the fine
    /// classes start), or `None` above [`MAX_CLASS_SIZE`].
    ///
    /// # Examples
    ///
    /// ```
    /// use pinpool::SizeClasses;
    ///
    /// assert_eq!(SizeClasses::PowersOfTwo.len_for(5000), Some(8192));
    /// assert_eq!(SizeClasses::PowersOfTwo.len_for(0), Some(1));
    /// assert_eq!(SizeClasses::Fine.len_for(3 << 20), Some(3 << 20));
    /// assert_eq!(SizeClasses::Fine.len_for(usize::MAX), None);
    /// ```
    pub fn len_for(self, size: usize) -> Option<usize> {
        let classes = Classes::new(self, page_size());
        classes.class_for(size).ok().map(|k| classes.size(k))
    }
}

impl std::str::FromStr for SizeClasses {
    type Err = Error;

    /// `fine` or `pow2`, the names [`Display`](std::fmt::Display) writes and
    /// the `size_classes` configuration key takes.
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "fine" => Ok(SizeClasses::Fine),
            "pow2" => Ok(SizeClasses::PowersOfTwo),
            other => Err(Error::InvalidConfig(format!(
                "size classes `{other}`: expected fine or pow2"
            ))),
        }
    }
}

impl std::fmt::Display for SizeClasses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SizeClasses::Fine => "fine",
            SizeClasses::PowersOfTwo => "pow2",
        })
    }
}

/// One size class of a pool: an index into its [`Classes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct SizeClass(u16);

impl SizeClass {
    /// The class at `index` of its table.
    pub(crate) fn at(index: usize) -> Self {
        Self(index as u16)
    }

    /// The index of the class in its table.
    #[inline]
    pub(crate) fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// A pool's size classes: their lengths and footprints, smallest first.
#[derive(Debug)]
pub(crate) struct Classes {
    kind: SizeClasses,
    page_shift: u32,
    /// The bytes of one slab; classes shorter than it are carved from
    /// slabs.
    slab: usize,
    sizes: Box<[usize]>,
    footprints: Box<[usize]>,
}

/// The shift of the smallest power of two `>= n` (`n >= 1`).
#[inline]
fn ceil_log2(n: usize) -> u32 {
    usize::BITS - (n - 1).leading_zeros()
}

impl Classes {
    /// The table for `kind` on a system with `page`-byte pages.
    pub(crate) fn new(kind: SizeClasses, page: usize) -> Self {
        assert!(
            page.is_power_of_two(),
            "page size {page} is not a power of two"
        );
        let page_shift = page.trailing_zeros();
        let count = match kind {
            SizeClasses::PowersOfTwo => Tune::MAX_SHIFT as usize + 1,
            SizeClasses::Fine if Tune::MAX_SHIFT <= page_shift => Tune::MAX_SHIFT as usize + 1,
            SizeClasses::Fine => (page_shift + 1 + (Tune::MAX_SHIFT - page_shift) * 8) as usize,
        };
        let slab = Tune::SLAB_BYTES.unwrap_or(page);
        let mut table = Self {
            kind,
            page_shift,
            slab,
            sizes: Box::new([]),
            footprints: Box::new([]),
        };
        table.sizes = (0..count).map(|i| table.size_of_index(i)).collect();
        table.footprints = table
            .sizes
            .iter()
            .map(|&s| {
                if s < slab {
                    s.next_multiple_of(Tune::SLAB_GRANULE)
                } else {
                    s.next_multiple_of(page)
                }
            })
            .collect();
        table
    }

    fn size_of_index(&self, index: usize) -> usize {
        let ps = self.page_shift as usize;
        if self.kind == SizeClasses::PowersOfTwo || index <= ps {
            return 1 << index;
        }
        let octave = (index - ps - 1) / 8;
        let step = (index - ps - 1) % 8 + 1;
        let k = ps + octave;
        (1 << k) + step * (1 << (k - 3))
    }

    /// How many classes there are.
    #[inline]
    pub(crate) fn count(&self) -> usize {
        self.sizes.len()
    }

    /// Every class, smallest first.
    pub(crate) fn all(&self) -> impl DoubleEndedIterator<Item = SizeClass> + ExactSizeIterator {
        (0..self.count() as u16).map(SizeClass)
    }

    /// The smallest class holding `min_size` bytes. A request for 0 bytes
    /// gets the 1-byte class: the pool never hands out an empty buffer.
    #[inline]
    pub(crate) fn class_for(&self, min_size: usize) -> Result<SizeClass, Error> {
        if min_size > MAX_CLASS_SIZE {
            return Err(Error::SizeTooLarge {
                requested: min_size,
                max: MAX_CLASS_SIZE,
            });
        }
        let n = min_size.max(1);
        let shift = ceil_log2(n);
        if self.kind == SizeClasses::PowersOfTwo || shift <= self.page_shift {
            return Ok(SizeClass(shift as u16));
        }
        // 2^k < n <= 2^(k+1), with k >= page_shift.
        let k = shift - 1;
        let step = 1usize << (k - 3);
        let j = (n - (1 << k)).div_ceil(step);
        let index = self.page_shift as usize + (k - self.page_shift) as usize * 8 + j;
        Ok(SizeClass(index as u16))
    }

    /// The length of a buffer of `class`.
    #[inline]
    pub(crate) fn size(&self, class: SizeClass) -> usize {
        self.sizes[class.index()]
    }

    /// The bytes a buffer of `class` occupies (and pins): whole pages, or
    /// its share of a slab.
    #[inline]
    pub(crate) fn footprint(&self, class: SizeClass) -> usize {
        self.footprints[class.index()]
    }

    /// How many buffers of `class` one slab holds: 1 for a class that is
    /// not carved from slabs.
    pub(crate) fn per_slab(&self, class: SizeClass) -> usize {
        if self.size(class) < self.slab {
            self.slab / self.footprint(class)
        } else {
            1
        }
    }

    /// The bytes of one slab (see `alloc`).
    pub(crate) fn slab_bytes(&self) -> usize {
        self.slab
    }

    /// The larger classes a take of `class` may borrow from: those at most
    /// `slack` percent longer, nearest first.
    pub(crate) fn borrowable(
        &self,
        class: SizeClass,
        slack: u32,
    ) -> impl Iterator<Item = SizeClass> + '_ {
        let limit = self.size(class) as u128 * (100 + u128::from(slack)) / 100;
        (class.index() + 1..self.count())
            .take_while(move |&i| self.sizes[i] as u128 <= limit)
            .map(|i| SizeClass(i as u16))
    }

    /// The slot of (`device`, `class`) among all devices' classes.
    #[inline]
    pub(crate) fn slot(&self, device: usize, class: SizeClass) -> usize {
        device * self.count() + class.index()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fine() -> Classes {
        Classes::new(SizeClasses::Fine, 4096)
    }

    #[test]
    fn powers_of_two_round_like_the_seed() {
        let c = Classes::new(SizeClasses::PowersOfTwo, 4096);
        for (min, len) in [(0, 1), (1, 1), (3, 4), (4, 4), (1025, 2048), (5000, 8192)] {
            assert_eq!(c.size(c.class_for(min).unwrap()), len, "class_for({min})");
        }
        assert_eq!(c.size(c.class_for(MAX_CLASS_SIZE).unwrap()), MAX_CLASS_SIZE);
        assert!(c.class_for(MAX_CLASS_SIZE + 1).is_err());
        assert_eq!(c.footprint(c.class_for(5000).unwrap()), 8192);
    }

    #[test]
    fn sub_page_classes_share_slabs() {
        let c = fine();
        for (min, footprint, per_slab) in [
            (3, 256, 16),
            (256, 256, 16),
            (300, 512, 8),
            (1024, 1024, 4),
            (2048, 2048, 2),
            (4096, 4096, 1),
            (5000, 5120usize.next_multiple_of(4096), 1),
        ] {
            let k = c.class_for(min).unwrap();
            assert_eq!(c.footprint(k), footprint, "footprint of {min}");
            assert_eq!(c.per_slab(k), per_slab, "per slab of {min}");
        }
        assert_eq!(c.slab_bytes(), 4096);
    }

    #[test]
    fn fine_classes_are_eighths_of_an_octave_above_a_page() {
        let c = fine();
        for (min, len) in [
            (3, 4),
            (4096, 4096),
            (4097, 4608),
            (5000, 5120),
            (8192, 8192),
            (8193, 9216),
            (3 << 20, 3 << 20),
            ((3 << 20) + 1, (3 << 20) + (256 << 10)),
        ] {
            assert_eq!(c.size(c.class_for(min).unwrap()), len, "class_for({min})");
        }
        assert_eq!(c.size(c.class_for(MAX_CLASS_SIZE).unwrap()), MAX_CLASS_SIZE);
    }

    #[test]
    fn borrowing_stays_within_the_slack() {
        let c = fine();
        let k = c.class_for(8 << 20).unwrap();
        let sizes: Vec<usize> = c.borrowable(k, 25).map(|b| c.size(b)).collect();
        assert_eq!(sizes, [9 << 20, 10 << 20]);
        assert_eq!(c.borrowable(k, 0).count(), 0);
        let last = c.class_for(MAX_CLASS_SIZE).unwrap();
        assert_eq!(c.borrowable(last, 100).count(), 0);
    }

    #[test]
    fn every_size_gets_the_smallest_class_that_holds_it() {
        let c = fine();
        let sizes: Vec<usize> = c.all().map(|k| c.size(k)).collect();
        assert!(sizes.windows(2).all(|w| w[0] < w[1]), "sizes ascend");
        let mut n = 1usize;
        while n < (1 << 30) {
            for m in [n - 1, n, n + 1] {
                let m = m.max(1);
                let k = c.class_for(m).unwrap();
                assert!(c.size(k) >= m);
                assert!(k.index() == 0 || c.size(SizeClass(k.0 - 1)) < m, "{m}");
                if m > 4096 {
                    assert!(c.size(k) as f64 <= m as f64 * 1.125, "{m} -> {}", c.size(k));
                }
            }
            n = n * 3 / 2 + 1;
        }
    }
}
