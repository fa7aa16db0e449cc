//! Loom-only checking tools, with no-op stand-ins for normal builds, so the
//! rest of the crate uses them without a `cfg`.
//!
//! - [`Track`]: under loom a tracked allocation: a model whose execution
//!   ends with a buffer's metadata neither freed nor dropped fails with a
//!   leak report. Nothing otherwise.
//! - [`Contents`]: stands for a buffer's bytes, one loom cell per cleaning
//!   chunk, so that a buffer handed out while a worker still writes it (or
//!   a chunk written by two threads at once) fails a model as a data race.
//!   Nothing otherwise.

#[cfg(not(pinpool_loom))]
mod imp {
    /// See the module docs.
    #[derive(Debug, Default)]
    pub(crate) struct Track;

    impl Track {
        #[inline(always)]
        pub(crate) fn new() -> Self {
            Self
        }
    }

    /// See the module docs.
    #[derive(Debug, Clone, Default)]
    pub(crate) struct Contents;

    impl Contents {
        #[inline(always)]
        pub(crate) fn new(_parts: usize) -> Self {
            Self
        }

        #[inline(always)]
        pub(crate) fn read(&self) {}

        #[inline(always)]
        pub(crate) fn write(&self) {}

        #[inline(always)]
        pub(crate) fn write_part(&self, _part: usize) {}
    }
}

#[cfg(pinpool_loom)]
mod imp {
    use loom::sync::Arc;

    /// See the module docs.
    #[derive(Debug)]
    pub(crate) struct Track(#[allow(dead_code)] loom::alloc::Track<()>);

    impl Track {
        pub(crate) fn new() -> Self {
            Self(loom::alloc::Track::new(()))
        }
    }

    /// See the module docs.
    #[derive(Debug, Clone)]
    pub(crate) struct Contents(Arc<Vec<loom::cell::UnsafeCell<()>>>);

    // SAFETY: the cells hold no data; they exist so that loom checks every
    // access from every thread, which is the point of sharing them.
    unsafe impl Send for Contents {}
    // SAFETY: as above.
    unsafe impl Sync for Contents {}

    impl Contents {
        pub(crate) fn new(parts: usize) -> Self {
            Self(Arc::new(
                (0..parts.max(1))
                    .map(|_| loom::cell::UnsafeCell::new(()))
                    .collect(),
            ))
        }

        pub(crate) fn read(&self) {
            self.0.iter().for_each(|part| part.with(|_| ()));
        }

        pub(crate) fn write(&self) {
            self.0.iter().for_each(|part| part.with_mut(|_| ()));
        }

        /// Chunks past the buffer's length (pre-faulting the rest of its
        /// pages) share the last cell.
        pub(crate) fn write_part(&self, part: usize) {
            self.0[part.min(self.0.len() - 1)].with_mut(|_| ());
        }
    }
}

pub(crate) use imp::{Contents, Track};
