//! Counters and the [`Stats`] snapshot.
//!
//! Hit and miss counts live in each thread's cache (written by its owner
//! alone) so the take path touches no shared line; everything else is
//! counted by the cleaner, off the fast path. All counters are Relaxed:
//! they publish nothing, and a snapshot is only as exact as the moment.

use std::time::Duration;

use crate::backend::BackendKind;
use crate::sync::{Ordering, StatCounter, StaticMutex};

/// Buckets of the drop-to-ready histogram: bucket `i` counts latencies in
/// `[2^i, 2^(i+1))` microseconds (bucket 0 also holds everything below 1 us).
const BUCKETS: usize = 32;

/// Counters written by the cleaner and slow paths.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) recycled: StatCounter,
    pub(crate) registrations: StatCounter,
    pub(crate) registered_bytes: StatCounter,
    pub(crate) unregistered_bytes: StatCounter,
    pub(crate) registration_nanos: StatCounter,
    pub(crate) registration_failures: StatCounter,
    pub(crate) registrations_skipped: StatCounter,
    pub(crate) zeroing_skipped: StatCounter,
    pub(crate) fence_failures: StatCounter,
    pub(crate) unregister_failures: StatCounter,
    pub(crate) released: StatCounter,
    pub(crate) leaked_bytes: StatCounter,
    pub(crate) worker_panics: StatCounter,
    pub(crate) bytes_zeroed: StatCounter,
    pub(crate) device_syncs: StatCounter,
    pub(crate) trimmed_bytes: StatCounter,
    pub(crate) regions_released: StatCounter,
    pub(crate) regions_drained: StatCounter,
    /// The most bytes registered at once.
    peak_pinned: StatCounter,
    /// The most bytes in use at once, as sampled (see `note_in_use`).
    peak_in_use: StatCounter,
    /// `u64::MAX` minus the pinned budget (`Config::max_pinned_bytes`), so
    /// that the zeroed default means no bound.
    budget_complement: StatCounter,
    /// Bytes of registrations under way, admitted against the budget (see
    /// [`claim_pinned`](Self::claim_pinned)); changed only under its lock,
    /// which also covers the registrations they settle into, so that two
    /// registrations admitted at once never pass the budget together.
    claimed: StaticMutex<u64>,
    /// The same bytes, for readers that must not take the lock (read
    /// Relaxed: see [`fits_pinned`](Self::fits_pinned)).
    claimed_hint: StatCounter,
    ready_latency: [StatCounter; BUCKETS],
}

