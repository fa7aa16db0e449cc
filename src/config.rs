//! Building a pool: [`PoolBuilder`] and the effective [`Config`].

use std::path::PathBuf;
use std::time::Duration;

use crate::backend::{BackendKind, MAX_DEVICES};
use crate::error::Error;
use crate::numa::NumaMode;
use crate::size_class::SizeClasses;

/// The least the cap on pooled bytes falls to while it follows the working
/// set, by default (see [`PoolBuilder::min_pooled_bytes`]): 4 GiB, or the
/// pinned budget if that is less and the backend pins. A pool starts with
/// this cap.
pub const DEFAULT_MIN_POOLED_BYTES: usize = 4 << 30;

/// Default cap on the bytes one thread's cache holds: 64 MiB.
pub const DEFAULT_THREAD_CACHE_BYTES: usize = 64 << 20;

/// Most cleaner workers a pool may run.
const MAX_CLEANER_THREADS: usize = 256;

/// Default idle time after which ready buffers are trimmed: 30 s.
pub const DEFAULT_IDLE_TRIM: Duration = Duration::from_secs(30);

/// Default borrowing slack: a buffer up to twice its class's length. On
/// the real client's profile this keeps fewer buffers pinned and hits more
/// often than a tighter slack (see BENCHMARKS.md), at the price of longer
/// buffers handed out when a class runs dry.
pub const DEFAULT_BORROW_SLACK: u32 = 100;

/// The settings a pool runs with.
///
/// # Examples
///
/// ```
/// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
/// // No cap given: the cap follows the working set.
/// assert_eq!(pool.config().max_pooled_bytes, None);
/// assert_eq!(pool.config().min_pooled_bytes, pinpool::DEFAULT_MIN_POOLED_BYTES);
/// # Ok::<(), pinpool::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// The backend asked for.
    pub backend: BackendKind,
    /// Devices served, one shard each; `None` means every device found.
    pub devices: Option<usize>,
    /// Cleaner workers.
    pub cleaner_threads: usize,
    /// Cap on pooled bytes, thread caches included, if one is given;
    /// `None` (the default): the cap follows the working set (see
    /// [`PoolBuilder::max_pooled_bytes`]; [`Stats::max_pooled_bytes`] says
    /// what it is now).
    ///
    /// [`Stats::max_pooled_bytes`]: crate::Stats::max_pooled_bytes
    pub max_pooled_bytes: Option<usize>,
    /// The least the cap falls to while it follows the working set (the
    /// pinned budget lowers it further); see
    /// [`PoolBuilder::min_pooled_bytes`].
    pub min_pooled_bytes: usize,
    /// The pinned budget, the most bytes page-locked at once, in use and
    /// idle, if one is given (`usize::MAX`: no bound); `None` (the
    /// default): a quarter of the memory the process may use (see
    /// [`PoolBuilder::max_pinned_bytes`]; [`Stats::max_pinned_bytes`] says
    /// what it is).
    ///
    /// [`Stats::max_pinned_bytes`]: crate::Stats::max_pinned_bytes
    pub max_pinned_bytes: Option<usize>,
    /// Cap on the bytes each thread's cache holds.
    pub thread_cache_bytes: usize,
    /// How requested sizes round up to buffer lengths.
    pub size_classes: SizeClasses,
    /// Ready buffers idle longer than this go back to the OS (largest
    /// first, keeping what recent demand needs); `None`: never.
    pub idle_trim: Option<Duration>,
    /// Whether the cleaner keeps pinned memory ready for what recent demand
    /// has needed: with regions, the regions grow ahead of it; with regions
    /// off, per class, as many pinned buffers (see [`Pool::reserve`] for
    /// explicit provisioning).
    ///
    /// [`Pool::reserve`]: crate::pool::Pool::reserve
    pub provision: bool,
    /// Whether buffers are carved from regions, a few large registrations,
    /// instead of pinning each buffer (see
    /// [`PoolBuilder::regions`]). On by default.
    pub regions: bool,
    /// How much longer than its class a buffer may be when a take whose
    /// class is empty borrows an idle pinned buffer of a larger class, in
    /// percent of the class size (0: never borrow).
    pub borrow_slack: u32,
    /// Whether each device's buffers are placed on its host NUMA node.
    pub numa: NumaMode,
    /// The file the pool writes its trace to (see [`trace`](crate::trace)
    /// and [`PoolBuilder::trace`]); `None`: no trace.
    pub trace: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            backend: BackendKind::Auto,
            devices: None,
            cleaner_threads: cores.clamp(1, 8),
            max_pooled_bytes: None,
            min_pooled_bytes: DEFAULT_MIN_POOLED_BYTES,
            max_pinned_bytes: None,
            thread_cache_bytes: DEFAULT_THREAD_CACHE_BYTES,
            size_classes: SizeClasses::default(),
            idle_trim: Some(DEFAULT_IDLE_TRIM),
            provision: true,
            regions: true,
            borrow_slack: DEFAULT_BORROW_SLACK,
            numa: NumaMode::Auto,
            trace: None,
        }
    }
}

