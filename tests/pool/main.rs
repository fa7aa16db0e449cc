//! The pool's behaviour through its public API, one module per behaviour.
//! One test binary: the modules link once. Tests of process-wide state
//! (the global pool, the reaper, the process's threads and memory, what a
//! panic or a failed thread start does to the process) run alone in a
//! child process (`common::in_child`). Modules that need the
//! fault-injecting backend build only with the `testing` feature.

#[path = "../common/mod.rs"]
mod common;

#[cfg(all(feature = "allocator-api2", feature = "testing"))]
mod allocator;
#[cfg(all(feature = "allocator-api2", feature = "testing"))]
mod allocator_edges;
mod backlog;
mod borrowing;
mod cap;
mod close;
mod config;
mod defaults;
#[cfg(feature = "testing")]
mod device_sync;
mod devices;
#[cfg(feature = "testing")]
mod draining;
mod drops;
mod exited_threads;
mod fast_path;
#[cfg(feature = "testing")]
mod faults;
#[cfg(feature = "testing")]
mod fences;
mod flush;
mod global;
#[cfg(feature = "testing")]
mod inline_cleaning;
#[cfg(feature = "testing")]
mod lanes;
mod lifecycle;
#[cfg(feature = "testing")]
mod merges;
#[cfg(feature = "testing")]
mod own_wait_stats;
#[cfg(feature = "testing")]
mod own_waits;
#[cfg(feature = "testing")]
mod pinned_budget;
mod provision;
#[cfg(feature = "testing")]
mod reaper;
#[cfg(feature = "testing")]
mod regions;
#[cfg(feature = "testing")]
mod reservations;
mod sizes;
#[cfg(feature = "testing")]
mod slabs;
mod stats;
mod stress;
mod teardown;
#[cfg(feature = "testing")]
mod thread_starts;
mod trace;
mod views;
#[cfg(feature = "testing")]
mod working_set;
mod zeroing;