impl Counters {
    /// Adds `n` to `counter`.
    #[inline]
    pub(crate) fn add(counter: &StatCounter, n: u64) {
        // Relaxed: statistics publish nothing.
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Bytes registered now.
    pub(crate) fn pinned(&self) -> u64 {
        let load = |c: &StatCounter| c.load(Ordering::Relaxed);
        load(&self.registered_bytes).saturating_sub(load(&self.unregistered_bytes))
    }

    /// Counts a registration of `bytes` and notes the pinned peak.
    pub(crate) fn registered(&self, bytes: u64) {
        Self::add(&self.registrations, 1);
        Self::add(&self.registered_bytes, bytes);
        self.peak_pinned.fetch_max(self.pinned(), Ordering::Relaxed);
    }

    /// The most bytes registered at once since the pool was built (or its
    /// peaks reset).
    pub(crate) fn peak_pinned(&self) -> u64 {
        self.peak_pinned.load(Ordering::Relaxed).max(self.pinned())
    }

    /// Restarts the pinned peak from the bytes pinned now.
    pub(crate) fn reset_peak_pinned(&self) {
        self.peak_pinned.store(self.pinned(), Ordering::Relaxed);
    }

    /// The pinned budget: the most bytes page-locked at once.
    pub(crate) fn max_pinned(&self) -> u64 {
        // Relaxed: a setting; a reader racing a change sees the old or the
        // new budget, which costs at most the registrations under way.
        u64::MAX - self.budget_complement.load(Ordering::Relaxed)
    }

    /// Sets the pinned budget.
    pub(crate) fn set_max_pinned(&self, bytes: u64) {
        self.budget_complement
            .store(u64::MAX - bytes, Ordering::Relaxed);
    }

    /// Whether `bytes` more can be page-locked under the budget now, the
    /// registrations under way included (a hint: a registration admitted
    /// or settled meanwhile may make either answer stale by its bytes;
    /// what is registered is admitted by [`claim_pinned`](Self::claim_pinned)).
    pub(crate) fn fits_pinned(&self, bytes: u64) -> bool {
        self.pinned_lack(bytes) == 0
    }

    /// The bytes by which `bytes` more would pass the budget now, the
    /// registrations under way included (a hint, as
    /// [`fits_pinned`](Self::fits_pinned)): 0 if they fit.
    pub(crate) fn pinned_lack(&self, bytes: u64) -> u64 {
        // Acquire pairs with the Release in `with_claimed`: a caller that
        // sees a growth's admission here also sees that growth begun
        // (`Regions::growth_begins` counts it before it claims), so a
        // flush after a miss freed for this answer waits for that growth.
        let claimed = self.claimed_hint.load(Ordering::Acquire);
        let wanted = self.pinned().saturating_add(claimed).saturating_add(bytes);
        wanted.saturating_sub(self.max_pinned())
    }

    /// Admits a registration of `bytes` against the pinned budget, with
    /// every registration under way: false (and nothing admitted) if they
    /// would pass it together, unless `past_budget` (bytes already
    /// registered that a growth moves into its own registration). Each
    /// admission is settled once by [`settle_pinned`](Self::settle_pinned).
    pub(crate) fn claim_pinned(&self, bytes: u64, past_budget: bool) -> bool {
        self.admit(0, bytes, past_budget)
    }

    /// Turns `held` bytes admitted earlier (memory `reserve` asked for,
    /// admitted when asked) into an admission of `bytes` for its
    /// registration, under one hold of the lock, so that no admission sees
    /// the reserve's bytes neither held nor claimed. What `bytes` exceeds
    /// `held` by is admitted within the budget: false (and nothing changed)
    /// if it has no room for it. Settled as a claim.
    pub(crate) fn take_over_pinned(&self, held: u64, bytes: u64) -> bool {
        self.admit(held, bytes, false)
    }

    /// The admission of [`claim_pinned`](Self::claim_pinned) and
    /// [`take_over_pinned`](Self::take_over_pinned): `held` bytes admitted
    /// earlier become `bytes`, the growth within the budget unless
    /// `past_budget`.
    fn admit(&self, held: u64, bytes: u64, past_budget: bool) -> bool {
        self.with_claimed(|claimed| {
            debug_assert!(*claimed >= held, "took over more than was held");
            let others = *claimed - held;
            let total = self.pinned().saturating_add(others).saturating_add(bytes);
            if !past_budget && bytes > held && total > self.max_pinned() {
                return false;
            }
            *claimed = others + bytes;
            true
        })
    }

    /// Bytes admitted to registrations under way (a statistic: Relaxed).
    pub(crate) fn claimed(&self) -> u64 {
        self.claimed_hint.load(Ordering::Relaxed)
    }

    /// Settles `claimed` bytes admitted by [`claim_pinned`](Self::claim_pinned),
    /// counting the registrations of `registered` bytes that they became,
    /// under the same lock: an admission never sees the bytes both
    /// claimed and registered missing from the count.
    pub(crate) fn settle_pinned(&self, claimed: u64, registered: &[u64]) {
        self.with_claimed(|held| {
            for &bytes in registered {
                self.registered(bytes);
            }
            debug_assert!(*held >= claimed, "settled more than was claimed");
            *held -= claimed;
        });
    }

    /// Runs `f` on the admitted bytes under their lock, then publishes
    /// them to [`fits_pinned`](Self::fits_pinned)'s lock-free hint.
    fn with_claimed<R>(&self, f: impl FnOnce(&mut u64) -> R) -> R {
        let mut claimed = self
            .claimed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let out = f(&mut claimed);
        // Release: publishes what the claimer did before (a growth counted
        // begun) to `fits_pinned`'s Acquire load; the lock orders the count.
        self.claimed_hint.store(*claimed, Ordering::Release);
        out
    }

    /// Notes `bytes` in use now (buffers taken and not yet dropped, at
    /// their class lengths) as a peak candidate. Sampled by the cleaner's
    /// provisioning tick and by snapshots: a burst shorter than a tick can
    /// be missed, so the peak errs low, never high.
    pub(crate) fn note_in_use(&self, bytes: u64) {
        self.peak_in_use.fetch_max(bytes, Ordering::Relaxed);
    }

    /// The most bytes in use at once as sampled, `now` included.
    pub(crate) fn peak_in_use(&self, now: u64) -> u64 {
        self.peak_in_use.fetch_max(now, Ordering::Relaxed).max(now)
    }

    /// Restarts the in-use peak from the bytes in use `now`.
    pub(crate) fn reset_peak_in_use(&self, now: u64) {
        self.peak_in_use.store(now, Ordering::Relaxed);
    }

    /// Forgets the drop-to-ready latencies recorded so far.
    pub(crate) fn reset_ready_latency(&self) {
        for bucket in &self.ready_latency {
            // Relaxed: statistics.
            bucket.store(0, Ordering::Relaxed);
        }
    }

    /// Records how long a buffer took from its drop to being ready again.
    pub(crate) fn record_ready(&self, latency: Duration) {
        let micros = latency.as_micros().max(1) as u64;
        let bucket = (63 - micros.leading_zeros() as usize).min(BUCKETS - 1);
        Self::add(&self.ready_latency[bucket], 1);
    }

    /// The upper edge of the bucket holding quantile `q` of drop-to-ready
    /// latency, or `None` before any buffer was recycled.
    fn ready_quantile(&self, q: f64) -> Option<Duration> {
        let counts: Vec<u64> = self
            .ready_latency
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (bucket, count) in counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(Duration::from_micros(2u64 << bucket));
            }
        }
        None
    }
}