impl Config {
    /// The settings as `key=value` pairs that [`PoolBuilder::try_conf`]
    /// reads back (the trace's header keeps them), the trace itself left
    /// out.
    pub(crate) fn conf_pairs(&self) -> Vec<(&'static str, String)> {
        let switch = |on: bool| if on { "on" } else { "off" }.to_string();
        let mut pairs = vec![("backend", self.backend.to_string())];
        if let Some(devices) = self.devices {
            pairs.push(("devices", devices.to_string()));
        }
        pairs.extend([
            ("cleaner_threads", self.cleaner_threads.to_string()),
            (
                "max_pooled_bytes",
                self.max_pooled_bytes
                    .map_or("follow".to_string(), |b| b.to_string()),
            ),
            ("min_pooled_bytes", self.min_pooled_bytes.to_string()),
            (
                "max_pinned_bytes",
                match self.max_pinned_bytes {
                    None => "default".to_string(),
                    Some(usize::MAX) => "unlimited".to_string(),
                    Some(bytes) => bytes.to_string(),
                },
            ),
            ("thread_cache_bytes", self.thread_cache_bytes.to_string()),
            ("size_classes", self.size_classes.to_string()),
            (
                "idle_trim",
                self.idle_trim.map_or("off".to_string(), duration),
            ),
            ("provision", switch(self.provision)),
            ("regions", switch(self.regions)),
            ("borrow", self.borrow_slack.to_string()),
            ("numa", self.numa.to_string()),
        ]);
        pairs
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self.cleaner_threads == 0 || self.cleaner_threads > MAX_CLEANER_THREADS {
            return Err(Error::InvalidConfig(format!(
                "cleaner_threads must be in 1..={MAX_CLEANER_THREADS}, got {}",
                self.cleaner_threads
            )));
        }
        let page = crate::size_class::page_size();
        if let Some(cap) = self.max_pooled_bytes.filter(|&cap| cap < page) {
            return Err(Error::InvalidConfig(format!(
                "max_pooled_bytes must hold at least one buffer ({page} bytes), got {cap}; \
                 to turn pooling off later, use Pool::set_max_pooled_bytes(0)",
            )));
        }
        if self.idle_trim == Some(Duration::ZERO) {
            return Err(Error::InvalidConfig(
                "idle_trim must be positive (use `off`, or PoolBuilder::no_idle_trim, to disable it)".into(),
            ));
        }
        if self.borrow_slack > 100 {
            return Err(Error::InvalidConfig(format!(
                "borrow_slack must be at most 100 (percent), got {}",
                self.borrow_slack
            )));
        }
        if let Some(devices) = self.devices {
            if devices == 0 || devices > MAX_DEVICES {
                return Err(Error::InvalidConfig(format!(
                    "devices must be in 1..={MAX_DEVICES}, got {devices}"
                )));
            }
        }
        Ok(())
    }
}

/// Configures and builds a [`Pool`](crate::pool::Pool).
///
/// # Examples
///
/// ```
/// use pinpool::{BackendKind, Pool};
///
/// let pool = Pool::builder()
///     .backend(BackendKind::Host)
///     .devices(2)
///     .cleaner_threads(2)
///     .max_pooled_bytes(64 << 20)
///     .build()?;
/// assert_eq!(pool.take_on(1, 4096)?.device(), 1);
/// # Ok::<(), pinpool::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct PoolBuilder {
    pub(crate) config: Config,
    /// Whether a trace file that cannot be written is only warned about
    /// (the trace set by the lenient `conf` or `from_env`), not an error.
    pub(crate) trace_lenient: bool,
    #[cfg(feature = "testing")]
    pub(crate) faults: Option<std::sync::Arc<crate::backend::fault::Faults>>,
    /// Set by [`idle_sweeps(false)`](Self::idle_sweeps) (the `testing`
    /// feature).
    #[cfg(feature = "testing")]
    pub(crate) no_idle_sweeps: bool,
}

