//! Pinned memory over time: `reserve`, provisioning ahead of demand, idle
//! trimming.

use std::time::{Duration, Instant};

use pinpool::{BackendKind, Error, Pool};

use crate::common::all_zero;

fn pool(idle_trim: Option<Duration>) -> Pool {
    let builder = Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(2);
    match idle_trim {
        Some(after) => builder.idle_trim(after),
        None => builder.no_idle_trim(),
    }
    .build()
    .unwrap()
}

/// A pool on the host backend that pins nothing ahead of demand.
fn unprovisioned() -> Pool {
    Pool::builder()
        .backend(BackendKind::Host)
        .provision(false)
        .build()
        .unwrap()
}

/// Waits up to `limit` for `done`.
fn eventually(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn reserve_pins_ahead_and_flush_waits_for_it() {
    let pool = pool(None);
    pool.reserve(0, &[(1 << 20, 3), (4096, 2)]).unwrap();
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.pooled_buffers, 5);
    assert_eq!(stats.pooled_bytes, 3 * (1 << 20) + 2 * 4096);
    let bufs: Vec<_> = (0..3).map(|_| pool.take(1 << 20)).collect();
    assert!(bufs.iter().all(|b| b.was_pooled() && all_zero(b)));
    assert_eq!(pool.stats().misses, 0);
}

#[test]
fn bad_reservations_are_errors_and_reserve_nothing() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .devices(2)
        .max_pooled_bytes(16 << 20)
        .build()
        .unwrap();
    assert!(matches!(
        pool.reserve(2, &[(4096, 1)]),
        Err(Error::UnknownDevice { .. })
    ));
    assert!(matches!(
        pool.reserve(0, &[(4096, 1), (usize::MAX, 1)]),
        Err(Error::SizeTooLarge { .. })
    ));
    assert!(matches!(
        pool.reserve(0, &[(4096, 1), (8 << 20, 2)]),
        Err(Error::ReserveTooLarge { .. })
    ));
    assert!(matches!(
        pool.reserve(0, &[(4096, usize::MAX)]),
        Err(Error::ReserveExceedsMemory { .. })
    ));
    pool.flush();
    assert_eq!(
        pool.stats().pooled_buffers,
        0,
        "a failed reserve pinned something"
    );
}

/// With no cap to stop it, a reservation whose bytes overflow, or that
/// this host's memory could not hold, is an error before anything is
/// mapped (not an allocation loop until the process runs out of memory).
#[test]
fn reservations_past_the_hosts_memory_are_errors_under_an_unlimited_cap() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .max_pooled_bytes(usize::MAX)
        .build()
        .unwrap();
    let too_large = |wanted: &[(usize, usize)]| {
        let started = Instant::now();
        let outcome = pool.reserve(0, wanted);
        assert!(
            matches!(outcome, Err(Error::ReserveExceedsMemory { .. })),
            "reserve({wanted:?}) gave {outcome:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "reserve({wanted:?}) mapped memory before failing"
        );
    };
    too_large(&[(4096, usize::MAX)]);
    too_large(&[(pinpool::MAX_CLASS_SIZE, 1 << 30), (4096, 1)]);
    too_large(&[(1 << 30, usize::MAX / 2), (1 << 30, usize::MAX / 2)]);
    // Twice this host's memory, in 1 GiB buffers.
    let pages = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let kib = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            kib.split_whitespace().nth(1)?.parse::<usize>().ok()
        })
        .expect("MemTotal in /proc/meminfo");
    too_large(&[(1 << 30, (pages << 10 >> 30) * 2 + 2)]);
    let err = pool.reserve(0, &[(4096, usize::MAX)]).unwrap_err();
    assert!(err.to_string().contains("memory"), "{err}");
    pool.flush();
    assert_eq!(pool.stats().pooled_buffers, 0);
}

#[test]
fn idle_buffers_are_trimmed_but_reserved_ones_stay() {
    let pool = pool(Some(Duration::from_millis(100)));
    pool.reserve(0, &[(1 << 20, 1)]).unwrap();
    let bufs: Vec<_> = (0..4).map(|_| pool.take(2 << 20)).collect();
    drop(bufs);
    pool.flush();
    assert_eq!(pool.stats().pooled_buffers, 5);
    // Trimming runs a quarter of the idle time apart, at least a second.
    eventually(Duration::from_secs(10), "idle trim", || {
        pool.stats().pooled_buffers == 1
    });
    let stats = pool.stats();
    assert_eq!(stats.pooled_bytes, 1 << 20, "the reserved buffer stays");
    assert_eq!(stats.trimmed_bytes, 4 * (2 << 20));
}

