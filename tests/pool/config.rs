//! Building a pool: settings out of range are errors, and configuration
//! text (`PINPOOL_CONF`'s form) sets values, skipping or, when strict,
//! naming the bad pairs.

use pinpool::{BackendKind, Error, Pool};

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
fn builder_rejects_a_cap_below_one_buffer() {
    let built = Pool::builder()
        .backend(pinpool::BackendKind::Host)
        .max_pooled_bytes(100)
        .build();
    assert!(matches!(built, Err(Error::InvalidConfig(_))));
}

#[test]
fn strict_conf_names_the_bad_pair_and_applies_nothing() {
    for bad in [
        "cleaner_threads=0,max_pooled_bytes=32GiB",
        "max_pooled_bytes=32GiB,nope=1",
        "backend=gpu",
        "idle_trim=0s",
        "borrow=101",
        "devices",
    ] {
        match pinpool::Pool::builder().try_conf(bad) {
            Err(pinpool::Error::Setting { pair, .. }) => {
                assert!(bad.contains(&pair), "{pair} not in {bad}")
            }
            Err(other) => panic!("{bad}: {other}"),
            Ok(_) => panic!("{bad}: accepted"),
        }
    }
}

#[test]
fn conf_text_sets_values_and_skips_bad_pairs() {
    let pool = pinpool::Pool::builder()
        .conf("backend=host,devices=2, thread_cache_bytes=1MiB, cleaner_threads=0, max_pooled_bytes=3GiB, nope=1")
        .build()
        .unwrap();
    let config = pool.config();
    assert_eq!(config.devices, Some(2));
    assert_eq!(config.thread_cache_bytes, 1 << 20);
    assert_eq!(config.max_pooled_bytes, Some(3 << 30));
    assert_eq!(
        config.cleaner_threads,
        pinpool::Config::default().cleaner_threads,
        "a bad value keeps the default"
    );
    assert_eq!(pool.stats().devices, 2);
}
