//! Free functions on the global pool, for drop-in migration from the
//! `pinned` module of openvm's `cuda-common`.

use crate::buffer::PinnedBuffer;
use crate::pool::Pool;

use crate::backend::BackendKind;
use crate::error::Error;
use crate::sync::{OnceLock, StaticMutex};
use std::sync::PoisonError;

static GLOBAL: OnceLock<Pool> = OnceLock::new();
/// Serialises the global pool's first build (lenient or strict).
static BUILDING: StaticMutex<()> = StaticMutex::new(());

impl Pool {
    /// The process-wide pool behind the free functions, built on first use
    /// with the default settings ([`BackendKind::Auto`]) and those of the
    /// `PINPOOL_CONF` environment variable, leniently: a bad pair is
    /// skipped (and reported on standard error), and if the CUDA backend
    /// was asked for and cannot be used, the pool falls back to the host
    /// backend and says so on standard error. [`try_global`] fails instead.
    ///
    /// [`try_global`]: Pool::try_global
    ///
    /// # Panics
    ///
    /// Only if no pool can be built at all, not even on the host backend.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::global();
    /// let buf = pool.take(4096);
    /// assert_eq!(buf.len(), 4096);
    /// ```
    pub fn global() -> &'static Pool {
        if let Some(pool) = GLOBAL.get() {
            return pool;
        }
        let _building = BUILDING.lock().unwrap_or_else(PoisonError::into_inner);
        GLOBAL.get_or_init(|| {
            let builder = Pool::builder().from_env();
            match builder.clone().build() {
                Ok(pool) => pool,
                Err(e) => {
                    tracing::warn!(error = %e, "pinpool: the global pool falls back to the host backend");
                    eprintln!("pinpool: {e}; the global pool falls back to the host backend (buffers are not page-locked)");
                    builder
                        .backend(BackendKind::Host)
                        .build()
                        .or_else(|_| Pool::builder().backend(BackendKind::Host).build())
                        .unwrap_or_else(|e| panic!("pinpool: building the global pool failed: {e}"))
                }
            }
        })
    }

    /// The process-wide pool, built on first use strictly: a bad
    /// `PINPOOL_CONF` pair, or a backend that cannot be used, is an error
    /// (and the pool stays unbuilt, so a later call may try again). Once
    /// built (by either call), it is returned as it is.
    ///
    /// # Errors
    ///
    /// [`Error::Setting`] for a bad pair; the build's error otherwise (for
    /// example [`Error::BackendUnavailable`] for `backend=cuda` without a
    /// driver).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::try_global()?;
    /// drop(pool.take(4096));
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn try_global() -> Result<&'static Pool, Error> {
        if let Some(pool) = GLOBAL.get() {
            return Ok(pool);
        }
        let _building = BUILDING.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(pool) = GLOBAL.get() {
            return Ok(pool);
        }
        let pool = Pool::builder().try_from_env()?.build()?;
        Ok(GLOBAL.get_or_init(|| pool))
    }
}

/// Takes a buffer from the [global pool](Pool::global); see [`Pool::take`].
///
/// # Examples
///
/// ```
/// let buf = pinpool::take(3);
/// assert_eq!(buf.len(), 4);
/// ```
#[track_caller]
pub fn take(min_size: usize) -> PinnedBuffer {
    Pool::global().take(min_size)
}

/// Takes a buffer of the global pool from the shard of `device`; see
/// [`Pool::take_on`].
///
/// # Errors
///
/// As [`Pool::take_on`].
///
/// # Examples
///
/// ```
/// let buf = pinpool::take_on(0, 100)?;
/// assert_eq!(buf.device(), 0);
/// # Ok::<(), pinpool::Error>(())
/// ```
pub fn take_on(device: usize, min_size: usize) -> Result<PinnedBuffer, Error> {
    Pool::global().take_on(device, min_size)
}

/// Sets the global pool's cap; see [`Pool::set_max_pooled_bytes`].
///
/// # Examples
///
/// ```
/// pinpool::set_max_pooled_bytes(8 << 30);
/// assert_eq!(pinpool::Pool::global().stats().max_pooled_bytes, 8 << 30);
/// ```
pub fn set_max_pooled_bytes(bytes: usize) {
    Pool::global().set_max_pooled_bytes(bytes);
}

/// Shuts the global pool down; see [`Pool::shutdown`].
///
/// # Examples
///
/// ```
/// drop(pinpool::take(4096));
/// pinpool::shutdown();
/// assert_eq!(pinpool::Pool::global().stats().in_cleaner, 0);
/// ```
pub fn shutdown() {
    Pool::global().shutdown();
}

/// Empties the global pool; see [`Pool::clear`].
///
/// # Examples
///
/// ```
/// pinpool::clear();
/// // buffers still in the cleaner may come back afterwards; `shutdown` drains them too
/// ```
pub fn clear() {
    Pool::global().clear();
}

/// Page-locks `len` bytes at `ptr` in one call, for all CUDA contexts;
/// returns `false` (leaving the memory pageable) if that fails or no GPU is
/// in use.
///
/// # Safety
/// `[ptr, ptr + len)` is a live allocation that stays mapped until
/// [`unregister_region`] is called on it.
///
/// # Examples
///
/// ```
/// let mut region = vec![0u8; 1 << 20];
/// // SAFETY: `region` outlives its registration.
/// if unsafe { pinpool::register_region(region.as_mut_ptr(), region.len()) } {
///     // SAFETY: registered above; no copy reads it any more.
///     unsafe { pinpool::unregister_region(region.as_mut_ptr()) };
/// }
/// ```
pub unsafe fn register_region(ptr: *mut u8, len: usize) -> bool {
    // SAFETY: forwarded from the caller.
    unsafe { Pool::global().register_region(ptr, len) }
}

/// Reverses a successful [`register_region`]; a refusal of the driver
/// leaves the region registered, counted and logged (see
/// [`Pool::unregister_region`]).
///
/// # Safety
/// `ptr` was registered by [`register_region`], and no copy from it is in
/// flight.
///
/// # Examples
///
/// ```
/// let mut region = vec![0u8; 4096];
/// // SAFETY: `region` outlives its registration, and nothing copies from it.
/// unsafe {
///     if pinpool::register_region(region.as_mut_ptr(), region.len()) {
///         pinpool::unregister_region(region.as_mut_ptr());
///     }
/// }
/// ```
pub unsafe fn unregister_region(ptr: *mut u8) {
    // SAFETY: forwarded from the caller.
    unsafe { Pool::global().unregister_region(ptr) }
}