#[test]
fn trim_now_frees_idle_buffers() {
    let pool = unprovisioned();
    drop(pool.take(1 << 20));
    pool.flush();
    pool.trim();
    assert_eq!(pool.stats().pooled_buffers, 0);
    assert_eq!(pool.stats().trimmed_bytes, 1 << 20);
}

#[test]
fn provisioning_restores_what_recent_demand_needed() {
    let pool = pool(None);
    let bufs: Vec<_> = (0..3).map(|_| pool.take(1 << 20)).collect();
    std::thread::sleep(Duration::from_millis(200)); // a tick sees 3 in use
    drop(bufs);
    pool.flush();
    pool.set_max_pooled_bytes(0); // evicts all three
    assert_eq!(pool.stats().pooled_buffers, 0);
    pool.set_max_pooled_bytes(1 << 30);
    eventually(Duration::from_secs(10), "provisioning", || {
        pool.flush();
        pool.stats().pooled_buffers == 3
    });
    let bufs: Vec<_> = (0..3).map(|_| pool.take(1 << 20)).collect();
    assert!(bufs.iter().all(|b| b.was_pooled()));
}

#[test]
fn provisioning_off_leaves_evicted_classes_empty() {
    let pool = unprovisioned();
    let bufs: Vec<_> = (0..3).map(|_| pool.take(1 << 20)).collect();
    std::thread::sleep(Duration::from_millis(200));
    drop(bufs);
    pool.flush();
    pool.set_max_pooled_bytes(0);
    pool.set_max_pooled_bytes(1 << 30);
    std::thread::sleep(Duration::from_millis(500));
    pool.flush();
    assert_eq!(pool.stats().pooled_buffers, 0);
}

/// Idle trim releases only what has been idle longer than the idle-trim
/// time: a buffer used every few milliseconds stays, one left alone goes.
#[test]
fn idle_trim_keeps_a_buffer_in_use_and_releases_one_left_idle() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .provision(false)
        .idle_trim(Duration::from_secs(1))
        .build()
        .unwrap();
    // Left idle from the start; 4 MiB is out of the 1 MiB class's borrowing
    // reach, so the loop below never takes it.
    drop(pool.take(4 << 20));
    pool.flush();
    // Trim ticks run a second apart: three seconds see at least two, and
    // the 4 MiB buffer is idle longer than a second at the second.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        let mut buf = pool.take(1 << 20);
        buf[..128 << 10].fill(1); // past what the owner re-zeroes itself
        drop(buf);
        pool.flush();
        std::thread::sleep(Duration::from_millis(20));
    }
    let stats = pool.stats();
    assert_eq!(
        stats.trimmed_bytes,
        4 << 20,
        "only the idle buffer is trimmed"
    );
    let one_mib = stats.per_class.iter().find(|c| c.size == 1 << 20).unwrap();
    assert_eq!(
        one_mib.misses, 1,
        "the buffer in use was trimmed and missed again"
    );
}

/// `clear` forgets the reservations made before it (a cap that follows the
/// working set no longer holds room for them), so a reserved buffer that
/// was out at the clear (taken, or in the cleaner) and comes back after it
/// is an idle buffer like any other, which trimming releases.
/// (Before, the buffer kept its reservation for good, and the idle trim
/// kept it until the next clear: a trace test that dropped buffers and
/// cleared without a flush between waited 10 s for three reserved 104 KiB
/// buffers that kept an 18 MiB region pinned.) A reservation made after
/// the clear still holds.
///
/// Provisioning is off: with it on, `trim` also keeps what recent demand
/// needs, and a provisioning tick that saw the buffer taken (under load,
/// the few steps from the take to the trim can span one) kept it.
#[test]
fn a_reserved_buffer_out_at_a_clear_is_trimmed_when_idle() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(2)
        .provision(false)
        .idle_trim(Duration::from_millis(100))
        .build()
        .unwrap();
    pool.reserve(0, &[(1 << 20, 1)]).unwrap();
    pool.flush();
    let held = pool.take(1 << 20);
    assert!(held.was_pooled(), "the reserved buffer");
    pool.clear();
    drop(held);
    pool.flush();
    // `trim` releases at once what the idle trim releases once idle.
    pool.trim();
    assert_eq!(
        pool.stats().pooled_buffers,
        0,
        "the buffer reserved before the clear"
    );
    // A reservation after the clear is kept as ever.
    pool.reserve(0, &[(1 << 20, 1)]).unwrap();
    pool.flush();
    drop(pool.take(1 << 20));
    pool.flush();
    pool.trim();
    assert_eq!(
        pool.stats().pooled_bytes,
        1 << 20,
        "the new reservation stays"
    );
}