/// Where a limit in force comes from (see [`Stats::max_pooled_bytes_from`]
/// and [`Stats::max_pinned_bytes_from`]).
///
/// # Examples
///
/// ```
/// use pinpool::LimitSource;
/// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
/// assert_eq!(pool.stats().max_pooled_bytes_from, LimitSource::Default);
/// pool.set_max_pooled_bytes(1 << 30);
/// assert_eq!(pool.stats().max_pooled_bytes_from, LimitSource::Given);
/// # Ok::<(), pinpool::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub enum LimitSource {
    /// The pool's default: for the cap on pooled bytes, following the
    /// working set; for the pinned budget, a share of the memory the
    /// process may use.
    #[default]
    Default,
    /// Given by the application (builder, conf text, or setter).
    Given,
}

/// A snapshot of a pool's state and history.
///
/// # Examples
///
/// ```
/// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
/// drop(pool.take(4096));
/// pool.flush();
/// let stats = pool.stats();
/// assert_eq!(stats.misses, 1);
/// assert_eq!(stats.pooled_buffers, 1);
/// # Ok::<(), pinpool::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Stats {
    /// The backend in use.
    pub backend: BackendKind,
    /// Devices served.
    pub devices: usize,
    /// Takes served from the pool.
    pub hits: u64,
    /// Takes that allocated a fresh (pageable) buffer.
    pub misses: u64,
    /// Bytes handed out by all takes, at their size classes (which round
    /// the requests up): a buffer borrowed from a larger class counts at
    /// that class's size, its capacity, as in [`in_use_bytes`] and
    /// [`ClassStats`].
    ///
    /// [`in_use_bytes`]: Self::in_use_bytes
    pub taken_bytes: u64,
    /// Of `hits`, takes served by an idle buffer of a larger class (see
    /// [`PoolBuilder::borrow_slack`](crate::PoolBuilder::borrow_slack)).
    pub borrowed: u64,
    /// Of `hits`, takes served by carving a buffer from a region's free
    /// extents (see [`regions`](Self::regions)).
    pub carved: u64,
    /// Takes that waited for the copies out of the calling thread's own
    /// earlier buffers to end before being served, or before missing (see
    /// [`Pool::take`](crate::Pool::take)): a thread running ahead of its
    /// copies. Each such take once, whether it waited on its oldest buffer,
    /// for as long as the pool's copies ended, or both.
    pub own_waits: u64,
    /// The time those takes waited, in all (both waits of a take that
    /// waited twice).
    pub own_wait_time: Duration,
    /// Regions listed (registrations that buffers are carved from, on the
    /// backends that pin; the `cuda` and fault-injecting ones).
    pub regions: usize,
    /// Bytes of those regions (pinned; buffers carved from them included).
    pub region_bytes: usize,
    /// Bytes of their free extents (pinned, all-zero, not carved), counted
    /// in `pooled_bytes` too.
    pub free_extent_bytes: usize,
    /// The largest free extent of any region.
    pub largest_free_extent: usize,
    /// Regions unregistered and freed (trimmed, drained, cleared, or shut
    /// down).
    pub regions_released: u64,
    /// Regions drained: taken out of use because their device's regions
    /// held more than half as much again as the most its buffers had in use
    /// (or carved) at once over the idle-trim time, and released once
    /// wholly free (at once, if nothing was carved from them); a drain
    /// that a buffer keeps from ending (held for good, reserved) is given
    /// up after the idle-trim time, and the region carved from again (see
    /// [`PoolBuilder::idle_trim`](crate::PoolBuilder::idle_trim)).
    pub regions_drained: u64,
    /// Bytes of ready buffers (footprints: whole pages, or a sub-page
    /// buffer's share of its slab), thread caches included, and of the
    /// regions' free extents: what the cap bounds (a cap that follows the
    /// working set leaves up to an eighth of itself past it in wholly free
    /// regions while idle trimming is on: see
    /// [`PoolBuilder::regions`](crate::PoolBuilder::regions)).
    pub pooled_bytes: usize,
    /// Ready buffers, thread caches included: each counted once while no
    /// take runs (the cleaner's own moves between caches and shards hold
    /// the count off); a take moving buffers meanwhile can leave it off
    /// by those buffers.
    pub pooled_buffers: usize,
    /// The most pooled bytes seen (sampled at admissions past the cap's
    /// fast path, evictions and snapshots).
    pub peak_pooled_bytes: usize,
    /// The cap on pooled bytes in force now.
    pub max_pooled_bytes: usize,
    /// Where that cap comes from: [`LimitSource::Default`] while it follows
    /// the working set (see
    /// [`PoolBuilder::max_pooled_bytes`](crate::PoolBuilder::max_pooled_bytes)),
    /// [`LimitSource::Given`] once one is set.
    pub max_pooled_bytes_from: LimitSource,
    /// Buffers dropped, or pinned ahead of demand (by `reserve` or by
    /// provisioning, which may run after a flush returns), and not yet made
    /// ready or released.
    pub in_cleaner: usize,
    /// Buffers made ready by the cleaner (dropped ones again, and those
    /// pinned ahead of demand by `reserve` or provisioning), or by a taker
    /// cleaning a small dirty buffer of its own instead of missing.
    pub recycled: u64,
    /// Of `recycled`, the buffers takers cleaned themselves (their
    /// drop-to-ready latency is not in the percentiles below).
    pub cleaned_by_takers: u64,
    /// Successful registrations (page-locking): of regions (a growth that
    /// folds wholly free regions into one registers them again, counted
    /// again), of slabs, and, with regions off, of buffers on their first
    /// trip through the cleaner.
    pub registrations: u64,
    /// Bytes page-locked by those registrations.
    pub registered_bytes: u64,
    /// Bytes page-locked now: registered and not yet unregistered, wherever
    /// the buffers are (pooled, taken, or in the cleaner).
    pub pinned_bytes: u64,
    /// The most bytes page-locked at once (see [`Pool::reset_peaks`]).
    ///
    /// [`Pool::reset_peaks`]: crate::Pool::reset_peaks
    pub peak_pinned_bytes: u64,
    /// The pinned budget (`u64::MAX`: no bound); see
    /// [`PoolBuilder::max_pinned_bytes`](crate::PoolBuilder::max_pinned_bytes).
    pub max_pinned_bytes: u64,
    /// Where the budget comes from: [`LimitSource::Default`] for a quarter
    /// of the memory the process may use, [`LimitSource::Given`] once one
    /// is set.
    pub max_pinned_bytes_from: LimitSource,
    /// Bytes of buffers taken and not yet dropped, at the lengths handed
    /// out (their size classes; a borrowed buffer at its own class's).
    pub in_use_bytes: u64,
    /// The most bytes in use at once (see [`Pool::reset_peaks`]), as
    /// sampled: by the cleaner every 10 ms while the pool is in use, and by
    /// every snapshot. A burst shorter than that may be missed, so this
    /// errs low: `peak_pinned_bytes / peak_in_use_bytes` errs high.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// let a = pool.take(1 << 20);
    /// let b = pool.take(4096);
    /// let stats = pool.stats();
    /// assert_eq!(stats.in_use_bytes, (1 << 20) + 4096);
    /// drop((a, b));
    /// pool.flush();
    /// let stats = pool.stats();
    /// assert_eq!((stats.in_use_bytes, stats.peak_in_use_bytes), (0, (1 << 20) + 4096));
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    ///
    /// [`Pool::reset_peaks`]: crate::Pool::reset_peaks
    pub peak_in_use_bytes: u64,
    /// Footprint bytes of idle buffers freed by idle trimming or
    /// [`Pool::trim`](crate::Pool::trim) (a slab's page goes back to the OS
    /// with its last buffer).
    pub trimmed_bytes: u64,
    /// Time spent in those registrations.
    pub registration_time: Duration,
    /// Registrations that failed (a buffer's: it was freed instead of
    /// pooled; a region's: its mapping was freed, and it is retried
    /// smaller).
    pub registration_failures: u64,
    /// Miss buffers freed unregistered because registrations were backed up
    /// or the pinned budget was spent, and region growths the budget
    /// refused.
    pub registrations_skipped: u64,
    /// Fence waits or device synchronizes that failed (the buffer was
    /// leaked).
    pub fence_failures: u64,
    /// Unregistrations that failed (the buffer was leaked).
    pub unregister_failures: u64,
    /// Bytes leaked on purpose: buffers whose copies were not known to have
    /// finished (a failed fence or device synchronize, a failed
    /// unregistration, a cleaner job that panicked) are never unregistered
    /// or unmapped.
    pub leaked_bytes: u64,
    /// Dropped buffers freed instead of re-zeroed because the cleaner's
    /// recycling backlog (bytes to zero, or buffers queued) was full: freed
    /// by their droppers if pageable, released in bulk by the cleaner if
    /// pinned.
    pub zeroing_skipped: u64,
    /// Device synchronizes run for pinned buffers dropped without events.
    pub device_syncs: u64,
    /// Buffers freed rather than pooled (evictions and failures included).
    pub released: u64,
    /// Pooled buffers evicted to respect the cap.
    pub evictions: u64,
    /// Bytes the cleaner re-zeroed (takers re-zeroing their own small
    /// buffers are counted in `cleaned_by_takers`, not here).
    pub bytes_zeroed: u64,
    /// Cleaner jobs that panicked (their buffers were released; the worker
    /// carried on).
    pub worker_panics: u64,
    /// Median drop-to-ready latency of the buffers the cleaner made ready
    /// (upper edge of a power-of-two bucket), since the pool was built or
    /// [`Pool::reset_peaks`](crate::Pool::reset_peaks); buffers re-zeroed
    /// by their takers are ready once their copies end and are not timed.
    pub drop_to_ready_p50: Option<Duration>,
    /// 99th-percentile drop-to-ready latency (upper edge of its bucket).
    pub drop_to_ready_p99: Option<Duration>,
    /// Ready buffers per device (thread caches included).
    pub per_device: Vec<DeviceStats>,
    /// Ready buffers and misses per size class (classes with neither are
    /// left out).
    pub per_class: Vec<ClassStats>,
}

