//! Loom models of pinpool's buffer handoff protocol. They live in `tests/`
//! and run only with `RUSTFLAGS="--cfg loom"` (see the README). Each model
//! says in its docs the bug it catches; each was checked to fail on a
//! scratch mutation of the crate:
//!
//! | model | mutation it caught |
//! | --- | --- |
//! | `stack::pop_is_aba_safe` | head CAS without the generation tag |
//! | `stack::concurrent_push_pop_hands_out_each_value_once` | push publishing its slot with Relaxed instead of Release |
//! | `handoff::flushed_buffer_is_zeroed_and_ready` | `flush` not waiting for the in-flight count |
//! | `handoff::cross_thread_drop_returns_exactly_once` | `flush` not waiting for the in-flight count |
//! | `handoff::fence_gates_reuse` | fences read as always complete; `take` cleaning a buffer without checking its fences |
//! | `cleaner::chunked_buffer_is_completed_once` | admitting a buffer when one chunk is still left; zeroing a chunk after the buffer was admitted (loom reports the race on the buffer's bytes, which loom builds track per chunk) |
//! | `cleaner::cap_change_races_return` | the admission fast path checking the cap before adding the buffer |
//! | `cleaner::clear_races_owner_take` | `clear` not subtracting what it freed from the pooled estimate |
//! | `cleaner::drop_after_shutdown_restarts_the_cleaner` | a drop never waking a stopped cleaner |
//! | `cleaner::shutdown_races_drop_and_flush`, `steal_races_owner_take` (and every model) | buffers forgotten instead of freed (loom's leak check on tracked blocks) |
