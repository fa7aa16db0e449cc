//! The statistics snapshot (see [`Stats`]).

use std::time::Duration;

use crate::size_class::SizeClass;
use crate::stats::{ClassStats, DeviceStats, Stats};

use super::Shared;

impl Shared {
    pub(super) fn stats(&self) -> Stats {
        let classes = self.classes();
        let devices = self.shards.len();
        let count = classes.count();
        let mut stats = Stats {
            backend: self.backend.kind(),
            devices,
            ..Stats::default()
        };
        let mut pooled = vec![0usize; devices * count];
        // Caches are read before shards: no sweep, trim or eviction may
        // move a buffer from one to the other in between.
        let moves = self.caches.no_moves();
        let mut hits = vec![0u64; devices * count];
        let mut misses = vec![0u64; devices * count];
        for cache in self.caches.iter() {
            for (slot, n) in pooled.iter_mut().enumerate() {
                *n += cache.ready_in(slot) as usize;
                let (h, m) = cache.hits_misses(slot);
                hits[slot] += h;
                misses[slot] += m;
            }
            stats.cleaned_by_takers += cache.cleaned();
            stats.borrowed += cache.borrowed();
            stats.carved += cache.carved();
            let (waits, nanos) = cache.own_waits();
            stats.own_waits += waits;
            stats.own_wait_time += Duration::from_nanos(nanos);
        }
        for (device, shard) in self.shards.iter().enumerate() {
            for class in classes.all() {
                pooled[classes.slot(device, class)] += shard.len(class);
            }
        }
        drop(moves);
        let mut free_on = Vec::with_capacity(devices);
        for shard in self.shards.iter() {
            let figures = shard.regions().figures();
            free_on.push(figures.free);
            stats.regions += figures.regions;
            stats.region_bytes += figures.bytes;
            stats.free_extent_bytes += figures.free;
            stats.largest_free_extent = stats.largest_free_extent.max(figures.largest_free);
        }
        stats.hits = hits.iter().sum();
        stats.misses = misses.iter().sum();
        stats.taken_bytes = (0..devices * count)
            .map(|slot| {
                (hits[slot] + misses[slot]) * classes.size(SizeClass::at(slot % count)) as u64
            })
            .sum();
        let by_device = |v: &[u64], d: usize| v[d * count..(d + 1) * count].iter().sum::<u64>();
        let by_class =
            |v: &[u64], c: SizeClass| (0..devices).map(|d| v[classes.slot(d, c)]).sum::<u64>();
        stats.pooled_buffers = pooled.iter().sum();
        stats.per_device = (0..devices)
            .map(|device| {
                let slots = &pooled[device * count..(device + 1) * count];
                DeviceStats {
                    device,
                    pooled_buffers: slots.iter().sum(),
                    // Free extents are pooled bytes too, as in the total.
                    pooled_bytes: classes
                        .all()
                        .map(|c| slots[c.index()] * classes.footprint(c))
                        .sum::<usize>()
                        + free_on[device],
                    hits: by_device(&hits, device),
                    misses: by_device(&misses, device),
                }
            })
            .collect();
        stats.per_class = classes
            .all()
            .map(|class| ClassStats {
                size: classes.size(class),
                pooled_buffers: (0..devices).map(|d| pooled[classes.slot(d, class)]).sum(),
                hits: by_class(&hits, class),
                misses: by_class(&misses, class),
            })
            .filter(|c| c.pooled_buffers > 0 || c.hits > 0 || c.misses > 0)
            .collect();
        let places = self.places();
        // Free extents are pooled bytes too (see `cleaner::fit_regions_to_cap`).
        stats.pooled_bytes = self.admission.pooled_bytes(places) + stats.free_extent_bytes;
        stats.peak_pooled_bytes = self.admission.peak(places).max(stats.pooled_bytes);
        let (cap, follows) = self.admission.cap_and_follows(self.places());
        stats.max_pooled_bytes = cap;
        let from = |given| {
            if given {
                crate::stats::LimitSource::Given
            } else {
                crate::stats::LimitSource::Default
            }
        };
        stats.max_pooled_bytes_from = from(!follows);
        // Relaxed: a setting.
        stats.max_pinned_bytes_from = from(self.budget_given.load(crate::sync::Ordering::Relaxed));
        stats.in_cleaner = crate::flush::in_flight(self.caches.counts()) as usize;
        stats.evictions = self.admission.evictions() as u64;
        stats.recycled = stats.cleaned_by_takers;
        stats.fill_from(self.counters());
        stats.in_use_bytes = self.in_use_bytes();
        stats.peak_in_use_bytes = self.counters().peak_in_use(stats.in_use_bytes);
        stats
    }

    /// Bytes of buffers taken and not yet dropped, at their class lengths
    /// (a racing read may be off by the takes and drops under way).
    pub(super) fn in_use_bytes(&self) -> u64 {
        let classes = self.classes();
        let count = classes.count();
        let slots = self.shards.len() * count;
        self.caches
            .iter()
            .map(|cache| {
                (0..slots)
                    .map(|slot| {
                        cache.in_use(slot) * classes.size(SizeClass::at(slot % count)) as u64
                    })
                    .sum::<u64>()
            })
            .sum()
    }
}
