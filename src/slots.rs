//! Per-slot arrays on cache lines of their own.
//!
//! A thread cache keeps counters per slot (device and size class). Those its
//! owner writes on every take and drop, and those other threads write
//! (remote drops, remote-list counts), must not share a cache line with each
//! other or with any other allocation: a write to one would invalidate the
//! other's line on every operation (false sharing). [`Slots`] stores its
//! entries in 128-byte-aligned chunks whose size is a multiple of 128 bytes
//! (two lines: the adjacent-line prefetcher pairs them), so the array owns
//! every line it touches.

use std::ops::Index;

use crossbeam_utils::CachePadded;

/// Entries per chunk.
const PER_CHUNK: usize = 16;

/// `n` entries of `T`, in chunks of whole cache lines; see the module docs.
pub(crate) struct Slots<T> {
    chunks: Box<[CachePadded<[T; PER_CHUNK]>]>,
}

impl<T: Default> Slots<T> {
    /// `n` default entries.
    pub(crate) fn new(n: usize) -> Self {
        Self {
            chunks: (0..n.div_ceil(PER_CHUNK))
                .map(|_| CachePadded::new(std::array::from_fn(|_| T::default())))
                .collect(),
        }
    }
}

impl<T> Index<usize> for Slots<T> {
    type Output = T;

    #[inline]
    fn index(&self, slot: usize) -> &T {
        &self.chunks[slot / PER_CHUNK][slot % PER_CHUNK]
    }
}

impl<T> std::fmt::Debug for Slots<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Slots")
    }
}
