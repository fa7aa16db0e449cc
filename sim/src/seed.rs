//! A re-implementation of the design pinpool replaces, for comparison only:
//! one global mutex around a `BTreeMap` of size classes, one cleaner thread
//! that batches returns for up to 64 buffers or 100 ms, drains copies with
//! recorded events or a whole-device synchronize, registers every miss
//! buffer in FIFO order with everything else, re-zeroes, and pools.
//!
//! It keeps that design's behaviour (and its costs) and adds only the
//! counters the simulator reports.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};

/// The cap the design defaults to.
const MAX_POOLED_BYTES: usize = 4 << 30;

/// A buffer of the seed design.
pub struct SeedBuffer {
    data: Vec<u8>,
    dirty_len: usize,
    registered: bool,
    hit: bool,
    last_use: Vec<CudaEvent>,
    device: usize,
    pool: Arc<Shared>,
}

struct Returned {
    data: Vec<u8>,
    dirty_len: usize,
    registered: bool,
    last_use: Vec<CudaEvent>,
    device: usize,
    dropped_at: Instant,
}

struct Inner {
    by_size: BTreeMap<usize, Vec<Vec<u8>>>,
    total_bytes: usize,
}

struct Cleaner {
    tx: mpsc::Sender<Returned>,
    thread: JoinHandle<()>,
}

struct Shared {
    pool: Mutex<Inner>,
    cleaner: Mutex<Option<Cleaner>>,
    gpu: Option<Vec<Arc<CudaContext>>>,
    hits: AtomicU64,
    misses: AtomicU64,
    registered_bytes: AtomicU64,
    unregistered_bytes: AtomicU64,
    registrations: AtomicU64,
    peak_pinned: AtomicU64,
    bytes_zeroed: AtomicU64,
    ready_latency: Mutex<Vec<Duration>>,
}

/// The seed design's pool, with its single cleaner.
#[derive(Clone)]
pub struct SeedPool {
    shared: Arc<Shared>,
}

/// Counters of a [`SeedPool`].
#[derive(Debug, Clone, Default)]
pub struct SeedStats {
    /// Takes served from the pool.
    pub hits: u64,
    /// Takes that allocated.
    pub misses: u64,
    /// Bytes page-locked now.
    pub pinned_bytes: u64,
    /// The most bytes page-locked at once.
    pub peak_pinned_bytes: u64,
    /// `cuMemHostRegister` calls made (one per miss buffer recycled).
    pub registrations: u64,
    /// Bytes the cleaner re-zeroed.
    pub bytes_zeroed: u64,
    /// Every drop-to-ready latency seen.
    pub ready_latency: Vec<Duration>,
}

impl SeedPool {
    /// A pool on `gpu`'s devices, or on none (registration then does
    /// nothing and every buffer counts as unregistered).
    pub fn new(gpu: Option<Vec<Arc<CudaContext>>>) -> Self {
        Self {
            shared: Arc::new(Shared {
                pool: Mutex::new(Inner {
                    by_size: BTreeMap::new(),
                    total_bytes: 0,
                }),
                cleaner: Mutex::new(None),
                gpu,
                hits: AtomicU64::new(0),
                misses: AtomicU64::new(0),
                registered_bytes: AtomicU64::new(0),
                unregistered_bytes: AtomicU64::new(0),
                registrations: AtomicU64::new(0),
                peak_pinned: AtomicU64::new(0),
                bytes_zeroed: AtomicU64::new(0),
                ready_latency: Mutex::new(Vec::new()),
            }),
        }
    }

