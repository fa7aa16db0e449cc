//! The trace's clock: a count of milliseconds since the trace began, kept
//! in one atomic that a thread of the trace advances every millisecond.
//! Reading it is one load of a cache line that changes once a millisecond
//! (the time-stamp counter costs 12-22 ns a read on the machines measured,
//! `Instant::now` 33 ns: two reads per take and drop would exceed what
//! tracing may add). Records are as precise as the tick; their order
//! within a thread is the order they were written in.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

/// How often the clock advances: its resolution.
pub(crate) const TICK: Duration = Duration::from_millis(1);

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Clock {
    /// Ticks since `start`, as of the last advance.
    ticks: CachePadded<AtomicU64>,
    start: Instant,
}

impl Clock {
    /// A clock at tick 0 now.
    pub(crate) fn new() -> Self {
        Self {
            ticks: CachePadded::new(AtomicU64::new(0)),
            start: Instant::now(),
        }
    }

    /// The tick now (a value up to one tick old, or more while the thread
    /// that advances the clock is descheduled).
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        // Relaxed: a time, publishing nothing; one thread's reads of one
        // atomic never go backwards, so its records stay in order.
        self.ticks.load(Ordering::Relaxed)
    }

    /// Sets the clock to the ticks elapsed since it began, and returns
    /// them. Only the trace's clock thread (and `finish`) calls it.
    pub(crate) fn advance(&self) -> u64 {
        let ticks = self.elapsed();
        // Relaxed: as in `now`; `fetch_max` never moves the clock back
        // when two callers race.
        self.ticks.fetch_max(ticks, Ordering::Relaxed).max(ticks)
    }

    /// Ticks elapsed since the clock began, read from `Instant`.
    pub(crate) fn elapsed(&self) -> u64 {
        (self.start.elapsed().as_nanos() / TICK.as_nanos()) as u64
    }

    /// Sets the clock (tests of what reads it).
    #[cfg(test)]
    pub(crate) fn set(&self, ticks: u64) {
        self.ticks.store(ticks, Ordering::Relaxed);
    }

    /// `ticks` in nanoseconds.
    pub(crate) fn to_ns(ticks: u64) -> u64 {
        ticks.saturating_mul(TICK.as_nanos() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_advances_and_never_goes_back() {
        let clock = Clock::new();
        assert_eq!(clock.now(), 0);
        std::thread::sleep(3 * TICK);
        let t = clock.advance();
        assert!(t >= 3, "{t}");
        assert_eq!(clock.now(), t);
        clock.ticks.store(t + 100, Ordering::Relaxed);
        assert_eq!(clock.advance(), t + 100);
        assert_eq!(Clock::to_ns(2), 2_000_000);
    }
}