/// One device's share of the pool, in a [`Stats`] snapshot.
///
/// # Examples
///
/// ```
/// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).devices(2).build()?;
/// drop(pool.take_on(1, 4096)?);
/// pool.flush();
/// assert_eq!(pool.stats().per_device[1].pooled_buffers, 1);
/// # Ok::<(), pinpool::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct DeviceStats {
    /// The device.
    pub device: usize,
    /// Ready buffers of the device.
    pub pooled_buffers: usize,
    /// Their footprint bytes, and the free extents of the device's regions
    /// (as [`Stats::pooled_bytes`] counts them).
    pub pooled_bytes: usize,
    /// Takes on the device served from the pool.
    pub hits: u64,
    /// Takes on the device that allocated.
    pub misses: u64,
}

/// One size class, in a [`Stats`] snapshot.
///
/// # Examples
///
/// ```
/// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
/// drop(pool.take(4096));
/// pool.flush();
/// let class = &pool.stats().per_class[0];
/// assert_eq!((class.size, class.pooled_buffers, class.misses), (4096, 1, 1));
/// # Ok::<(), pinpool::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ClassStats {
    /// The class's buffer size in bytes.
    pub size: usize,
    /// Ready buffers of the class, all devices.
    pub pooled_buffers: usize,
    /// Takes served from the pool by a buffer of the class: a take
    /// served by borrowing a buffer of a larger class (see
    /// [`Stats::borrowed`]) counts in the class that lent it.
    pub hits: u64,
    /// Takes of the class that allocated.
    pub misses: u64,
}

