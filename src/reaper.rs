//! The reaper: where buffers of closed pools go.
//!
//! When the last [`Pool`](crate::Pool) handle drops, the pool closes: its
//! workers stop and its pooled buffers are freed, but buffers still held by
//! users come back later. Dropping one must still never block and never
//! call CUDA, so a late drop sends the buffer to a single process-wide
//! thread, the reaper, which waits for the buffer's copies (polling their
//! events, so one slow copy holds up no other buffer; a pinned buffer
//! dropped without events waits for a device synchronize that started
//! after its drop, run on a thread of its own so that it holds up no other
//! buffer either), unregisters and frees it.
//!
//! A closed pool's state (its backend, its caches) stays alive for the
//! late drops: closing counts the buffers still out (takes minus drops,
//! exact once no drop is under way) and hands the pool to the reaper with
//! that count; the reaper lets the pool go when as many late buffers have
//! come back. A late buffer that arrives before its pool's count waits
//! with the reaper. The reaper thread is started by the first close (which
//! may block), never by a drop.
//!
//! If its thread cannot start (the system is out of threads), messages
//! wait in its channel, which never disconnects: a closed pool's state,
//! held by its `Closed` message, and its late buffers are kept (leaked,
//! and traced at error level, since no handle is left to read the
//! statistics from), never freed under a buffer still out. Every later
//! close tries to start the reaper again, and once one runs it takes over
//! everything that waited.
//!
//! Loom models have no process-wide thread: there the reaper runs inline,
//! in the sending thread (or the starting one, for what waited).

use std::collections::HashMap;

use crate::alloc::Block;
use crate::error::Error;

/// What a closed pool offers the reaper.
pub(crate) trait Retire: Send + Sync {
    /// Whether the copies that may read `block` have finished (its fences
    /// completed, or for a pinned buffer without any, a device synchronize
    /// that started after its drop). Does not block: a synchronize it needs
    /// runs on a thread of its own, and a later call sees it done (if that
    /// thread cannot be started, and under loom, it runs here).
    fn settled(&self, block: &mut Block) -> Result<bool, Error>;
    /// Unregisters and frees a buffer whose copies have finished.
    fn retire(&self, block: Block);
    /// Leaks a buffer whose copies are not known to have finished.
    fn abandon(&self, block: Block);
}

/// A message to the reaper.
pub(crate) enum Message {
    /// A buffer of pool `pool` (its address) dropped after the pool closed.
    Late { pool: usize, block: Block },
    /// Pool `key` (its address) closed with `outstanding` buffers still
    /// out; `returned` are dropped buffers it still held. `pool` keeps its
    /// state alive until they are all back.
    Closed {
        key: usize,
        pool: Box<dyn Retire>,
        outstanding: u64,
        returned: Vec<Block>,
    },
}

#[derive(Default)]
struct Entry {
    pool: Option<Box<dyn Retire>>,
    /// Late buffers expected, once known.
    outstanding: Option<u64>,
    /// Late buffers received so far.
    received: u64,
}

/// The reaper's state.
#[derive(Default)]
pub(crate) struct Reaper {
    entries: HashMap<usize, Entry>,
    /// Buffers waiting for their copies or their pool's close.
    waiting: Vec<(usize, Block)>,
}

impl Reaper {
    /// Takes in a message.
    pub(crate) fn handle(&mut self, message: Message) {
        match message {
            Message::Late { pool, block } => {
                self.entries.entry(pool).or_default().received += 1;
                self.waiting.push((pool, block));
            }
            Message::Closed {
                key,
                pool,
                outstanding,
                returned,
            } => {
                let entry = self.entries.entry(key).or_default();
                entry.outstanding = Some(outstanding);
                entry.pool = Some(pool);
                self.waiting.extend(returned.into_iter().map(|b| (key, b)));
            }
        }
    }

    /// Frees what it can; returns whether buffers still wait.
    pub(crate) fn poll(&mut self) -> bool {
        let mut i = 0;
        while i < self.waiting.len() {
            let key = self.waiting[i].0;
            let Some(pool) = self.entries.get(&key).and_then(|e| e.pool.as_ref()) else {
                i += 1;
                continue;
            };
            let block = &mut self.waiting[i].1;
            match pool.settled(block) {
                Ok(false) => {
                    i += 1;
                    continue;
                }
                Ok(true) => pool.retire(self.waiting.swap_remove(i).1),
                Err(e) => {
                    tracing::error!(error = %e, "pinpool: waiting for a late buffer's copies failed");
                    pool.abandon(self.waiting.swap_remove(i).1);
                }
            }
        }
        self.entries.retain(|key, entry| {
            let settled = entry.outstanding == Some(entry.received)
                && !self.waiting.iter().any(|(k, _)| k == key);
            !settled
        });
        !self.waiting.is_empty()
    }
}

