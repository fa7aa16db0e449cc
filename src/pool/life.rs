//! The pool's life cycle: reserve, flush, clear, shutdown, close, and the
//! reaper's side of a closed pool (see the parent module).

use crate::alloc::Block;
use crate::cleaner::late::Late;
use crate::cleaner::{self, Returned};
use crate::error::Error;
use crate::reaper::{self, Message, Retire};
use crate::stats::Counters;
use crate::sync::{Arc, Ordering};

use super::Shared;

impl Shared {
    /// Pins buffers ahead of demand; see [`Pool::reserve`](crate::Pool::reserve).
    pub(super) fn reserve(
        this: &Arc<Self>,
        device: usize,
        wanted: &[(usize, usize)],
    ) -> Result<(), Error> {
        if device >= this.shards.len() {
            return Err(Error::UnknownDevice {
                device,
                devices: this.shards.len(),
            });
        }
        let classes = this.classes();
        let mut plan = Vec::with_capacity(wanted.len());
        // In u128, so that no count overflows it (a footprint is at most
        // 2^40 bytes, a count below 2^64), and a cap of `usize::MAX` (no
        // cap) still bounds the reservation by the host's memory.
        let mut bytes = 0u128;
        for &(size, count) in wanted {
            let class = classes.class_for(size)?;
            bytes = bytes.saturating_add(classes.footprint(class) as u128 * count as u128);
            plan.push((class, count));
        }
        let memory = crate::alloc::host_memory();
        if bytes > u128::from(memory) {
            return Err(Error::ReserveExceedsMemory { bytes, memory });
        }
        // At most the host's memory: fits a usize.
        let bytes = bytes as usize;
        if let Err(cap) = this.admission.reserve_fits(this.places(), bytes) {
            return Err(Error::ReserveTooLarge { bytes, cap });
        }
        let past_budget = |bytes| Error::ReservePastPinnedBudget {
            bytes,
            pinned: this.counters().pinned() + this.counters().claimed(),
            budget: this.counters().max_pinned(),
        };
        if !this.counters().fits_pinned(bytes as u64) {
            return Err(past_budget(bytes));
        }
        let mut blocks = Vec::new();
        let generation = this.admission.reservations();
        for (class, mut count) in plan {
            let node = this.shards[device].node();
            // A sub-page class's block is the head of a slab that its
            // registration carves into up to `per_slab` buffers.
            let per_slab = classes.per_slab(class);
            while count > 0 {
                let buffers = count.min(per_slab);
                let mut block = Block::allocate_for(classes, class, device, node, buffers)?;
                let meta = block.meta_mut();
                meta.dirty = 0;
                meta.reserved = generation;
                blocks.push(block);
                count -= buffers;
            }
        }
        // Admitted against the pinned budget now, with every registration
        // under way and every other reserve not yet registered (the check
        // above only spares the mapping when it would fail), at what each
        // block's registration pins: its slab, or the region it grows (of
        // whole pages, huge ones from a huge page up), else its own
        // mapping. Each block carries its share of the admission until its
        // registration takes it over (see `Meta::reserve_share`), so that a
        // second reserve asked before this one registers sees the bytes
        // taken.
        if this.caches.intake.pins {
            let regions = this.shards[device].regions();
            let shares: Vec<u64> = blocks
                .iter()
                .map(|block| {
                    if this.caches.carves() && !block.in_slab() {
                        regions.fit_len(block.footprint()) as u64
                    } else {
                        block.region().1 as u64
                    }
                })
                .collect();
            let admitted: u64 = shares.iter().sum();
            if !this.counters().claim_pinned(admitted, false) {
                return Err(past_budget(admitted as usize));
            }
            for (block, share) in blocks.iter_mut().zip(shares) {
                block.meta_mut().reserve_share = share;
            }
        }
        // Room under a cap that follows the working set, before any of the
        // buffers can come back to it.
        this.admission.reserved(this.places(), bytes, generation);
        let cap = this.caches.cap();
        Self::start_cleaner(this);
        let orphan = this.caches.local().0.orphan();
        for mut block in blocks {
            orphan.open_ahead(&mut block);
            this.caches
                .intake
                .submit_ahead(orphan.origin(cap, false), block);
        }
        Ok(())
    }

    /// Blocks until every buffer dropped before the call is ready again or
    /// released, then until the growths of the regions under way at the
    /// call have ended (see `Regions::wait_for_growths`).
    pub(crate) fn flush(this: &Arc<Self>) {
        let started = std::time::Instant::now();
        Self::flush_untraced(this);
        if let Some(tracer) = &this.caches.trace {
            let took = started.elapsed().as_nanos() as u64;
            tracer.event(crate::trace::FLUSH, 0, 0, 0, took, 0);
        }
    }

    fn flush_untraced(this: &Arc<Self>) {
        // Growths under way now: waited for at the end (see
        // `Regions::wait_for_growths`).
        let begun: Vec<u64> = this
            .shards
            .iter()
            .map(|s| s.regions().growths_begun())
            .collect();
        Self::start_cleaner(this);
        this.caches.flush.wait(
            || this.caches.counts(),
            || {
                this.cleaner
                    .move_waiting(this.places(), this.caches.cap(), false);
                if !this.cleaner.is_running() {
                    Self::start_cleaner(this);
                }
                if !this.cleaner.is_running() {
                    // No worker could start (or one is being stopped by a
                    // shutdown): do the work here.
                    this.cleaner.drain_inline(this.env());
                }
            },
        );
        for (shard, begun) in this.shards.iter().zip(begun) {
            shard.regions().wait_for_growths(begun);
        }
    }

