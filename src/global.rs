//! Free functions on the global pool, for drop-in migration from the
//! `pinned` module of openvm's `cuda-common`.

use crate::buffer::PinnedBuffer;
use crate::pool::Pool;

impl Pool {
    /// The process-wide pool behind the free functions, built on first use
    /// with the default settings ([`BackendKind::Auto`]) and those of the
    /// `PINPOOL_CONF` environment variable (see [`PoolBuilder::conf`]).
    ///
    /// [`BackendKind::Auto`]: crate::BackendKind::Auto
    /// [`PoolBuilder::conf`]: crate::PoolBuilder::conf
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::global();
    /// let buf = pool.take(4096);
    /// assert_eq!(buf.len(), 4096);
    /// ```
    pub fn global() -> &'static Pool {
        static GLOBAL: std::sync::OnceLock<Pool> = std::sync::OnceLock::new();
        GLOBAL.get_or_init(|| {
            Pool::builder().from_env().build().unwrap_or_else(|e| {
                tracing::warn!(error = %e, "pinpool: PINPOOL_CONF rejected; using the defaults");
                Pool::builder()
                    .build()
                    .unwrap_or_else(|e| panic!("pinpool: building the global pool failed: {e}"))
            })
        })
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

/// Reverses a successful [`register_region`].
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