impl PoolBuilder {
    /// Which backend to use (default [`BackendKind::Auto`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// assert_eq!(pool.backend(), pinpool::BackendKind::Host);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn backend(mut self, kind: BackendKind) -> Self {
        self.config.backend = kind;
        self
    }

    /// How many devices to serve, one shard each (default: every device
    /// the CUDA driver reports; 1 on the host backend), at most
    /// [`MAX_DEVICES`]. Each thread that takes from the pool keeps about
    /// 22 KiB of counters and list heads per device served (with the fine
    /// size classes).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).devices(4).build()?;
    /// assert_eq!(pool.stats().devices, 4);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn devices(mut self, devices: usize) -> Self {
        self.config.devices = Some(devices);
        self
    }

    /// How many cleaner workers to run (default: the number of cores, at
    /// most 8).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).cleaner_threads(2).build()?;
    /// assert_eq!(pool.config().cleaner_threads, 2);
    /// assert!(pinpool::Pool::builder().cleaner_threads(0).build().is_err());
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn cleaner_threads(mut self, threads: usize) -> Self {
        self.config.cleaner_threads = threads;
        self
    }

    /// A fixed cap on pooled bytes (idle buffers, thread caches included,
    /// and free region extents), instead of the default, which follows the
    /// working set: with no cap given, the cap is a quarter more than the
    /// most bytes in use at once over the last idle-trim time (30 s by
    /// default; the bytes their buffers occupy, sampled every 10 ms while
    /// the pool is in use, and as each take that found no memory saw them
    /// in between, so that a burst of misses between two samples counts;
    /// a burst served from the pool between two samples does not, so the
    /// cap may fall a window after the last burst that missed) or
    /// [`min_pooled_bytes`](Self::min_pooled_bytes) (4 GiB by default),
    /// whichever is more, plus the bytes
    /// [`Pool::reserve`](crate::Pool::reserve) asked for since the last
    /// [`clear`](crate::Pool::clear), at most the pinned budget (on a
    /// backend that pins: the host backend pins nothing). It
    /// rises as soon as the bytes in use do; it falls once the larger use
    /// is a whole idle-trim time past, evicting down to it then. So a
    /// workload keeps idle what its own steps need (a step up to several
    /// GiB gets its buffers back at the next), and one that shrinks gives
    /// back what it no longer uses. A cap given here, by
    /// [`conf`](Self::conf) or by
    /// [`Pool::set_max_pooled_bytes`](crate::Pool::set_max_pooled_bytes)
    /// stays where it is put. [`Stats`](crate::Stats) says the cap in force
    /// and where it comes from. With regions, free extents count as pooled
    /// bytes, and a region with a buffer out keeps its free extents past
    /// the cap until that buffer comes back (see [`regions`](Self::regions)).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).max_pooled_bytes(1 << 30).build()?;
    /// let stats = pool.stats();
    /// assert_eq!(stats.max_pooled_bytes, 1 << 30);
    /// assert_eq!(stats.max_pooled_bytes_from, pinpool::LimitSource::Given);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn max_pooled_bytes(mut self, bytes: usize) -> Self {
        self.config.max_pooled_bytes = Some(bytes);
        self
    }

    /// The least the cap on pooled bytes falls to while it follows the
    /// working set (no cap given; see
    /// [`max_pooled_bytes`](Self::max_pooled_bytes)): default
    /// [`DEFAULT_MIN_POOLED_BYTES`], 4 GiB. The pool starts with this cap,
    /// before it has seen any bytes in use; the pinned budget, if less,
    /// bounds it on a backend that pins. A given cap ignores it.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).min_pooled_bytes(64 << 20).build()?;
    /// let stats = pool.stats();
    /// assert_eq!(stats.max_pooled_bytes, 64 << 20);
    /// assert_eq!(stats.max_pooled_bytes_from, pinpool::LimitSource::Default);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn min_pooled_bytes(mut self, bytes: usize) -> Self {
        self.config.min_pooled_bytes = bytes;
        self
    }

    /// The pinned budget: the most bytes page-locked at once, in use and
    /// idle (`usize::MAX`: no bound). The default is a quarter
    /// ([`DEFAULT_PINNED_SHARE_PERCENT`](crate::DEFAULT_PINNED_SHARE_PERCENT))
    /// of the memory the process may use, the lesser of the host's
    /// (`MemTotal`) and its control group's limit (cgroup v2 `memory.max`,
    /// or v1 `memory.limit_in_bytes`), read when the pool is built, per
    /// pool; no bound where neither can be read. Regions grow no further
    /// than it; with regions off, a miss buffer whose first registration
    /// would pass it is freed when it is dropped instead of registered (a
    /// later take of its size misses again: pageable, as every miss);
    /// provisioning pins nothing past it, and
    /// [`Pool::reserve`](crate::Pool::reserve) past it is an error. The
    /// cleaner's registrations are admitted against it together, those
    /// under way included, so registrations racing on several workers or
    /// devices do not pass it between them. Memory `reserve` asked for is
    /// admitted when asked, at what its registrations will pin (whole
    /// slabs, or regions of whole pages), with those registrations and every
    /// earlier `reserve` not yet registered, and holds its room until its
    /// own registration takes it over; a registration that fails and is
    /// retried is admitted again within the budget. The cap on pooled
    /// bytes still bounds what is idle.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).max_pinned_bytes(8 << 30).build()?;
    /// assert_eq!(pool.stats().max_pinned_bytes, 8 << 30);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn max_pinned_bytes(mut self, bytes: usize) -> Self {
        self.config.max_pinned_bytes = Some(bytes);
        self
    }

    /// The cap on the bytes each thread's cache holds (default 64 MiB);
    /// buffers beyond it wait in the shared per-device stacks.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).thread_cache_bytes(8 << 20).build()?;
    /// assert_eq!(pool.config().thread_cache_bytes, 8 << 20);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn thread_cache_bytes(mut self, bytes: usize) -> Self {
        self.config.thread_cache_bytes = bytes;
        self
    }

    /// How requested sizes round up (default [`SizeClasses::Fine`]);
    /// [`SizeClasses::PowersOfTwo`] gives the seed's lengths.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinpool::SizeClasses;
    ///
    /// let pool = pinpool::Pool::builder()
    ///     .backend(pinpool::BackendKind::Host)
    ///     .size_classes(SizeClasses::PowersOfTwo)
    ///     .build()?;
    /// assert_eq!(pool.take(5000).len(), 8192);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn size_classes(mut self, classes: SizeClasses) -> Self {
        self.config.size_classes = classes;
        self
    }

    /// Ready buffers idle longer than `after` go back to the OS, largest
    /// first, keeping what recent demand needs (default 30 s). Zero is an
    /// error from [`build`](Self::build).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let pool = pinpool::Pool::builder()
    ///     .backend(pinpool::BackendKind::Host)
    ///     .idle_trim(Duration::from_secs(5))
    ///     .build()?;
    /// assert_eq!(pool.config().idle_trim, Some(Duration::from_secs(5)));
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn idle_trim(mut self, after: Duration) -> Self {
        self.config.idle_trim = Some(after);
        self
    }

    /// Never trims idle buffers ([`Pool::trim`](crate::pool::Pool::trim) still
    /// does on demand).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).no_idle_trim().build()?;
    /// assert_eq!(pool.config().idle_trim, None);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn no_idle_trim(mut self) -> Self {
        self.config.idle_trim = None;
        self
    }

    /// Whether the cleaner provisions pinned buffers ahead of demand
    /// (default on; see [`Config::provision`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).provision(false).build()?;
    /// assert!(!pool.config().provision);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn provision(mut self, on: bool) -> Self {
        self.config.provision = on;
        self
    }

    /// Whether buffers are carved from *regions* (default on; off pins
    /// each buffer on its own): on a pinning backend, the cleaner registers a few large mappings, sized
    /// by the most bytes the takes wanted at once (plus an eighth), instead
    /// of one registration per buffer; a miss buffer is freed, never
    /// registered. A burst of misses grows them once, when its demand has
    /// stopped rising for 2 ms (a run of rises counts as rising for 20 ms
    /// at most, and a returned miss waits 20 ms at most from when it was
    /// first parked). A growth registers the wholly free regions again with
    /// what it adds, as one region (their pages moved, not faulted again),
    /// so a device's memory stays in a few regions whose extents hold its
    /// largest buffers. A take whose class is empty carves its buffer from a
    /// region's free extents, or from the space of idle carved buffers of
    /// other classes that are not hot, before it misses (borrowing a
    /// larger buffer whole gives way to this). A clean buffer goes back to
    /// its class only while the class is *hot* (taken at 1,600 a second or
    /// more over the last 50 ms, as in a staging loop; not a burst of
    /// takes of one size); otherwise back to
    /// its region, where free neighbours coalesce, so memory moves between
    /// size classes. Sub-page buffers come from slabs, each a page carved
    /// from a region (no registration of its own). Buffers under
    /// 64 MiB are carved from the top of the free extent that fits them
    /// best, longer ones from its bottom.
    /// Regions wholly free for the idle-trim time are released, and so,
    /// sooner, are regions that hold far more than the demand of the last
    /// idle-trim time (see
    /// [`Stats::regions_drained`](crate::Stats::regions_drained)); `clear`
    /// frees the regions nothing is carved from, `shutdown` every region
    /// (one with a buffer still out goes with its last buffer); a lowered
    /// pinned budget frees wholly free regions. Free extents count as
    /// pooled bytes ([`Stats::free_extent_bytes`](crate::Stats::free_extent_bytes)
    /// says how many): while idle buffers and free extents together exceed
    /// the cap, wholly free regions are released (when the cap is set, and
    /// by the cleaner once they have been wholly free for 100 ms; while the
    /// cap follows the working set, only regions listed an eighth of its
    /// window ago or more, and, if idle trimming is on, only for an excess
    /// of more than an eighth of the cap); a region
    /// with a buffer in use, or idle in its class, keeps its free extents
    /// (one registration is released whole or not at all). So, under a cap
    /// that is set, a growth that would take the regions past the cap stops
    /// at it, and what the demand needs beyond it is grown at the next
    /// growth, in a region of its own that folds in no other: once the
    /// workload pauses, the regions past the cap go and those within it
    /// stay, for the next takes to carve from.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).regions(false).build()?;
    /// assert!(!pool.config().regions);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn regions(mut self, on: bool) -> Self {
        self.config.regions = on;
        self
    }

    /// How much longer than its class (in percent, at most 100) a borrowed
    /// buffer may be (default 100; 0 turns borrowing off; see
    /// [`Config::borrow_slack`]). A borrowed buffer's `len()` is still the
    /// class asked for; [`capacity`](crate::buffer::PinnedBuffer::capacity) says
    /// what it occupies.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).borrow_slack(0).build()?;
    /// assert_eq!(pool.config().borrow_slack, 0);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn borrow_slack(mut self, percent: u32) -> Self {
        self.config.borrow_slack = percent;
        self
    }

    /// Whether each device's buffers are placed on its host NUMA node
    /// (default [`NumaMode::Auto`]; see [`Config::numa`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use pinpool::NumaMode;
    ///
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).numa(NumaMode::Off).build()?;
    /// assert_eq!(pool.config().numa, NumaMode::Off);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn numa(mut self, mode: NumaMode) -> Self {
        self.config.numa = mode;
        self
    }

    /// Writes a trace of the pool's takes, drops and own events to `path`
    /// (see [`trace`](crate::trace) for what it holds and its format); the
    /// file is created (or truncated) by [`build`](Self::build), which fails
    /// with [`Error::Trace`] naming the path if it cannot be, or if another
    /// pool of this process is writing it (a `PINPOOL_TRACE` path read by
    /// [`from_env`](Self::from_env) goes to the first free `PATH.2`,
    /// `PATH.3`, ... instead, with a warning). The trace is finished when
    /// the pool closes, or when the process exits for a pool that never
    /// does (the global pool). Each thread that takes from a traced pool
    /// keeps a 256 KiB buffer of records.
    ///
    /// # Examples
    ///
    /// ```
    /// let path = std::env::temp_dir().join(format!("pinpool-builder-{}.trace", std::process::id()));
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).trace(&path).build()?;
    /// assert_eq!(pool.config().trace.as_deref(), Some(path.as_path()));
    /// let bad = pinpool::Pool::builder().trace("/no/such/dir/pool.trace").build();
    /// assert!(matches!(bad, Err(pinpool::Error::Trace { .. })));
    /// # drop(pool);
    /// # std::fs::remove_file(&path).ok();
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn trace(mut self, path: impl Into<PathBuf>) -> Self {
        self.config.trace = Some(path.into());
        self.trace_lenient = false;
        self
    }

    /// Applies settings written as comma-separated `key=value` pairs, the
    /// format of the `PINPOOL_CONF` environment variable; see
    /// [`try_conf`](Self::try_conf) for the keys. This lenient form skips
    /// a bad pair (malformed, unknown key, out-of-range value) and keeps
    /// the others, reporting each skipped pair through `tracing` at warn
    /// level.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder()
    ///     .conf("backend=host, cleaner_threads=0, max_pooled_bytes=512MiB, bogus=1")
    ///     .build()?;
    /// assert_eq!(pool.config().cleaner_threads, pinpool::Config::default().cleaner_threads);
    /// assert_eq!(pool.config().max_pooled_bytes, Some(512 << 20));
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn conf(self, text: &str) -> Self {
        self.conf_reporting(text, |pair, why| {
            tracing::warn!(setting = pair, "pinpool: ignoring a setting: {why}");
        })
    }

    /// Applies `key=value` pairs strictly: the first bad pair (malformed,
    /// unknown key, out-of-range value) is an [`Error::Setting`] naming
    /// it, and nothing is applied.
    ///
    /// Keys (sizes take an optional `KiB`, `MiB`, `GiB` or `TiB` suffix;
    /// durations `ms`, `s`, `m`):
    ///
    /// | key | values |
    /// | --- | --- |
    /// | `backend` | `auto`, `cuda`, `host` |
    /// | `devices` | 1 to [`MAX_DEVICES`] (64) |
    /// | `cleaner_threads` | 1 to 256 |
    /// | `max_pooled_bytes` | a size, at least one page, or `follow` (the default: follows the working set) |
    /// | `min_pooled_bytes` | a size (the least a following cap falls to) |
    /// | `max_pinned_bytes` | a size, `unlimited`, or `default` (a quarter of the memory the process may use) |
    /// | `thread_cache_bytes` | a size |
    /// | `size_classes` | `fine`, `pow2` |
    /// | `idle_trim` | a positive duration with its unit (`ns`, `us`, `ms`, `s`, `m`), or `off` |
    /// | `provision` | `on`, `off` |
    /// | `regions` | `on`, `off` |
    /// | `borrow` | a percent, 0 to 100 (`50` or `50%`) |
    /// | `numa` | `auto`, `off` |
    /// | `trace` | a file path (without commas), or `off` (see [`trace`](Self::trace)) |
    ///
    /// # Examples
    ///
    /// ```
    /// let built = pinpool::Pool::builder().try_conf("cleaner_threads=0,max_pooled_bytes=32GiB");
    /// assert!(matches!(built, Err(pinpool::Error::Setting { .. })));
    /// let pool = pinpool::Pool::builder().try_conf("backend=host,idle_trim=10s,borrow=10%")?.build()?;
    /// assert_eq!(pool.config().borrow_slack, 10);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn try_conf(mut self, text: &str) -> Result<Self, Error> {
        let mut config = self.config.clone();
        for pair in pairs(text) {
            let traced = apply(&mut config, pair).map_err(|reason| Error::Setting {
                pair: pair.to_string(),
                reason,
            })?;
            if traced {
                self.trace_lenient = false;
            }
        }
        self.config = config;
        Ok(self)
    }

    fn conf_reporting(mut self, text: &str, mut report: impl FnMut(&str, &str)) -> Self {
        for pair in pairs(text) {
            match apply(&mut self.config, pair) {
                Ok(true) => self.trace_lenient = true,
                Ok(false) => {}
                Err(why) => report(pair, &why),
            }
        }
        self
    }

    /// Traces to the `PINPOOL_TRACE` environment variable's path, if set
    /// and not empty (`lenient`: a file that cannot be written is warned
    /// about, not an error).
    fn trace_from_env(mut self, lenient: bool) -> Self {
        if let Some(path) = std::env::var_os("PINPOOL_TRACE").filter(|p| !p.is_empty()) {
            self.config.trace = Some(PathBuf::from(path));
            self.trace_lenient = lenient;
        }
        self
    }

    /// Applies the `PINPOOL_CONF` environment variable, if set, leniently
    /// (see [`conf`](Self::conf)): each skipped pair is reported once on
    /// standard error as well as through `tracing`. The global pool is built
    /// this way (see [`Pool::global`](crate::pool::Pool::global)). Then
    /// `PINPOOL_TRACE`, if set, names the file to trace to (see
    /// [`trace`](Self::trace)); one that cannot be written is reported once
    /// the same way, and the pool runs untraced.
    ///
    /// # Examples
    ///
    /// ```
    /// // PINPOOL_CONF="cleaner_threads=2" in the environment sets the workers
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).from_env().build()?;
    /// assert!(pool.config().cleaner_threads >= 1);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn from_env(self) -> Self {
        match std::env::var("PINPOOL_CONF") {
            Ok(text) => self.conf_reporting(&text, |pair, why| {
                tracing::warn!(
                    setting = pair,
                    "pinpool: ignoring a PINPOOL_CONF setting: {why}"
                );
                eprintln!("pinpool: ignoring the PINPOOL_CONF setting `{pair}`: {why}");
            }),
            Err(_) => self,
        }
        .trace_from_env(true)
    }

    /// Applies the `PINPOOL_CONF` environment variable strictly (see
    /// [`try_conf`](Self::try_conf)). A variable that is not valid UTF-8 is
    /// an error too; an unset one changes nothing. Then `PINPOOL_TRACE`, if
    /// set, names the file to trace to, as [`trace`](Self::trace) does.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).try_from_env()?.build()?;
    /// # drop(pool);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn try_from_env(self) -> Result<Self, Error> {
        let this = match std::env::var("PINPOOL_CONF") {
            Ok(text) => self.try_conf(&text)?,
            Err(std::env::VarError::NotPresent) => self,
            Err(std::env::VarError::NotUnicode(_)) => Err(Error::Setting {
                pair: "PINPOOL_CONF".into(),
                reason: "not valid UTF-8".into(),
            })?,
        };
        Ok(this.trace_from_env(false))
    }

    /// Runs the pool on a fault-injecting backend under `faults` (the
    /// `testing` feature); see [`Faults`](crate::backend::fault::Faults).
    #[cfg(feature = "testing")]
    pub fn faults(mut self, faults: std::sync::Arc<crate::backend::fault::Faults>) -> Self {
        self.faults = Some(faults);
        self
    }

    /// Whether the cleaner moves the buffers of owners it finds idle (no
    /// take or drop between two of its sweeps, which run as often as every
    /// millisecond) along to itself and the shards; on by default (the
    /// `testing` feature). A test that leaves buffers in its thread's lists
    /// and then takes, counting on finding them there, turns it off: a
    /// thread preempted between its drops and its take for a few
    /// milliseconds is an idle owner to the sweep.
    #[cfg(feature = "testing")]
    pub fn idle_sweeps(mut self, on: bool) -> Self {
        self.no_idle_sweeps = !on;
        self
    }
}