    /// Unregisters and frees every pooled buffer.
    pub(crate) fn clear(&self) {
        let blocks = self.admission.clear(self.places());
        if !blocks.is_empty() {
            tracing::debug!(buffers = blocks.len(), "pinpool: clearing the pool");
        }
        cleaner::release_all(self.releaser(), blocks);
        cleaner::release_regions(self.releaser(), &self.shards, |_, _| true, false);
    }

    /// As [`clear`](Self::clear), and every region goes too: at once if
    /// nothing is carved from it, else with its last buffer.
    fn clear_all(&self) {
        self.clear();
        cleaner::release_regions(self.releaser(), &self.shards, |_, _| true, true);
    }

    pub(crate) fn set_max_pinned_bytes(&self, bytes: usize) {
        let counters = self.counters();
        counters.set_max_pinned(bytes as u64);
        // Relaxed: a setting, read for reports only.
        self.budget_given.store(true, Ordering::Relaxed);
        // A cap that follows the working set stays within the budget.
        let evicted = self.admission.refollow(self.places());
        cleaner::release_all(self.releaser(), evicted);
        let over = counters.pinned().saturating_sub(bytes as u64);
        if over > 0 {
            let evicted = self.admission.shrink_by(self.places(), over as usize);
            cleaner::release_all(self.releaser(), evicted);
            cleaner::release_regions_over_budget(self.releaser(), &self.shards);
        }
    }

    pub(crate) fn set_max_pooled_bytes(&self, bytes: usize) {
        let evicted = self.admission.give_cap(self.places(), bytes);
        cleaner::release_all(self.releaser(), evicted);
        if self.caches.carves() {
            cleaner::fit_regions_to_cap(
                self.releaser(),
                &self.admission,
                self.places(),
                std::time::Duration::ZERO,
                std::time::Duration::ZERO,
                true,
                |_| 0,
            );
        }
    }

    pub(crate) fn shutdown(this: &Arc<Self>) {
        Self::flush(this);
        this.cleaner.stop();
        this.cleaner.drain_inline(this.env());
        this.clear_all();
    }

    /// Shuts down for good (the last handle is gone).
    pub(super) fn close(this: &Arc<Self>) {
        this.closed.store(true, Ordering::Relaxed);
        // From here on every drop goes to the reaper (whose channel keeps
        // what is sent before its thread starts, below).
        this.caches.close();
        this.cleaner.stop();
        this.cleaner.drain_inline(this.env());
        let mut returned: Vec<Block> = this
            .cleaner
            .take_parked()
            .into_iter()
            .map(Returned::into_block)
            .collect();
        for cache in this.caches.iter() {
            returned.extend(cache.take_returns());
            // Emptied by the drain above; a buffer still there waits with
            // the reaper like any other.
            returned.extend(cache.inbox().released.take_all());
        }
        let mut locked = this.caches.lock_out(this.caches.iter());
        locked.each(|cache, lists| returned.extend(lists.take_deferred(cache)));
        drop(locked);
        this.clear_all();
        // Buffers pinned ahead of demand were counted as drops without a
        // take: they count as taken too.
        let taken: u64 = this.caches.iter().map(|c| c.takes() + c.ahead()).sum();
        let dropped = crate::flush::drops(this.caches.counts());
        let outstanding = taken.saturating_sub(dropped);
        // Every close tries to start the reaper, so that one that could not
        // start earlier takes over what earlier closes left it.
        if let Some(tracer) = &this.caches.trace {
            tracer.finish();
        }
        let reaping = reaper::start(&*this.backend);
        if outstanding > 0 || !returned.is_empty() {
            if !reaping {
                tracing::error!(
                    outstanding,
                    returned = returned.len(),
                    "pinpool: a pool closed with buffers out, but could not start the reaper \
                     thread: the pool's state and those buffers are kept (leaked) until a \
                     later close starts it"
                );
            }
            reaper::send(Message::Closed {
                key: this.caches.intake.key(),
                pool: Box::new(Arc::clone(this)),
                outstanding,
                returned,
            });
        }
    }
}

impl Retire for Arc<Shared> {
    fn settled(&self, block: &mut Block) -> Result<bool, Error> {
        match self.cleaner.settle_late(block)? {
            Late::Settled => Ok(true),
            Late::Waiting => Ok(false),
            Late::NeedsSync(device, note) => {
                // Off the reaper's thread, so that one device's slow
                // synchronize holds up no other late buffer. Loom models run
                // the reaper inline and the synchronize with it.
                #[cfg(not(pinpool_loom))]
                {
                    let shared = Arc::clone(self);
                    let spawned = self.backend.spawn(
                        "pinpool-late-sync".into(),
                        Box::new(move || shared.cleaner.run_late_sync(shared.env(), device, note)),
                    );
                    if spawned.is_ok() {
                        return Ok(false);
                    }
                }
                self.cleaner.run_late_sync(self.env(), device, note);
                Ok(false)
            }
        }
    }

    fn retire(&self, mut block: Block) {
        let ticket = block.take_ticket();
        cleaner::release(self.releaser(), block);
        if let Some(ticket) = ticket {
            // No flush waits on a closed pool; the books stay balanced.
            ticket.close_quietly();
        }
    }

    fn abandon(&self, mut block: Block) {
        Counters::add(&self.counters().fence_failures, 1);
        block.fences_mut().abandon();
        let ticket = block.take_ticket();
        let leaked = block.leak();
        Counters::add(&self.counters().leaked_bytes, leaked as u64);
        if let Some(ticket) = ticket {
            ticket.close_quietly();
        }
    }
}