    /// An all-zero buffer of `min_size` rounded to a power of two, pinned
    /// on a hit.
    pub fn take(&self, device: usize, min_size: usize) -> SeedBuffer {
        let size = min_size.next_power_of_two();
        let pooled = {
            let mut pool = self.shared.pool.lock().unwrap();
            let popped = pool.by_size.get_mut(&size).and_then(Vec::pop);
            if pool.by_size.get(&size).is_some_and(Vec::is_empty) {
                pool.by_size.remove(&size);
            }
            if popped.is_some() {
                pool.total_bytes -= size;
            }
            popped
        };
        let hit = pooled.is_some();
        let counter = if hit {
            &self.shared.hits
        } else {
            &self.shared.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        SeedBuffer {
            data: pooled.unwrap_or_else(|| vec![0u8; size]),
            dirty_len: size,
            registered: hit && self.shared.gpu.is_some(),
            hit,
            last_use: Vec::new(),
            device,
            pool: self.shared.clone(),
        }
    }

    /// Waits until the cleaner has processed everything sent so far, by
    /// closing its channel and joining it (as the design's `shutdown`),
    /// without clearing the pool.
    pub fn flush(&self) {
        let cleaner = self.shared.cleaner.lock().unwrap().take();
        if let Some(Cleaner { tx, thread }) = cleaner {
            drop(tx);
            let _ = thread.join();
        }
    }

    /// Drains the cleaner, then unregisters and frees everything pooled.
    pub fn shutdown(&self) {
        self.flush();
        let mut pool = self.shared.pool.lock().unwrap();
        let buffers: Vec<Vec<u8>> = std::mem::take(&mut pool.by_size)
            .into_values()
            .flatten()
            .collect();
        pool.total_bytes = 0;
        drop(pool);
        for mut buf in buffers {
            self.shared.unregister(&mut buf);
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> SeedStats {
        let s = &self.shared;
        SeedStats {
            hits: s.hits.load(Ordering::Relaxed),
            misses: s.misses.load(Ordering::Relaxed),
            pinned_bytes: s.pinned(),
            peak_pinned_bytes: s.peak_pinned.load(Ordering::Relaxed),
            registrations: s.registrations.load(Ordering::Relaxed),
            bytes_zeroed: s.bytes_zeroed.load(Ordering::Relaxed),
            ready_latency: s.ready_latency.lock().unwrap().clone(),
        }
    }
}

impl SeedBuffer {
    /// Whether the take was a pool hit.
    pub fn hit(&self) -> bool {
        self.hit
    }

    /// Narrows the prefix to re-zero.
    pub fn set_dirty_len(&mut self, len: usize) {
        self.dirty_len = len;
    }

    /// Records an event after the last copy on `stream`.
    pub fn record_last_use(&mut self, stream: &CudaStream) {
        self.last_use
            .push(stream.record_event(None).expect("record an event"));
    }

    /// The bytes.
    pub fn bytes(&mut self) -> &mut [u8] {
        &mut self.data
    }
}

impl Drop for SeedBuffer {
    fn drop(&mut self) {
        let returned = Returned {
            data: std::mem::take(&mut self.data),
            dirty_len: self.dirty_len,
            registered: self.registered,
            last_use: std::mem::take(&mut self.last_use),
            device: self.device,
            dropped_at: Instant::now(),
        };
        let mut slot = self.pool.cleaner.lock().unwrap();
        let cleaner = slot.get_or_insert_with(|| spawn_cleaner(self.pool.clone()));
        let _ = cleaner.tx.send(returned);
    }
}

fn spawn_cleaner(shared: Arc<Shared>) -> Cleaner {
    let (tx, rx) = mpsc::channel::<Returned>();
    let thread = std::thread::spawn(move || {
        while let Ok(first) = rx.recv() {
            let mut batch = vec![first];
            while batch.len() < 64 {
                match rx.recv_timeout(Duration::from_millis(100)) {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            let mut synced: BTreeMap<usize, bool> = BTreeMap::new();
            for returned in batch {
                let drained = if !returned.last_use.is_empty() {
                    returned.last_use.iter().all(|e| e.synchronize().is_ok())
                } else if !returned.registered {
                    true
                } else {
                    *synced
                        .entry(returned.device)
                        .or_insert_with(|| shared.sync_device(returned.device))
                };
                if drained {
                    shared.recycle(returned);
                } else {
                    let mut data = returned.data;
                    if returned.registered {
                        shared.unregister(&mut data);
                    }
                }
            }
        }
    });
    Cleaner { tx, thread }
}

impl Shared {
    fn pinned(&self) -> u64 {
        self.registered_bytes
            .load(Ordering::Relaxed)
            .saturating_sub(self.unregistered_bytes.load(Ordering::Relaxed))
    }

    fn sync_device(&self, device: usize) -> bool {
        match &self.gpu {
            Some(contexts) => contexts[device].synchronize().is_ok(),
            None => true,
        }
    }

    fn register(&self, data: &mut [u8]) -> bool {
        let Some(contexts) = &self.gpu else {
            return true;
        };
        if contexts[0].bind_to_thread().is_err() {
            return false;
        }
        self.registrations.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `data` is a live allocation that is unregistered before
        // it is freed (`unregister`).
        let rc = unsafe {
            sys::cuMemHostRegister_v2(
                data.as_mut_ptr().cast(),
                data.len(),
                sys::CU_MEMHOSTREGISTER_PORTABLE,
            )
        };
        let ok = rc.result().is_ok();
        if ok {
            self.registered_bytes
                .fetch_add(data.len() as u64, Ordering::Relaxed);
            self.peak_pinned.fetch_max(self.pinned(), Ordering::Relaxed);
        }
        ok
    }

    fn unregister(&self, data: &mut [u8]) {
        let Some(contexts) = &self.gpu else {
            return;
        };
        let _ = contexts[0].bind_to_thread();
        // SAFETY: `data` was registered by `register` and is idle.
        if unsafe { sys::cuMemHostUnregister(data.as_mut_ptr().cast()) }
            .result()
            .is_ok()
        {
            self.unregistered_bytes
                .fetch_add(data.len() as u64, Ordering::Relaxed);
        }
    }

    fn recycle(&self, mut returned: Returned) {
        if !returned.registered {
            if !self.register(&mut returned.data) {
                return;
            }
            returned.registered = true;
        }
        let dirty = returned.dirty_len.min(returned.data.len());
        returned.data[..dirty].fill(0);
        self.bytes_zeroed.fetch_add(dirty as u64, Ordering::Relaxed);
        let size = returned.data.len();
        let mut evicted = Vec::new();
        {
            let mut pool = self.pool.lock().unwrap();
            // A buffer larger than the whole cap evicts nothing and is
            // never pooled.
            while size <= MAX_POOLED_BYTES && pool.total_bytes + size > MAX_POOLED_BYTES {
                let Some((&class, bufs)) = pool.by_size.iter_mut().next_back() else {
                    break;
                };
                evicted.extend(bufs.pop());
                if bufs.is_empty() {
                    pool.by_size.remove(&class);
                }
                pool.total_bytes -= class;
            }
            if pool.total_bytes + size <= MAX_POOLED_BYTES {
                pool.total_bytes += size;
                pool.by_size
                    .entry(size)
                    .or_default()
                    .push(std::mem::take(&mut returned.data));
            }
        }
        for mut buf in evicted {
            self.unregister(&mut buf);
        }
        if !returned.data.is_empty() {
            self.unregister(&mut returned.data);
        }
        self.ready_latency
            .lock()
            .unwrap()
            .push(returned.dropped_at.elapsed());
    }
}