/// The non-empty pairs of a `key=value,...` text.
fn pairs(text: &str) -> impl Iterator<Item = &str> {
    text.split(',').map(str::trim).filter(|p| !p.is_empty())
}

/// Applies one `key=value` pair to `config`, checking its range; whether
/// it set a trace path.
fn apply(config: &mut Config, pair: &str) -> Result<bool, String> {
    let (key, value) = pair.split_once('=').ok_or("expected key=value")?;
    let (key, value) = (key.trim(), value.trim());
    match key {
        "cleaner_threads" => {
            config.cleaner_threads = parse_in(value, 1, MAX_CLEANER_THREADS)?;
        }
        "devices" => config.devices = Some(parse_in(value, 1, MAX_DEVICES)?),
        "max_pooled_bytes" => {
            config.max_pooled_bytes = if value.eq_ignore_ascii_case("follow") {
                None
            } else {
                let bytes = parse_size(value)?;
                let page = crate::size_class::page_size();
                if bytes < page {
                    return Err(format!("must hold at least one buffer ({page} bytes)"));
                }
                Some(bytes)
            };
        }
        "min_pooled_bytes" => config.min_pooled_bytes = parse_size(value)?,
        "max_pinned_bytes" => {
            config.max_pinned_bytes = if value.eq_ignore_ascii_case("default") {
                None
            } else if value.eq_ignore_ascii_case("unlimited") {
                Some(usize::MAX)
            } else {
                Some(parse_size(value)?)
            };
        }
        "thread_cache_bytes" => config.thread_cache_bytes = parse_size(value)?,
        "size_classes" => {
            config.size_classes = value
                .to_ascii_lowercase()
                .parse::<SizeClasses>()
                .map_err(|_| "size_classes must be fine or pow2".to_string())?
        }
        "idle_trim" => {
            config.idle_trim = match value.to_ascii_lowercase().as_str() {
                "off" => None,
                _ => match parse_duration(value)? {
                    d if d.is_zero() => return Err("must be positive, or off".into()),
                    d => Some(d),
                },
            }
        }
        "provision" => config.provision = parse_switch(value)?,
        "regions" => config.regions = parse_switch(value)?,
        "numa" => config.numa = value.parse()?,
        "borrow" => {
            let digits = value.strip_suffix('%').unwrap_or(value).trim();
            config.borrow_slack = parse_in(digits, 0, 100)? as u32;
        }
        "backend" => {
            config.backend = match value.to_ascii_lowercase().as_str() {
                "auto" => BackendKind::Auto,
                "cuda" => BackendKind::Cuda,
                "host" => BackendKind::Host,
                _ => return Err("backend must be auto, cuda or host".into()),
            }
        }
        "trace" => {
            if value.is_empty() {
                return Err("needs a path, or off".into());
            }
            if value.eq_ignore_ascii_case("off") {
                config.trace = None;
                return Ok(false);
            }
            config.trace = Some(PathBuf::from(value));
            return Ok(true);
        }
        _ => return Err(format!("unknown key `{key}`")),
    }
    Ok(false)
}

