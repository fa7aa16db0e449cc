//! Traces of a pool's takes, drops and own events, and reading them back.
//!
//! A pool built with a trace path ([`PoolBuilder::trace`], the `trace`
//! conf key, or the `PINPOOL_TRACE` environment variable read by
//! [`PoolBuilder::from_env`]) records every take and drop, and its own
//! events (registrations and unregistrations, evictions, trims, flushes),
//! into a file. Each thread writes its records into a buffer of its own
//! (no lock, no system call; the time is a clock of the trace's that a
//! thread of its advances every millisecond, so times are whole
//! milliseconds, and records of one thread keep the order they were
//! written in); a background thread of the pool moves them to the file
//! every few milliseconds. A full buffer drops records and
//! counts them (a [`Record::Lost`]): tracing never blocks a take or a drop.
//! When the pool closes (its last handle is dropped), or when the process
//! exits for a pool that never closes (the global pool), the buffers taken
//! and never dropped are written as [`Record::Outstanding`], then a
//! [`Record::End`]. Two pools of one process never write one file: a
//! strict build fails, and a path from `PINPOOL_TRACE` goes to the first
//! free `PATH.2`, `PATH.3`, ... with a warning.
//!
//! [`PoolBuilder::trace`]: crate::PoolBuilder::trace
//! [`PoolBuilder::from_env`]: crate::PoolBuilder::from_env
//!
//! # The format (version 2)
//!
//! All integers are little-endian.
//!
//! | offset | bytes | what |
//! | --- | --- | --- |
//! | 0 | 8 | the magic `PINPOOLT` |
//! | 8 | 4 | the version, 2 (a reader reads 1 too: a version 1 file has no unregistrations) |
//! | 12 | 4 | the header's length `n`, at most 1 MiB |
//! | 16 | `n` | the header: UTF-8 lines `key=value`, each ending with a newline (the crate's version as `pinpool`, the pool's settings as `setting.KEY` in the `PINPOOL_CONF` syntax, and the machine: `host`, `os`, `arch`, `cores`, `cpu` (the processor's model name, where the system gives one), `memory_bytes` (the host's `MemTotal`, where readable), `clock`, `devices`, `backend`, `gpu.N` (device N's name, on the CUDA backend), `started_unix_ms`) |
//! | 16 + `n` | 48 each | records |
//!
//! A record is six 64-bit words:
//!
//! | word | what |
//! | --- | --- |
//! | 0 | byte 0: the kind; byte 1: flags; bytes 2-3: the device; bytes 4-7: zero |
//! | 1 | the time, nanoseconds since the trace began (whole milliseconds: the header's `clock` is `tick-1ms`) |
//! | 2 | the thread (a number no other thread of the process had) |
//! | 3 | the buffer: its address |
//! | 4, 5 | `a`, `b`: by kind, below |
//!
//! A word or field a record's kind does not use (the thread of a
//! registration, the device of an eviction) is zero; a reader refuses a
//! record where it is not.
//!
//! | kind | record | flags | `a` | `b` |
//! | --- | --- | --- | --- | --- |
//! | 1 | take | [`Source`] (0-6) | bytes asked | length handed out |
//! | 2 | drop | 1: a copy was recorded, 2: pinned, 4: by a thread other than the taker's | bytes written (the dirty prefix) | the taker's thread |
//! | 3 | registration | 1: failed, 2: a region | bytes | nanoseconds it took |
//! | 4 | eviction (the cap) | 0 | bytes | buffers |
//! | 5 | trim | 0 | bytes | buffers |
//! | 6 | flush | 0 | nanoseconds it took | 0 |
//! | 7 | records lost (a thread's buffer was full) | 0 | records | 0 |
//! | 8 | taken, never dropped while the pool lived (at its take's time) | 0 | bytes asked | length |
//! | 9 | end (last) | 0 | records before it | records lost |
//! | 10 | unregistration | 1: failed (the memory is leaked), 2: a region | bytes | nanoseconds it took |
//!
//! Records are in time order within each batch the background thread
//! writes, not across batches: sort by time for a total order (a stable
//! sort keeps each thread's order). Records of one millisecond keep the
//! order of the threads' buffers they came from (the pool's shared buffer
//! last), not the order they happened in across threads. Each thread's
//! records keep its order, a drop it makes while it is torn down (which
//! goes through the shared buffer) included. A buffer is named by its
//! address, so a drop belongs to the earliest take still open of the same
//! address by the thread the drop names as its taker; within one
//! millisecond, when two threads wrote them, that take may sort after the
//! drop, and a drop by another thread may sort after the taker's next
//! take of the address.
//!
//! # Examples
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let path = std::env::temp_dir().join(format!("pinpool-doc-{}.trace", std::process::id()));
//! let pool = pinpool::Pool::builder()
//!     .backend(pinpool::BackendKind::Host)
//!     .trace(&path)
//!     .build()?;
//! drop(pool.take(4096));
//! drop(pool); // closing the pool finishes the trace
//! let trace = pinpool::trace::Trace::read(&path)?;
//! assert!(trace.records.iter().any(|r| matches!(r, pinpool::trace::Record::Take { asked: 4096, .. })));
//! # std::fs::remove_file(&path)?;
//! # Ok(())
//! # }
//! ```

mod clock;
mod format;
pub(crate) mod ring;
pub(crate) mod writer;

pub(crate) use format::{
    head as trace_head, DROP, DROP_COPY, DROP_PINNED, DROP_REMOTE, EVICT, FLUSH, REGISTER,
    REGISTER_FAILED, REGISTER_REGION, TAKE, TRIM, UNREGISTER,
};
pub use format::{Header, ParseError, Reader, Record, Source, Trace, MAGIC, VERSION};