impl Stats {
    /// How the cap in force came about, for display.
    fn cap_note(&self) -> &'static str {
        match self.max_pooled_bytes_from {
            LimitSource::Default => " (following the working set)",
            LimitSource::Given => "",
        }
    }

    /// Fraction of takes served from the pool (1.0 before any take).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// drop(pool.take(4096));
    /// pool.flush();
    /// drop(pool.take(4096));
    /// assert_eq!(pool.stats().hit_rate(), 0.5);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn hit_rate(&self) -> f64 {
        let takes = self.hits + self.misses;
        if takes == 0 {
            1.0
        } else {
            self.hits as f64 / takes as f64
        }
    }

    pub(crate) fn fill_from(&mut self, c: &Counters) {
        let load = |counter: &StatCounter| counter.load(Ordering::Relaxed);
        self.recycled += load(&c.recycled);
        self.registrations = load(&c.registrations);
        self.registered_bytes = load(&c.registered_bytes);
        self.pinned_bytes = c.pinned();
        self.peak_pinned_bytes = c.peak_pinned();
        self.max_pinned_bytes = c.max_pinned();
        self.trimmed_bytes = load(&c.trimmed_bytes);
        self.regions_released = load(&c.regions_released);
        self.regions_drained = load(&c.regions_drained);
        self.registration_time = Duration::from_nanos(load(&c.registration_nanos));
        self.registration_failures = load(&c.registration_failures);
        self.fence_failures = load(&c.fence_failures);
        self.registrations_skipped = load(&c.registrations_skipped);
        self.zeroing_skipped = load(&c.zeroing_skipped);
        self.unregister_failures = load(&c.unregister_failures);
        self.leaked_bytes = load(&c.leaked_bytes);
        self.device_syncs = load(&c.device_syncs);
        self.released = load(&c.released);
        self.bytes_zeroed = load(&c.bytes_zeroed);
        self.worker_panics = load(&c.worker_panics);
        self.drop_to_ready_p50 = c.ready_quantile(0.5);
        self.drop_to_ready_p99 = c.ready_quantile(0.99);
    }
}

