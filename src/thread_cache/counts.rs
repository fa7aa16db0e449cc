//! A cache's per-slot counters (one slot per device and size class), on
//! [`Counter`]s written by the cache's owner with a load and a store (by
//! any thread for the orphan cache, which has no owner).

use crate::counter::Counter;
use crate::sync::AtomicU32;

/// A slot's counters written by the owner (the orphan cache adds with
/// `fetch_add`), read by statistics and hints: one take or drop touches one
/// of these, and two share a cache line.
#[derive(Debug, Default)]
#[repr(align(32))]
pub(super) struct SlotCounts {
    /// Takes served from the pool.
    pub(super) hits: Counter,
    /// Takes that allocated.
    pub(super) misses: Counter,
    /// Drops by the owner of buffers taken through this cache (drops by
    /// other threads are `SharedPart::drops`), for the buffers in use per
    /// class (takes minus drops).
    pub(super) drops: Counter,
    /// Ready buffers in the lists (owner-written; hints for thieves,
    /// stats).
    pub(super) ready: AtomicU32,
}
