//! An asymmetric fence pair for a handshake between one frequent side and
//! a rare one (Dekker's mutual exclusion with the cost moved to the rare
//! side).
//!
//! The frequent side (a thread cache's owner on every take and drop) runs
//! [`light`]; the rare side (a thread that must touch that cache's lists:
//! a miss stealing, `flush`, `clear`, eviction, closing) runs [`heavy`]. The
//! pair gives what a `fence(SeqCst)` on both sides would: for
//!
//! ```text
//!   owner: store(active = true); light(); load(request)
//!   thief: store(request = true); heavy(); load(active)
//! ```
//!
//! at least one load sees the other side's store; and an owner sequence that
//! begins after `heavy` returns sees the request.
//!
//! On Linux, `heavy` is `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`,
//! which makes every running thread of the process execute a full memory
//! barrier, so `light` only has to keep the compiler from reordering: two
//! plain stores and a load on the owner's own cache line, no read-modify-
//! write. This is the technique of liburcu's `urcu-memb` flavour and of
//! Folly's `asymmetricLightBarrier` / `asymmetricHeavyBarrier`; see
//! membarrier(2). Rust's memory model has no asymmetric fence, so the
//! argument is the kernel's, as it is for those C++ libraries. Where the
//! system call is missing or refused (old kernels, seccomp), both sides
//! fall back to `fence(SeqCst)`, which the C++ model covers
//! ([atomics.fences]: of two SeqCst fences one precedes the other in the
//! single total order, and the store before the first is visible to the
//! load after the second). Loom builds always use the fallback, so the
//! models check the protocol under the model's own rules.
//!
//! The choice is made once per process, in [`init`], before any pool is
//! built, and never changes: a `light` that relied on a `heavy` of the
//! other kind would be unsound.

#[cfg(not(pinpool_loom))]
mod imp {
    use std::sync::atomic::{compiler_fence, fence, AtomicU8, Ordering};

    const UNKNOWN: u8 = 0;
    const EXPEDITED: u8 = 1;
    const FENCES: u8 = 2;

    static MODE: AtomicU8 = AtomicU8::new(UNKNOWN);

    #[cfg(target_os = "linux")]
    mod sys {
        pub(super) const REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;
        pub(super) const PRIVATE_EXPEDITED: libc::c_long = 1 << 3;

        /// `membarrier(cmd, 0)`; true on success.
        pub(super) fn membarrier(cmd: libc::c_long) -> bool {
            // SAFETY: membarrier takes two integers and touches no memory of
            // ours; an unknown command is an error return, not UB.
            unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_long) == 0 }
        }
    }

    /// Picks the mode for the process (idempotent; called when a pool is
    /// built, before any thread cache exists).
    pub(crate) fn init() {
        if MODE.load(Ordering::Acquire) != UNKNOWN {
            return;
        }
        #[cfg(target_os = "linux")]
        let mode = if sys::membarrier(sys::REGISTER_PRIVATE_EXPEDITED) {
            EXPEDITED
        } else {
            FENCES
        };
        #[cfg(not(target_os = "linux"))]
        let mode = FENCES;
        // A second pool built at the same time computes the same mode (the
        // registration is idempotent); the first store wins and is final.
        // AcqRel/Acquire: the mode is read by threads that received a pool
        // handle, which happens after this store.
        let _ = MODE.compare_exchange(UNKNOWN, mode, Ordering::AcqRel, Ordering::Acquire);
        tracing::debug!(
            expedited = MODE.load(Ordering::Relaxed) == EXPEDITED,
            "pinpool: asymmetric barrier mode chosen"
        );
    }

    #[inline(always)]
    fn expedited() -> bool {
        // Relaxed: set once in `init`, before any pool exists; every thread
        // that runs `light` got its pool through a synchronizing handoff.
        MODE.load(Ordering::Relaxed) == EXPEDITED
    }

    /// The frequent side.
    #[inline(always)]
    pub(crate) fn light() {
        if expedited() {
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
    }

    /// The rare side: microseconds with `membarrier` (an interrupt to every
    /// CPU running a thread of the process).
    pub(crate) fn heavy() {
        fence(Ordering::SeqCst);
        #[cfg(target_os = "linux")]
        if expedited() && !sys::membarrier(sys::PRIVATE_EXPEDITED) {
            // Registration succeeded, so the kernel supports the command;
            // failing now would leave `light` without its other half.
            tracing::error!("pinpool: membarrier failed after registration; aborting");
            std::process::abort();
        }
    }
}

#[cfg(pinpool_loom)]
mod imp {
    use loom::sync::atomic::{fence, Ordering};

    pub(crate) fn init() {}

    // Under the models both halves are full fences, which pair with each
    // other (and with any other SeqCst operation) as the compiler fence and
    // `membarrier` pair do: loom has no process-wide barrier to model.
    pub(crate) fn light() {
        // SeqCst: pairs with `heavy`'s fence, as above.
        fence(Ordering::SeqCst);
    }

    pub(crate) fn heavy() {
        // SeqCst: pairs with `light`'s fence, as above.
        fence(Ordering::SeqCst);
    }
}

pub(crate) use imp::{heavy, init, light};
