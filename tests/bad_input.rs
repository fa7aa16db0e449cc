//! Sizes and settings out of range give errors or clear panics, never an
//! empty buffer.

mod common;
use common::host_pool;
use pinpool::{BackendKind, Error, Pool, MAX_CLASS_SIZE};

#[test]
fn oversized_requests_are_errors() {
    let pool = host_pool(1);
    for size in [MAX_CLASS_SIZE + 1, usize::MAX] {
        match pool.try_take(size) {
            Err(Error::SizeTooLarge { requested, max }) => {
                assert_eq!((requested, max), (size, MAX_CLASS_SIZE));
            }
            other => panic!("try_take({size}) gave {other:?}"),
        }
    }
}

#[test]
#[should_panic(expected = "more than the largest size class")]
fn take_of_usize_max_panics_clearly() {
    let _ = host_pool(1).take(usize::MAX);
}

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
fn builder_rejects_out_of_range_values() {
    let zero_workers = Pool::builder()
        .backend(BackendKind::Host)
        .cleaner_threads(0)
        .build();
    assert!(matches!(zero_workers, Err(Error::InvalidConfig(_))));
    let zero_devices = Pool::builder()
        .backend(BackendKind::Host)
        .devices(0)
        .build();
    assert!(matches!(zero_devices, Err(Error::InvalidConfig(_))));
}

#[test]
fn cap_of_zero_turns_pooling_off() {
    let pool = host_pool(1);
    pool.set_max_pooled_bytes(0);
    drop(pool.take(4096));
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.pooled_bytes, 0);
    assert_eq!(stats.released, 1);
    assert!(!pool.take(4096).is_pinned());
    assert_eq!(pool.stats().misses, 2);
}

#[test]
fn pool_dropped_while_buffers_are_out() {
    let pool = host_pool(1);
    let mut buf = pool.take(1 << 20);
    buf.fill(1);
    drop(pool);
    drop(buf); // freed inline: the pool is gone
}
