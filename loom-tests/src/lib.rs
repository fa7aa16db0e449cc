//! Loom models of pinpool's buffer handoff protocol. They live in `tests/`
//! and run only with `RUSTFLAGS="--cfg loom"` (see the README). Each model
//! says in its docs the bug it catches; each was checked to fail on a
//! scratch mutation of the crate:
//!
//! | model | mutation it caught | how it failed |
//! | --- | --- | --- |
//! | `stack::pop_is_aba_safe` | head CAS without the generation tag | failed when the model was written |
//! | `stack::concurrent_push_pop_hands_out_each_value_once` | push publishing its slot with Relaxed instead of Release | failed when the model was written |
//! | `handoff::flushed_buffer_is_zeroed_and_ready` | counting a buffer's completion before admitting it | the pooled buffer was not the one taken |
//! | `handoff::flushed_buffer_is_zeroed_and_ready` | the cleaner dropping a finished buffer's flush ticket instead of closing it | a flush ticket was dropped without being closed (tickets panic so under loom) |
//! | `handoff::cross_thread_drop_returns_exactly_once` | a buffer on the owner's returns list collected as ready (not re-zeroed) | handed out before re-zeroing |
//! | `handoff::fence_gates_reuse` | fences read as always complete | reused before its fence completed |
//! | `thread_cache::steal_races_owner_take` | the owner not checking for a thief's request | concurrent writes to the lists |
//! | `thread_cache::clear_races_owner_take` | `clear` not subtracting what it freed from the pooled estimate | pooled bytes after clear |
//! | `thread_cache::flush_moves_deferred_buffers_while_the_owner_works` | the light barrier without its fence | concurrent writes to the lists |
//! | `thread_cache::borrow_races_another_threads_take_of_the_larger_class` | a borrow from the owner's ready list that leaves the list's count alone | the borrowed buffer went back to another class (count 3, want 2) |
//! | `thread_cache::flush_reaches_an_exited_threads_cache` | a flush that skips the caches' deferred buffers | concurrent access to a buffer |
//! | `flush::flush_waits_for_an_earlier_drop_despite_a_racing_flush` | `flush` draining only one parity | flush returned early |
//! | `flush::two_racing_flushes_both_return_and_see_earlier_drops` | flushes not serialized | does not finish (over 60 s at two preemptions, against 1.9 s unmutated) |
//! | `cap::cap_lowered_to_zero_racing_a_return_pools_nothing` | admission not re-reading a cap lowered during it; the setter without its fence | pooled above a cap of 0 (both seen again at one preemption) |
//! | `cap::cap_below_one_buffer_racing_returns_pools_nothing` | admission not re-reading a cap lowered during it; the setter without its fence; eviction not subtracting what it evicted from the estimate | a buffer larger than the cap was pooled; accounting drifted (all three at two preemptions) |
//! | `cap::cap_change_races_return` | the admission fast path checking the cap before adding the buffer | accounting drifted (when written; re-applied on 2026-12-06 as a load before the add, it passed at two and three preemptions: see the model's docs) |
//! | `shutdown::close_races_a_drop` | a remote drop without the fence of its handshake with `close` | a buffer leaked (loom's leak check) |
//! | `cleaner::chunked_buffer_is_completed_once` | the chunk countdown with Relaxed instead of AcqRel | causality violation on the buffer's bytes |
//! | `cleaner::miss_buffer_is_registered_once_and_unregistered_at_shutdown` | release without unregistering; a recycled buffer's flush ticket closed before its admission | shutdown left it registered; the miss buffer came back unregistered (both at one preemption) |
//! | `cleaner::a_slab_is_unregistered_once_after_both_of_its_buffers` | a slab's share count decremented by a load and a store | the slab was not unregistered (0 calls); seen again at two preemptions once the model ran without a worker |
//! | `cleaner::event_less_pinned_buffers_wait_for_a_later_synchronize` | no device synchronize for event-less pinned buffers | unregistered before a synchronize; at one preemption, reused without a device synchronize |
//! | `thread_cache::trim_races_a_take_of_the_buffer_it_would_release` | trim not subtracting what it released from the pooled estimate; a remote list's take-all as a load and a store instead of a swap | pooled bytes drifted (4096, want 0); the process crashed (SIGSEGV) on the buffer both handed out and trimmed |
//! | `thread_cache::a_dying_thread_never_owns_the_cache_a_new_thread_inherits` | `current_index` without its `DEAD` check (a dying thread's old index honoured after its guard) | concurrent write accesses to the lists' `UnsafeCell` |
//! | `shutdown::a_reserved_buffer_dropped_racing_the_close` | the close counting the buffers out without the reserved ones (`takes()` without `injected()`) | the late drop waited for a pool already freed (loom: maximum branches exceeded) |
//! | `shutdown::a_late_drop_waits_for_a_reaper_that_a_later_close_starts` | a message sent while no reaper runs dropped; a reaper that starts without taking over the queued messages | the closed pool's state freed with a buffer out; the late drop waited forever (maximum branches exceeded) |
//! | `regions::a_give_back_races_a_carve_from_the_same_region` | a carve that splits its extent without taking the carved part out of the free extents | carved over written bytes (the new buffer lay on the live one) |
//! | `regions::a_trim_races_a_carve_from_the_region_it_releases` | unlisting (and so releasing) a region with a buffer still carved from it | the model crashed (SIGSEGV: the freed region was used by the give-back) |
//! | `regions::a_trim_races_the_last_give_back_of_a_region` | a give-back that marks its region wholly free (its last block back) before it returns the block's extent, under two holds of the region's lock | the model crashed (SIGSEGV: the trim released the region between the two, and the give-back wrote into it) |
//!
//! Three mutations went unnoticed, all equivalent: `shutdown_races_drop_and_flush`
//! with a flush that no longer drains inline when no worker runs (the flush
//! restarts the cleaner first, so a worker always drains),
//! `drop_after_shutdown_comes_back_on_flush` with a flush that does not
//! restart the cleaner (a drop after shutdown restarts it itself), and
//! `cap_below_one_buffer_racing_returns_pools_nothing` with admission
//! without the buffer-larger-than-the-cap check (at three preemptions as at
//! two: the slow path then evicts everything, and its second check of the
//! estimate releases the buffer anyway).