/// Bytes in binary units (`1.5 GiB`).
pub(crate) struct Bytes(pub(crate) u64);

impl std::fmt::Display for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut value = self.0 as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        if unit == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{value:.1} {}", UNITS[unit])
        }
    }
}

/// The pinned budget for display: `unlimited` for no bound.
struct Budget(u64);

impl std::fmt::Display for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0 == u64::MAX {
            f.write_str("unlimited")
        } else {
            Bytes(self.0).fmt(f)
        }
    }
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(
        || "-".to_string(),
        |d| format!("{:.3} ms", d.as_secs_f64() * 1e3),
    )
}

impl std::fmt::Display for Stats {
    /// One line with `{}`; a table with `{:#}`.
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// drop(pool.take(4096));
    /// pool.flush();
    /// let line = format!("{}", pool.stats());
    /// assert!(line.contains("1 misses") && !line.contains('\n'));
    /// assert!(format!("{:#}", pool.stats()).lines().count() > 5);
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !f.alternate() {
            return write!(
                f,
                "pinpool ({}, {} device(s)): {} hits, {} misses ({:.2}% hits), {} pooled of {}{}, {} pinned, {} in the cleaner, drop-to-ready p99 {}",
                self.backend,
                self.devices,
                self.hits,
                self.misses,
                self.hit_rate() * 100.0,
                Bytes(self.pooled_bytes as u64),
                Bytes(self.max_pooled_bytes as u64),
                self.cap_note(),
                Bytes(self.pinned_bytes),
                self.in_cleaner,
                ms(self.drop_to_ready_p99),
            );
        }
        writeln!(
            f,
            "pinpool ({} backend, {} device(s))",
            self.backend, self.devices
        )?;
        writeln!(
            f,
            "  takes          {:>12} hits {:>12} misses  ({:.2}% hits), {} handed out",
            self.hits,
            self.misses,
            self.hit_rate() * 100.0,
            Bytes(self.taken_bytes)
        )?;
        writeln!(
            f,
            "  pooled         {:>12} buffers, {} of {}{} (peak {})",
            self.pooled_buffers,
            Bytes(self.pooled_bytes as u64),
            Bytes(self.max_pooled_bytes as u64),
            self.cap_note(),
            Bytes(self.peak_pooled_bytes as u64)
        )?;
        writeln!(
            f,
            "  own waits      {:>12} ({:.3} s)",
            self.own_waits,
            self.own_wait_time.as_secs_f64()
        )?;
        writeln!(f, "  in cleaner     {:>12}", self.in_cleaner)?;
        writeln!(
            f,
            "  recycled       {:>12} ({} by takers), {} zeroed by the cleaner",
            self.recycled,
            self.cleaned_by_takers,
            Bytes(self.bytes_zeroed)
        )?;
        writeln!(
            f,
            "  in use         {:>12} (peak {})",
            Bytes(self.in_use_bytes),
            Bytes(self.peak_in_use_bytes)
        )?;
        writeln!(
            f,
            "  registrations  {:>12} ({}, {:.3} s), {} pinned now (peak {}, budget {}{}), {} trimmed",
            self.registrations,
            Bytes(self.registered_bytes),
            self.registration_time.as_secs_f64(),
            Bytes(self.pinned_bytes),
            Bytes(self.peak_pinned_bytes),
            Budget(self.max_pinned_bytes),
            match self.max_pinned_bytes_from {
                LimitSource::Default => " by default",
                LimitSource::Given => "",
            },
            Bytes(self.trimmed_bytes)
        )?;
        writeln!(
            f,
            "  drop-to-ready  p50 {} p99 {}",
            ms(self.drop_to_ready_p50),
            ms(self.drop_to_ready_p99)
        )?;
        writeln!(
            f,
            "  released       {:>12} ({} evictions, {} device synchronizes)",
            self.released, self.evictions, self.device_syncs
        )?;
        for d in &self.per_device {
            writeln!(
                f,
                "  device {:<7} {:>12} buffers, {}, {} hits, {} misses",
                d.device,
                d.pooled_buffers,
                Bytes(d.pooled_bytes as u64),
                d.hits,
                d.misses
            )?;
        }
        for c in &self.per_class {
            writeln!(
                f,
                "  class {:>10} {:>8} pooled {:>10} hits {:>8} misses",
                Bytes(c.size as u64).to_string(),
                c.pooled_buffers,
                c.hits,
                c.misses
            )?;
        }
        write!(
            f,
            "  failures       registration {} skipped {} zeroing skipped {} fence {} unregister {} panics {}, {} leaked",
            self.registration_failures,
            self.registrations_skipped,
            self.zeroing_skipped,
            self.fence_failures,
            self.unregister_failures,
            self.worker_panics,
            Bytes(self.leaked_bytes)
        )
    }
}