#[cfg(not(pinpool_loom))]
mod imp {
    use super::{Message, Reaper};
    use crate::backend::Backend;
    use crate::sync::channel::{unbounded, Receiver, RecvTimeoutError, Sender};
    use crate::sync::{OnceLock, StaticMutex};
    use crate::tune::{Tune, Tuning};

    /// The reaper's channel. The receiver stays here too, so the channel
    /// never disconnects: what is sent while no reaper runs (its thread
    /// could not start) waits for the first one that does.
    static CHANNEL: OnceLock<(Sender<Message>, Receiver<Message>)> = OnceLock::new();
    /// Whether the reaper thread runs.
    static RUNNING: StaticMutex<bool> = StaticMutex::new(false);

    fn channel() -> &'static (Sender<Message>, Receiver<Message>) {
        CHANNEL.get_or_init(unbounded)
    }

    /// Starts the reaper thread through `backend` unless it runs; returns
    /// whether it runs. Every close calls this (late drops sent before it
    /// wait in the channel); a close whose start fails leaves its messages
    /// queued, and the next close tries again.
    pub(crate) fn start(backend: &dyn Backend) -> bool {
        let mut running = RUNNING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *running {
            return true;
        }
        let rx = channel().1.clone();
        match backend.spawn("pinpool-reaper".into(), Box::new(move || run(rx))) {
            Ok(_) => *running = true,
            Err(e) => tracing::error!(error = %e, "pinpool: could not start the reaper thread"),
        }
        *running
    }

    fn run(rx: Receiver<Message>) {
        let mut reaper = Reaper::default();
        let mut waiting = false;
        loop {
            let message = if waiting {
                rx.recv_timeout(Tune::POLL)
            } else {
                rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
            };
            // A backend that panics (a bug) must not take the reaper, and
            // with it every closed pool's state, down: what it held stays
            // where it was, and the reaper goes on.
            let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                match message {
                    Ok(message) => reaper.handle(message),
                    Err(RecvTimeoutError::Timeout) => {}
                    // Unreachable: the channel's receiver lives in a static.
                    Err(RecvTimeoutError::Disconnected) => return None,
                }
                Some(reaper.poll())
            }));
            match polled {
                Ok(Some(more)) => waiting = more,
                Ok(None) => return,
                Err(_) => tracing::error!("pinpool: the reaper caught a panic; carrying on"),
            }
        }
    }

    /// Sends `message`; never blocks. With no reaper running (none could
    /// start yet), the message waits in the channel, and with a `Closed`
    /// message the pool's state it holds: nothing is freed until a reaper
    /// runs.
    pub(crate) fn send(message: Message) {
        // Cannot fail: the channel's receiver lives in a static.
        let _ = channel().0.send(message);
    }
}

#[cfg(pinpool_loom)]
mod imp {
    use super::{Message, Reaper};
    use crate::backend::Backend;
    use crate::sync::{Mutex, MutexGuard};

    /// The reaper's state, the messages sent while none ran, and whether
    /// one runs.
    #[derive(Default)]
    struct State {
        reaper: Reaper,
        queued: Vec<Message>,
        running: bool,
    }

    loom::lazy_static! {
        static ref REAPER: Mutex<State> = Mutex::new(State::default());
    }

    /// As the normal build's, but the reaper runs inline (loom models have
    /// no process-wide thread): starting it (unless `backend` refuses its
    /// thread) takes over the messages that waited, here, and polls once.
    /// It does not wait for what still waits: the caller (a close) may be
    /// about to send the message a late buffer waits for, and the next
    /// message polls again.
    pub(crate) fn start(backend: &dyn Backend) -> bool {
        let mut state = REAPER.lock();
        if !state.running && !backend.refuses_thread("pinpool-reaper") {
            state.running = true;
            for message in std::mem::take(&mut state.queued) {
                state.reaper.handle(message);
            }
            state.reaper.poll();
        }
        state.running
    }

    /// Handles `message` inline, waiting for the copies; with no reaper
    /// started, queues it.
    pub(crate) fn send(message: Message) {
        let mut state = REAPER.lock();
        if !state.running {
            state.queued.push(message);
            return;
        }
        state.reaper.handle(message);
        settle(state);
    }

    /// Polls until no buffer waits.
    fn settle(mut state: MutexGuard<'_, State>) {
        while state.reaper.poll() {
            drop(state);
            crate::sync::thread::yield_now();
            state = REAPER.lock();
        }
    }
}

pub(crate) use imp::{send, start};
