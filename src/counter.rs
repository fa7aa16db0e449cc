//! The counter every cache and flush book keeps: it only grows, and is
//! written either by one thread at a time (a cache's owner: a load and a
//! store, no read-modify-write, so the owner's fast path takes no bus lock)
//! or by any thread (`fetch_add`).
//!
//! The plain methods are Relaxed: a count publishes nothing, and a reader
//! racing a writer sees the old or the new value (statistics, hints, and
//! bounds whose readers say which way a stale value errs). The flush
//! barrier, whose completions publish the buffer's state, uses the ordered
//! variants and says what they pair with (see `flush`).

use crate::sync::{AtomicU64, Ordering};

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`; the caller is the counter's only writer now.
    #[inline]
    pub(crate) fn bump(&self, n: u64) {
        self.bump_with(n, Ordering::Relaxed);
    }

    /// Adds `n`, any thread.
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds `n` as [`bump`](Self::bump) if `single` (the caller is the only
    /// writer), else as [`add`](Self::add).
    #[inline]
    pub(crate) fn count(&self, n: u64, single: bool) {
        if single {
            self.bump(n);
        } else {
            self.add(n);
        }
    }

    /// As [`bump`](Self::bump), storing with `order`.
    #[inline]
    pub(crate) fn bump_with(&self, n: u64, order: Ordering) {
        // Relaxed load: the caller is the only writer, so this is the
        // latest value.
        self.0.store(self.0.load(Ordering::Relaxed) + n, order);
    }

    /// As [`add`](Self::add), with `order`.
    #[inline]
    pub(crate) fn add_with(&self, n: u64, order: Ordering) {
        self.0.fetch_add(n, order);
    }

    /// The count now.
    #[inline]
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// The count now, loaded with `order`.
    #[inline]
    pub(crate) fn get_with(&self, order: Ordering) -> u64 {
        self.0.load(order)
    }
}