/// Once a workload ends and the idle trim has given back every pinned
/// byte, the pool pins nothing more: provisioning follows demand, and
/// demand has ended, so no tick registers again what the trim released
/// (a registration costs the same whether or not a take ever uses it).
#[test]
fn a_pool_trimmed_to_nothing_after_its_workload_pins_nothing_more() {
    let faults = std::sync::Arc::new(pinpool::testing::Faults::default());
    let pool = Pool::builder()
        .faults(faults.clone())
        .cleaner_threads(2)
        .idle_trim(Duration::from_millis(100))
        .build()
        .unwrap();
    crate::common::pin_and_give_back(&pool);
    eventually(Duration::from_secs(10), "trimmed to nothing", || {
        pool.stats().pinned_bytes == 0
    });
    let registered = faults.register_calls();
    // Ten idle-trim windows with nothing taken.
    std::thread::sleep(Duration::from_secs(1));
    let stats = pool.stats();
    assert_eq!(
        faults.register_calls() - registered,
        0,
        "registrations after the trim; {stats:#?}"
    );
    assert_eq!(stats.pinned_bytes, 0, "{stats:#?}");
}

/// A take that runs while a trim holds its class's pooled buffers (it
/// takes them out, sorts them by idle time and puts back those it keeps)
/// finds the ones it keeps: it waits for the trim to put them back rather
/// than miss.
/// (Before, it found the class empty and missed: here, the takes of
/// reserved buffers, which every trim keeps, beside a thread trimming.)
#[test]
fn a_take_racing_a_trim_finds_the_buffers_the_trim_keeps() {
    let pool = std::sync::Arc::new(unprovisioned());
    const RESERVED: usize = 512;
    pool.reserve(0, &[(64 << 10, RESERVED)]).unwrap();
    pool.flush();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trimmer = {
        let (pool, stop) = (pool.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut trims = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                pool.trim();
                trims += 1;
            }
            trims
        })
    };
    let mut missed = 0;
    for _ in 0..40 {
        let bufs: Vec<_> = (0..RESERVED).map(|_| pool.take(64 << 10)).collect();
        missed += bufs.iter().filter(|b| !b.was_pooled()).count();
        drop(bufs);
        pool.flush();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let trims = trimmer.join().unwrap();
    assert!(trims > 0);
    assert_eq!(
        missed,
        0,
        "takes missed while {trims} trims ran: {:#?}",
        pool.stats()
    );
    assert_eq!(
        pool.stats().trimmed_bytes,
        0,
        "only reserved buffers were pooled"
    );
}

/// A tracing subscriber that takes from the pool as the trim reports what
/// it trimmed (a buffer for the log line, say) gets its buffer: the trim
/// reports once its holds are over. (A trim that reported while it held
/// its classes made the take wait for its own thread's hold, for good.)
#[test]
fn a_subscriber_that_takes_as_the_trim_reports_gets_its_buffer() {
    use tracing_subscriber::layer::SubscriberExt;
    struct Taker(std::sync::Arc<Pool>);
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Taker {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            if event.metadata().target() == "pinpool::admission" {
                // Of the class the trim released: empty now.
                assert!(!self.0.take(1 << 20).was_pooled());
            }
        }
    }
    let pool = std::sync::Arc::new(unprovisioned());
    drop(pool.take(1 << 20));
    pool.flush();
    let (done, finished) = std::sync::mpsc::channel();
    let trimming = pool.clone();
    std::thread::spawn(move || {
        let subscriber = tracing_subscriber::registry().with(Taker(trimming.clone()));
        tracing::subscriber::with_default(subscriber, || trimming.trim());
        done.send(()).unwrap();
    });
    assert!(
        finished.recv_timeout(Duration::from_secs(10)).is_ok(),
        "the trim hung"
    );
    assert_eq!(pool.stats().trimmed_bytes, 1 << 20);
}