/// A count in `[lo, hi]`.
fn parse_in(value: &str, lo: usize, hi: usize) -> Result<usize, String> {
    let n: usize = value
        .parse()
        .map_err(|_| format!("`{value}` is not a count"))?;
    if n < lo || n > hi {
        return Err(format!("{n} is out of range ({lo} to {hi})"));
    }
    Ok(n)
}

/// `on` or `off`.
fn parse_switch(value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(format!("`{value}` is not on or off")),
    }
}

/// A byte count with an optional `KiB`, `MiB`, `GiB` or `TiB` suffix.
fn parse_size(value: &str) -> Result<usize, String> {
    let (digits, shift) = [("KiB", 10), ("MiB", 20), ("GiB", 30), ("TiB", 40)]
        .iter()
        .find_map(|(suffix, shift)| value.strip_suffix(suffix).map(|d| (d.trim(), *shift)))
        .unwrap_or((value, 0));
    let n: usize = digits
        .parse()
        .map_err(|_| format!("`{value}` is not a size"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("`{value}` is too large"))
}

/// A duration with a `ms`, `s` or `m` suffix.
/// `d` as a conf value that parses back to it: whole milliseconds where it
/// is some, else nanoseconds.
fn duration(d: Duration) -> String {
    if d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}ns", d.as_nanos())
    }
}

