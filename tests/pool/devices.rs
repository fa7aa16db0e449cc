//! Devices: each has its own shard, a buffer goes back to its own device's
//! (whoever drops it), borrows and counts stay by device, and the device
//! count is bounded, so that a thread pays little for the devices served.

use pinpool::{BackendKind, Error, Pool, SizeClasses};

use crate::common::{host_pool, in_child, resident_bytes};

#[test]
fn unknown_device_is_an_error() {
    let pool = host_pool(2);
    assert!(matches!(
        pool.take_on(2, 64),
        Err(Error::UnknownDevice {
            device: 2,
            devices: 2
        })
    ));
}

#[test]
fn buffer_dropped_on_another_thread_returns_to_its_device() {
    let pool = host_pool(2);
    let buf = pool.take_on(1, 1 << 13).unwrap();
    let ptr = buf.as_ptr() as usize;
    std::thread::spawn(move || drop(buf)).join().unwrap();
    pool.flush();
    assert!(
        pool.take_on(0, 1 << 13).unwrap().as_ptr() as usize != ptr,
        "device 0 must not get device 1's buffer"
    );
    let again = pool.take_on(1, 1 << 13).unwrap();
    assert_eq!(again.as_ptr() as usize, ptr);
    assert_eq!(again.device(), 1);
}

/// The most devices a pool serves, on the host backend: every device's
/// shard works, and the stats agree.
#[test]
fn many_host_devices_keep_buffers_on_their_devices() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .devices(pinpool::MAX_DEVICES)
        .cleaner_threads(2)
        .build()
        .unwrap();
    let bufs: Vec<_> = [0usize, 1, 31, pinpool::MAX_DEVICES - 1]
        .iter()
        .map(|&d| pool.take_on(d, 4096).unwrap())
        .collect();
    for (b, d) in bufs.iter().zip([0usize, 1, 31, pinpool::MAX_DEVICES - 1]) {
        assert_eq!(b.device(), d);
    }
    assert!(pool.take_on(pinpool::MAX_DEVICES, 4096).is_err());
    drop(bufs);
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.devices, pinpool::MAX_DEVICES);
    assert_eq!(stats.pooled_buffers, 4);
    for d in [0usize, 1, 31, pinpool::MAX_DEVICES - 1] {
        assert_eq!(stats.per_device[d].pooled_buffers, 1, "device {d}");
        let b = pool.take_on(d, 4096).unwrap();
        assert!(
            b.was_pooled(),
            "device {d}: the buffer came back to its own shard"
        );
        assert_eq!(b.device(), d);
    }
    assert!(Pool::builder()
        .backend(BackendKind::Host)
        .devices(0)
        .build()
        .is_err());
}

/// Every thread that takes from the pool keeps bookkeeping for every device
/// served, so the device count is bounded: above the bound the build fails
/// with a clear error, and at it one 4 KiB take on a fresh thread costs
/// little memory. Alone in a child process: it measures the process's
/// resident memory, which other tests running beside it would change.
#[test]
#[cfg_attr(
    pinpool_asan,
    ignore = "a resident-memory bound: AddressSanitizer's shadow memory and redzones break it"
)]
fn a_thread_pays_little_for_the_devices_served() {
    const TEST: &str = "a_thread_pays_little_for_the_devices_served";
    if in_child(module_path!(), TEST, &[]).is_some() {
        return;
    }
    let err = Pool::builder()
        .backend(BackendKind::Host)
        .devices(pinpool::MAX_DEVICES + 1)
        .build()
        .unwrap_err();
    assert!(
        err.to_string().contains("devices must be in 1..=64"),
        "{err}"
    );
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .devices(pinpool::MAX_DEVICES)
        .cleaner_threads(1)
        .build()
        .unwrap();
    drop(pool.take(4096));
    let before = resident_bytes();
    std::thread::scope(|s| {
        s.spawn(|| drop(pool.take(4096)));
    });
    let grown = resident_bytes().saturating_sub(before);
    assert!(
        grown < 8 << 20,
        "one 4 KiB take on a new thread grew resident memory by {} KiB",
        grown >> 10
    );
}

/// Two devices: takes, borrows and cross-thread drops on device 1 count in
/// device 1's slots; a buffer borrowed on device 1 keeps device 1.
#[test]
fn second_device_counts_and_borrows_by_slot() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(1)
        .devices(2)
        .size_classes(SizeClasses::PowersOfTwo)
        .build()
        .unwrap();
    assert!(pool.take_on(2, 64).is_err());
    drop(pool.take_on(1, 8192).unwrap());
    pool.flush();
    pool.clear();
    drop(pool.take_on(1, 8192).unwrap());
    pool.flush();
    // Move it to the shard: another thread's take misses; then a borrow.
    let mut takes = 2;
    let b = pool.take_on(1, 4096).unwrap();
    takes += 1;
    assert_eq!(b.device(), 1);
    assert_eq!(b.len(), 4096);
    let p2 = pool.clone();
    std::thread::spawn(move || {
        let c = p2.take_on(1, 2048).unwrap();
        assert_eq!(c.device(), 1);
        drop(b); // cross-thread drop of the first thread's buffer
        c
    })
    .join()
    .map(drop)
    .unwrap();
    takes += 1;
    pool.flush();
    let s = pool.stats();
    assert_eq!(s.hits + s.misses, takes, "{s:?}");
    assert_eq!(s.per_device[0].hits + s.per_device[0].misses, 0, "{s:?}");
    assert_eq!(
        s.per_device[1].hits + s.per_device[1].misses,
        takes,
        "{s:?}"
    );
    assert_eq!(s.in_cleaner, 0);
}