#[cfg(feature = "metrics")]
impl Stats {
    /// Reports the snapshot through the `metrics` crate's facade (the
    /// `metrics` feature): counters for the running totals and gauges for
    /// the levels, named `pinpool_*`, labelled with the backend. Call it
    /// periodically (or from a scrape hook) with a fresh [`Pool::stats`].
    ///
    /// [`Pool::stats`]: crate::Pool::stats
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = pinpool::Pool::builder().backend(pinpool::BackendKind::Host).build()?;
    /// pool.stats().record_metrics(); // a no-op without an installed recorder
    /// # Ok::<(), pinpool::Error>(())
    /// ```
    pub fn record_metrics(&self) {
        let backend = self.backend.to_string();
        let counters: [(&'static str, u64); 10] = [
            ("pinpool_hits_total", self.hits),
            ("pinpool_misses_total", self.misses),
            ("pinpool_taken_bytes_total", self.taken_bytes),
            ("pinpool_recycled_total", self.recycled),
            ("pinpool_registrations_total", self.registrations),
            ("pinpool_registered_bytes_total", self.registered_bytes),
            ("pinpool_evictions_total", self.evictions),
            ("pinpool_trimmed_bytes_total", self.trimmed_bytes),
            ("pinpool_leaked_bytes_total", self.leaked_bytes),
            ("pinpool_fence_failures_total", self.fence_failures),
        ];
        for (name, value) in counters {
            metrics::counter!(name, "backend" => backend.clone()).absolute(value);
        }
        let gauges: [(&'static str, f64); 8] = [
            ("pinpool_in_use_bytes", self.in_use_bytes as f64),
            ("pinpool_peak_in_use_bytes", self.peak_in_use_bytes as f64),
            ("pinpool_pooled_bytes", self.pooled_bytes as f64),
            ("pinpool_pooled_buffers", self.pooled_buffers as f64),
            ("pinpool_max_pooled_bytes", self.max_pooled_bytes as f64),
            ("pinpool_pinned_bytes", self.pinned_bytes as f64),
            ("pinpool_peak_pinned_bytes", self.peak_pinned_bytes as f64),
            ("pinpool_in_cleaner", self.in_cleaner as f64),
        ];
        for (name, value) in gauges {
            metrics::gauge!(name, "backend" => backend.clone()).set(value);
        }
        if let Some(p99) = self.drop_to_ready_p99 {
            metrics::gauge!("pinpool_drop_to_ready_p99_seconds", "backend" => backend)
                .set(p99.as_secs_f64());
        }
    }
}
