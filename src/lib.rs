//! A pool of page-locked (pinned) host buffers for staging host-to-device
//! copies.
//!
//! Copies from pinned memory run at PCIe speed (~55 GB/s on an H200) while
//! copies from pageable memory crawl (~7 GB/s), but pinning memory costs
//! ~1-2 GB/s and must stay off the caller's critical path. `pinpool` keeps
//! pinned, zeroed buffers ready:
//!
//! - [`Pool::take`] serves a ready buffer from the calling thread's cache,
//!   then from its device's lock-free size-class stacks; on a miss it hands
//!   out a fresh pageable buffer rather than pin on the caller's path.
//! - Dropping a [`PinnedBuffer`] never blocks and never calls CUDA: it hands
//!   the buffer to a pool of cleaner workers, which wait for the copies still
//!   reading it ([`PinnedBuffer::record_last_use`]), re-zero the written
//!   prefix, and make it ready again, in its class or back in the region it
//!   was carved from; a miss buffer is freed, and the regions (a few large
//!   registrations, their pages touched in parallel first) grow by what
//!   the takes wanted ([`PoolBuilder::regions`]).
//! - A byte cap bounds what the pool keeps, evicting the largest buffers
//!   first; unless one is given, it follows the working set (see
//!   [`PoolBuilder::max_pooled_bytes`]). A pinned budget bounds every
//!   page-locked byte (by default a quarter of the memory the process may
//!   use; see [`PoolBuilder::max_pinned_bytes`]).
//!
//! Without a GPU (no driver, or no device) the same API runs on a host
//! backend: buffers are pooled and re-zeroed but not page-locked.
//!
//! # Examples
//!
//! ```
//! use pinpool::{BackendKind, Pool};
//!
//! let pool = Pool::builder().backend(BackendKind::Host).build()?;
//! let mut buf = pool.take(1 << 20);
//! buf[..4].copy_from_slice(&[1, 2, 3, 4]);
//! buf.set_dirty_len(4);
//! drop(buf);
//! pool.flush();
//! let again = pool.take(1 << 20);
//! assert!(again.iter().all(|&b| b == 0));
//! assert_eq!(pool.stats().hits, 1);
//! # Ok::<(), pinpool::Error>(())
//! ```
#![warn(unsafe_op_in_unsafe_fn, missing_docs, missing_debug_implementations)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod admission;
mod alloc;
#[cfg(feature = "allocator-api2")]
mod allocator;
mod backend;
mod budget;
pub use budget::DEFAULT_PINNED_SHARE_PERCENT;
mod buffer;
mod cleaner;
mod config;
mod counter;
mod error;
mod fence;
mod flush;
mod global;
mod held_out;
mod numa;
pub use numa::NumaMode;
mod pool;
mod provision;
mod reaper;
mod remote;
mod shard;
mod size_class;
mod slots;
mod stack;
mod stats;
mod sync;
mod thread_cache;
pub mod trace;
mod tune;
mod views;

pub mod implementation;

#[cfg(feature = "allocator-api2")]
pub use allocator::PinnedAlloc;
pub use backend::{BackendKind, MAX_DEVICES};
pub use buffer::PinnedBuffer;
pub use config::{
    Config, PoolBuilder, DEFAULT_BORROW_SLACK, DEFAULT_IDLE_TRIM, DEFAULT_MIN_POOLED_BYTES,
    DEFAULT_THREAD_CACHE_BYTES,
};
pub use error::Error;
pub use global::{
    clear, register_region, set_max_pooled_bytes, shutdown, take, take_on, unregister_region,
};
pub use pool::Pool;
pub use size_class::{SizeClasses, MAX_CLASS_SIZE};
pub use stats::{ClassStats, DeviceStats, LimitSource, Stats};
pub use views::{Prefix, PrefixMut, Typed, TypedMut};

#[cfg(pinpool_loom)]
#[doc(hidden)]
pub mod loom_internals;

/// Fault injection for tests: a backend that fails, panics or blocks on
/// chosen calls (thread starts included), a fence completed by hand, and a
/// record of which threads destroy fences and lock the event pool (the
/// `testing` feature).
#[cfg(feature = "testing")]
pub mod testing {
    pub use crate::backend::fault::Faults;
    pub use crate::fence::testing::{fence_calls_on, FenceCalls};
    pub use crate::fence::TestFence;
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