fn parse_duration(value: &str) -> Result<Duration, String> {
    let v = value.trim();
    // Whole nanoseconds, exactly (what a trace's header writes for a
    // duration that is no whole number of milliseconds).
    if let Some(d) = v.strip_suffix("ns") {
        return d
            .trim()
            .parse::<u64>()
            .map(Duration::from_nanos)
            .map_err(|_| format!("`{value}` is not a whole number of nanoseconds"));
    }
    let (digits, unit) = if let Some(d) = v.strip_suffix("us") {
        (d, 1e-6)
    } else if let Some(d) = v.strip_suffix("ms") {
        (d, 1e-3)
    } else if let Some(d) = v.strip_suffix('s') {
        (d, 1.0)
    } else if let Some(d) = v.strip_suffix('m') {
        (d, 60.0)
    } else {
        return Err(format!("`{value}` needs a unit: ns, us, ms, s or m"));
    };
    let n: f64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("`{value}` is not a duration"))?;
    if !n.is_finite() || n < 0.0 || n * unit > 1e9 {
        return Err(format!("`{value}` is out of range"));
    }
    Ok(Duration::from_secs_f64(n * unit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_and_ranges_hold() {
        assert_eq!(parse_size("3GiB"), Ok(3 << 30));
        assert_eq!(parse_size("1 TiB"), Ok(1 << 40));
        assert!(parse_size("x").is_err());
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(
            parse_duration("1500001ns"),
            Ok(Duration::from_nanos(1_500_001))
        );
        assert_eq!(parse_duration("2.5us"), Ok(Duration::from_nanos(2_500)));
        assert!(parse_duration("1.5ns").is_err());
        for d in [
            Duration::from_micros(500),
            Duration::from_millis(30_000),
            Duration::from_nanos(7),
        ] {
            assert_eq!(parse_duration(&duration(d)), Ok(d));
        }
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_in("0", 1, 8).is_err());
        assert_eq!(parse_switch("off"), Ok(false));
    }

    #[test]
    fn lenient_conf_keeps_the_good_pairs() {
        let mut skipped = Vec::new();
        let b = PoolBuilder::default().conf_reporting(
            "cleaner_threads=0,max_pooled_bytes=32GiB,idle_trim=0s,borrow=200%,size_classes=pow2,\
             numa=off,numa=near",
            |pair, _| skipped.push(pair.to_string()),
        );
        assert_eq!(b.config.max_pooled_bytes, Some(32 << 30));
        assert_eq!(b.config.numa, NumaMode::Off);
        assert_eq!(b.config.size_classes, SizeClasses::PowersOfTwo);
        assert_eq!(b.config.cleaner_threads, Config::default().cleaner_threads);
        assert_eq!(
            skipped,
            [
                "cleaner_threads=0",
                "idle_trim=0s",
                "borrow=200%",
                "numa=near"
            ]
        );
        assert_eq!(b.config.max_pinned_bytes, None, "the default budget");
        let b = PoolBuilder::default()
            .conf_reporting("max_pinned_bytes=2GiB", |pair, why| panic!("{pair}: {why}"));
        assert_eq!(b.config.max_pinned_bytes, Some(2 << 30));
        let b = b.conf_reporting("max_pinned_bytes=Unlimited", |pair, why| {
            panic!("{pair}: {why}")
        });
        assert_eq!(b.config.max_pinned_bytes, Some(usize::MAX));
        let b = b.conf_reporting(
            "max_pinned_bytes=default,max_pooled_bytes=1GiB",
            |pair, why| panic!("{pair}: {why}"),
        );
        assert_eq!(b.config.max_pinned_bytes, None);
        assert_eq!(b.config.max_pooled_bytes, Some(1 << 30));
        let b = b.conf_reporting("max_pooled_bytes=Follow", |pair, why| {
            panic!("{pair}: {why}")
        });
        assert_eq!(b.config.max_pooled_bytes, None);
    }
}
