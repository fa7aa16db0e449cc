//! The crate's error type.

use std::fmt;

/// What can go wrong when building a pool or taking a buffer.
///
/// # Examples
///
/// ```
/// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
/// match pool.try_take(usize::MAX) {
///     Err(pinpool::Error::SizeTooLarge { requested, max }) => assert!(requested > max),
///     other => panic!("unexpected: {other:?}"),
/// }
/// # Ok::<(), pinpool::Error>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The request is larger than the largest size class.
    SizeTooLarge {
        /// The size asked for.
        requested: usize,
        /// The largest size the pool serves ([`MAX_CLASS_SIZE`](crate::MAX_CLASS_SIZE)).
        max: usize,
    },
    /// The device index names no shard of this pool.
    UnknownDevice {
        /// The device asked for.
        device: usize,
        /// How many devices the pool serves.
        devices: usize,
    },
    /// A builder value is out of range.
    InvalidConfig(String),
    /// [`Pool::reserve`](crate::Pool::reserve) asked for more bytes than the
    /// cap given allows (a cap that follows the working set rises for
    /// them instead).
    ReserveTooLarge {
        /// The footprint bytes asked for.
        bytes: usize,
        /// The cap.
        cap: usize,
    },
    /// [`Pool::reserve`](crate::Pool::reserve) asked for more bytes than
    /// the pinned budget has left
    /// ([`PoolBuilder::max_pinned_bytes`](crate::PoolBuilder::max_pinned_bytes)).
    ReservePastPinnedBudget {
        /// The bytes the reserve would pin: its buffers' footprints, each
        /// rounded up to what its registration pins (a whole slab, a
        /// region of whole pages).
        bytes: usize,
        /// The bytes page-locked when asked, and admitted to registrations
        /// under way (earlier reserves not yet registered included).
        pinned: u64,
        /// The budget.
        budget: u64,
    },
    /// [`Pool::reserve`](crate::Pool::reserve) asked for more bytes than
    /// this host's memory could hold (whatever the cap).
    ReserveExceedsMemory {
        /// The footprint bytes asked for (exact: no `usize` overflow).
        bytes: u128,
        /// The host's physical memory in bytes.
        memory: u64,
    },
    /// A `key=value` setting (from `PINPOOL_CONF` or
    /// [`PoolBuilder::try_conf`](crate::PoolBuilder::try_conf)) is malformed,
    /// unknown or out of range.
    Setting {
        /// The pair as written.
        pair: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The CUDA backend was asked for but cannot be used here.
    BackendUnavailable(String),
    /// The operating system could not provide the memory.
    AllocationFailed {
        /// The bytes asked of the operating system.
        bytes: usize,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// No live allocation of a `PinnedAlloc` begins at the address given
    /// (the `allocator-api2` feature).
    UnknownAllocation {
        /// The address given.
        addr: usize,
    },
    /// The trace file (see [`PoolBuilder::trace`](crate::PoolBuilder::trace))
    /// could not be created or written.
    Trace {
        /// The file.
        path: std::path::PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// A CUDA driver call failed.
    Cuda {
        /// The driver call that failed (`CudaContext::new` for a failure
        /// inside cudarc's making of a context after each of its driver
        /// calls had just succeeded).
        op: &'static str,
        /// The driver's error.
        source: cudarc::driver::DriverError,
    },
}

impl Error {
    /// A failed driver call.
    pub(crate) fn cuda(op: &'static str, source: cudarc::driver::DriverError) -> Self {
        Error::Cuda { op, source }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::SizeTooLarge { requested, max } => write!(
                f,
                "requested {requested} bytes, more than the largest size class ({max} bytes)"
            ),
            Error::UnknownDevice { device, devices } => write!(
                f,
                "device {device} is not served by this pool (it serves {devices} device(s))"
            ),
            Error::InvalidConfig(why) => write!(f, "invalid pool configuration: {why}"),
            Error::Setting { pair, reason } => write!(f, "invalid setting `{pair}`: {reason}"),
            Error::ReserveTooLarge { bytes, cap } => write!(
                f,
                "cannot reserve {bytes} bytes: more than the cap on pooled bytes ({cap})"
            ),
            Error::ReservePastPinnedBudget {
                bytes,
                pinned,
                budget,
            } => write!(
                f,
                "cannot reserve {bytes} bytes: {pinned} of the pinned budget of {budget} bytes are pinned or admitted to registrations under way already"
            ),
            Error::ReserveExceedsMemory { bytes, memory } => write!(
                f,
                "cannot reserve {bytes} bytes: more than this host's memory ({memory} bytes)"
            ),
            Error::BackendUnavailable(why) => write!(f, "CUDA backend unavailable: {why}"),
            Error::AllocationFailed { bytes, source } => {
                write!(f, "could not allocate {bytes} bytes: {source}")
            }
            Error::UnknownAllocation { addr } => {
                write!(f, "no live allocation of this allocator begins at {addr:#x}")
            }
            Error::Trace { path, source } => {
                write!(f, "could not write the trace file {}: {source}", path.display())
            }
            Error::Cuda { op, source } => write!(f, "{op} failed: {source}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::AllocationFailed { source, .. } => Some(source),
            Error::Cuda { source, .. } => Some(source),
            Error::Trace { source, .. } => Some(source),
            _ => None,
        }
    }
}
