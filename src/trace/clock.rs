//! The trace's clock: the CPU's time-stamp counter where it runs at a
//! constant rate through sleep states (x86-64 with `constant_tsc` and
//! `nonstop_tsc`), else nanoseconds of a monotonic clock. The background
//! thread turns ticks into nanoseconds against `Instant` (see `writer`).

use std::sync::OnceLock;
use std::time::Instant;

/// Which clock a trace reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Clock {
    /// The time-stamp counter.
    Tsc,
    /// Nanoseconds since the process's first read of this clock.
    Monotonic,
}

impl Clock {
    /// The time-stamp counter if this CPU's is usable, else the monotonic
    /// clock.
    pub(crate) fn choose() -> Self {
        if cfg!(target_arch = "x86_64") && tsc_is_invariant() {
            Clock::Tsc
        } else {
            Clock::Monotonic
        }
    }

    /// The name in the trace's header.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Clock::Tsc => "tsc",
            Clock::Monotonic => "monotonic",
        }
    }

    /// The clock now, in its ticks.
    #[inline]
    pub(crate) fn ticks(self) -> u64 {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `rdtsc` exists on every x86-64 CPU and has no
            // preconditions.
            Clock::Tsc => unsafe { core::arch::x86_64::_rdtsc() },
            _ => monotonic_ns(),
        }
    }
}

/// Nanoseconds since the first call in this process.
fn monotonic_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Whether `/proc/cpuinfo` says the time-stamp counter keeps a constant
/// rate through frequency changes and sleep states.
fn tsc_is_invariant() -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return false;
    };
    info.lines()
        .find(|l| l.starts_with("flags"))
        .is_some_and(|flags| {
            let has = |f: &str| flags.split_whitespace().any(|w| w == f);
            has("constant_tsc") && has("nonstop_tsc")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_go_forward() {
        for clock in [Clock::choose(), Clock::Monotonic] {
            let a = clock.ticks();
            std::thread::sleep(std::time::Duration::from_millis(1));
            assert!(clock.ticks() > a, "{clock:?}");
        }
    }
}
