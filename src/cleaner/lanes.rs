//! The cleaner's work queue: two lanes of jobs and a stop signal.
//!
//! Normal builds use three unbounded crossbeam channels: the *recycle* lane
//! (buffers already registered and chunks of them: microseconds each),
//! the *register* lane (first registrations of pool-miss buffers:
//! milliseconds each) and a control channel that only
//! carries stop signals, so that draining the job lanes can never swallow
//! one. The queue owns both ends of every channel, so it never
//! disconnects. Crossbeam is invisible to loom, so the loom build is a
//! mutex-guarded pair of queues and a stop count with a condition variable,
//! with the same semantics: unbounded, many producers and consumers, the
//! lane the caller names served first, a timed pop that returns what arrives during its
//! wait (under loom a wait is a yield), and stop signals apart from jobs.

use std::time::Duration;

/// Which lane a job travels on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Already-registered buffers and chunks.
    Recycle,
    /// First registrations: read only by workers allowed to.
    Register,
}

/// What a worker's `pop` got.
#[derive(Debug)]
pub(crate) enum Popped<T> {
    /// A job.
    Job(T),
    /// A stop signal: the worker exits.
    Stop,
    /// Nothing arrived within the timeout.
    Timeout,
}

#[cfg(not(pinpool_loom))]
mod imp {
    use super::{Duration, Lane, Popped};
    use crate::sync::channel::{self, unbounded, Receiver, Sender};

    type Channel<T> = (Sender<T>, Receiver<T>);

    /// See the module docs.
    pub(crate) struct Lanes<T> {
        recycle: Channel<T>,
        register: Channel<T>,
        control: Channel<()>,
    }

    impl<T> Lanes<T> {
        pub(crate) fn new() -> Self {
            Self {
                recycle: unbounded(),
                register: unbounded(),
                control: unbounded(),
            }
        }

        /// Queues `item`; never blocks.
        #[inline]
        pub(crate) fn push(&self, lane: Lane, item: T) {
            let tx = match lane {
                Lane::Recycle => &self.recycle.0,
                Lane::Register => &self.register.0,
            };
            // The receiver lives as long as `self`: sending cannot fail.
            let _ = tx.send(item);
        }

        /// Asks `workers` workers to stop.
        pub(crate) fn stop(&self, workers: usize) {
            for _ in 0..workers {
                let _ = self.control.0.send(());
            }
        }

        /// The next stop signal or job: stop first, then the lanes, the
        /// register lane only if `register` and first if `register_first`
        /// (see `Cleaner::work`); waits at most `timeout` (forever if
        /// `None`).
        pub(crate) fn pop(
            &self,
            register: bool,
            register_first: bool,
            timeout: Option<Duration>,
        ) -> Popped<T> {
            if self.control.1.try_recv().is_ok() {
                return Popped::Stop;
            }
            let never = channel::never();
            let (control, recycle) = (&self.control.1, &self.recycle.1);
            let register_rx = if register { &self.register.1 } else { &never };
            let (first, second) = if register_first {
                (register_rx, recycle)
            } else {
                (recycle, register_rx)
            };
            if let Ok(job) = first.try_recv().or_else(|_| second.try_recv()) {
                return Popped::Job(job);
            }
            let timeout = timeout.unwrap_or(Duration::MAX);
            channel::select_biased! {
                recv(control) -> _ => Popped::Stop,
                recv(first) -> job => job.map_or(Popped::Timeout, Popped::Job),
                recv(second) -> job => job.map_or(Popped::Timeout, Popped::Job),
                default(timeout) => Popped::Timeout,
            }
        }

        pub(crate) fn try_pop(&self) -> Option<T> {
            self.recycle
                .1
                .try_recv()
                .or_else(|_| self.register.1.try_recv())
                .ok()
        }

        /// Jobs queued on both lanes.
        pub(crate) fn len(&self) -> usize {
            self.recycle.1.len() + self.register.1.len()
        }
    }
}

#[cfg(pinpool_loom)]
mod imp {
    use super::{Duration, Lane, Popped};
    use crate::sync::{thread, Condvar, Mutex};
    use std::collections::VecDeque;

    struct Queues<T> {
        lanes: [VecDeque<T>; 2],
        stops: usize,
    }

    /// See the module docs.
    pub(crate) struct Lanes<T> {
        queues: Mutex<Queues<T>>,
        ready: Condvar,
    }

    impl<T> Lanes<T> {
        pub(crate) fn new() -> Self {
            Self {
                queues: Mutex::new(Queues {
                    lanes: [VecDeque::new(), VecDeque::new()],
                    stops: 0,
                }),
                ready: Condvar::new(),
            }
        }

        pub(crate) fn push(&self, lane: Lane, item: T) {
            let index = match lane {
                Lane::Recycle => 0,
                Lane::Register => 1,
            };
            self.queues.lock().lanes[index].push_back(item);
            self.ready.notify_all();
        }

        pub(crate) fn stop(&self, workers: usize) {
            self.queues.lock().stops += workers;
            self.ready.notify_all();
        }

        fn take(queues: &mut Queues<T>, register: bool, register_first: bool) -> Option<Popped<T>> {
            if queues.stops > 0 {
                queues.stops -= 1;
                return Some(Popped::Stop);
            }
            let order: &[usize] = match (register, register_first) {
                (false, _) => &[0],
                (true, false) => &[0, 1],
                (true, true) => &[1, 0],
            };
            order
                .iter()
                .find_map(|&lane| queues.lanes[lane].pop_front())
                .map(Popped::Job)
        }

        pub(crate) fn pop(
            &self,
            register: bool,
            register_first: bool,
            timeout: Option<Duration>,
        ) -> Popped<T> {
            let mut queues = self.queues.lock();
            if let Some(popped) = Self::take(&mut queues, register, register_first) {
                return popped;
            }
            if timeout.is_some() {
                // The wait: other threads run, then whatever arrived counts.
                drop(queues);
                thread::yield_now();
                queues = self.queues.lock();
                return Self::take(&mut queues, register, register_first)
                    .unwrap_or(Popped::Timeout);
            }
            loop {
                queues = self.ready.wait(queues);
                if let Some(popped) = Self::take(&mut queues, register, register_first) {
                    return popped;
                }
            }
        }

        pub(crate) fn try_pop(&self) -> Option<T> {
            let mut queues = self.queues.lock();
            queues.lanes[0]
                .pop_front()
                .or_else(|| queues.lanes[1].pop_front())
        }

        pub(crate) fn len(&self) -> usize {
            let queues = self.queues.lock();
            queues.lanes[0].len() + queues.lanes[1].len()
        }
    }
}

pub(crate) use imp::Lanes;

impl<T> std::fmt::Debug for Lanes<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lanes")
            .field("queued", &self.len())
            .finish()
    }
}
