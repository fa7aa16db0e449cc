//! Building a pool: [`PoolBuilder`] and the effective [`Config`].

use crate::backend::BackendKind;
use crate::error::Error;
use crate::pool::Pool;
use crate::size_class::SizeClasses;

/// Default cap on pooled bytes: 4 GiB.
pub const DEFAULT_MAX_POOLED_BYTES: usize = 4 << 30;

/// Default cap on the bytes one thread's cache holds: 64 MiB.
pub const DEFAULT_THREAD_CACHE_BYTES: usize = 64 << 20;

/// Most cleaner workers a pool may run.
const MAX_CLEANER_THREADS: usize = 256;

/// The settings a pool runs with.
///
/// # Examples
///
/// ```
/// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
/// assert_eq!(pool.config().max_pooled_bytes, pinpool::DEFAULT_MAX_POOLED_BYTES);
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
    /// Cap on pooled bytes, thread caches included.
    pub max_pooled_bytes: usize,
    /// Cap on the bytes each thread's cache holds.
    pub thread_cache_bytes: usize,
    /// How requested sizes round up to buffer lengths.
    pub size_classes: SizeClasses,
}

impl Default for Config {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            backend: BackendKind::Auto,
            devices: None,
            cleaner_threads: cores.clamp(1, 8),
            max_pooled_bytes: DEFAULT_MAX_POOLED_BYTES,
            thread_cache_bytes: DEFAULT_THREAD_CACHE_BYTES,
            size_classes: SizeClasses::default(),
        }
    }
}

impl Config {
    fn validate(&self) -> Result<(), Error> {
        if self.cleaner_threads == 0 || self.cleaner_threads > MAX_CLEANER_THREADS {
            return Err(Error::InvalidConfig(format!(
                "cleaner_threads must be in 1..={MAX_CLEANER_THREADS}, got {}",
                self.cleaner_threads
            )));
        }
        let page = crate::alloc::page_size();
        if self.max_pooled_bytes < page {
            return Err(Error::InvalidConfig(format!(
                "max_pooled_bytes must hold at least one buffer ({page} bytes), got {}; \
                 to turn pooling off later, use Pool::set_max_pooled_bytes(0)",
                self.max_pooled_bytes
            )));
        }
        if let Some(devices) = self.devices {
            if devices == 0 || devices > usize::from(u16::MAX) {
                return Err(Error::InvalidConfig(format!(
                    "devices must be in 1..={}, got {devices}",
                    u16::MAX
                )));
            }
        }
        Ok(())
    }
}

/// Configures and builds a [`Pool`].
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
    config: Config,
    #[cfg(feature = "testing")]
    faults: Option<std::sync::Arc<crate::testing::Faults>>,
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
    /// the CUDA driver reports; 1 on the host backend).
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

    /// The cap on pooled bytes, thread caches included (default 4 GiB).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).max_pooled_bytes(1 << 30).build()?;
    /// assert_eq!(pool.stats().max_pooled_bytes, 1 << 30);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn max_pooled_bytes(mut self, bytes: usize) -> Self {
        self.config.max_pooled_bytes = bytes;
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

    /// Applies settings written as comma-separated `key=value` pairs, the
    /// format of the `PINPOOL_CONF` environment variable: `cleaner_threads`,
    /// `max_pooled_bytes`, `thread_cache_bytes`, `devices` and `backend`
    /// (`auto`, `cuda` or `host`). Sizes take an optional `KiB`, `MiB` or
    /// `GiB` suffix. An invalid pair is reported through tracing, with its
    /// text, and skipped; the other pairs still apply.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder()
    ///     .conf("backend=host, cleaner_threads=3, max_pooled_bytes=512MiB, bogus=1")
    ///     .build()?;
    /// assert_eq!(pool.config().cleaner_threads, 3);
    /// assert_eq!(pool.config().max_pooled_bytes, 512 << 20);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn conf(mut self, text: &str) -> Self {
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if let Err(why) = apply(&mut self.config, pair) {
                tracing::warn!(setting = pair, "pinpool: ignoring a setting: {why}");
            }
        }
        self
    }

    /// Applies the `PINPOOL_CONF` environment variable, if set (see
    /// [`conf`](Self::conf)). The global pool is built this way.
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
            Ok(text) => self.conf(&text),
            Err(_) => self,
        }
    }

    /// Builds the pool and starts its cleaner.
    ///
    /// Fails on out-of-range values, or when the CUDA backend is asked for
    /// and cannot be used.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// drop(pool.take(1));
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn build(self) -> Result<Pool, Error> {
        self.config.validate()?;
        #[cfg(feature = "testing")]
        if let Some(faults) = self.faults {
            let devices = self.config.devices.unwrap_or(1);
            let backend = Box::new(crate::backend::fault::FaultBackend::new(faults, devices));
            return Pool::with_backend(self.config, backend);
        }
        Pool::from_config(self.config)
    }

    /// Runs the pool on a fault-injecting backend under `faults` (the
    /// `testing` feature); see [`Faults`](crate::testing::Faults).
    #[cfg(feature = "testing")]
    pub fn faults(mut self, faults: std::sync::Arc<crate::testing::Faults>) -> Self {
        self.faults = Some(faults);
        self
    }
}

/// Applies one `key=value` pair to `config`.
fn apply(config: &mut Config, pair: &str) -> Result<(), String> {
    let (key, value) = pair.split_once('=').ok_or("expected key=value")?;
    let (key, value) = (key.trim(), value.trim());
    match key {
        "cleaner_threads" => config.cleaner_threads = parse_count(value)?,
        "devices" => config.devices = Some(parse_count(value)?),
        "max_pooled_bytes" => config.max_pooled_bytes = parse_size(value)?,
        "thread_cache_bytes" => config.thread_cache_bytes = parse_size(value)?,
        "size_classes" => {
            config.size_classes = match value.to_ascii_lowercase().as_str() {
                "fine" => SizeClasses::Fine,
                "pow2" => SizeClasses::PowersOfTwo,
                _ => return Err("size_classes must be fine or pow2".into()),
            }
        }
        "backend" => {
            config.backend = match value.to_ascii_lowercase().as_str() {
                "auto" => BackendKind::Auto,
                "cuda" => BackendKind::Cuda,
                "host" => BackendKind::Host,
                _ => return Err("backend must be auto, cuda or host".into()),
            }
        }
        _ => return Err(format!("unknown key `{key}`")),
    }
    Ok(())
}

fn parse_count(value: &str) -> Result<usize, String> {
    value
        .parse()
        .map_err(|_| format!("`{value}` is not a count"))
}

/// A byte count with an optional `KiB`, `MiB` or `GiB` suffix.
fn parse_size(value: &str) -> Result<usize, String> {
    let (digits, shift) = [("KiB", 10), ("MiB", 20), ("GiB", 30)]
        .iter()
        .find_map(|(suffix, shift)| value.strip_suffix(suffix).map(|d| (d.trim(), *shift)))
        .unwrap_or((value, 0));
    let n: usize = digits
        .parse()
        .map_err(|_| format!("`{value}` is not a size"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("`{value}` is too large"))
}
