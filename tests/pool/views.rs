//! Typed and prefix views at their edges: zero-sized types, out-of-range
//! prefixes and misalignment must panic clearly (a `pinpool:` message),
//! never misbehave.
#![allow(clippy::drop_non_drop)] // views are dropped to end their borrows

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::common::{host, host_pool};

fn panic_message(f: impl FnOnce()) -> String {
    let err = catch_unwind(AssertUnwindSafe(f)).expect_err("expected a panic");
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[derive(Clone, Copy)]
#[repr(C, align(8192))]
struct Page2([u8; 8192]);
// SAFETY: plain bytes, no padding (size == align == 8192).
unsafe impl bytemuck::Zeroable for Page2 {}
// SAFETY: as above.
unsafe impl bytemuck::Pod for Page2 {}

#[test]
fn zero_sized_types_panic_clearly() {
    let pool = host(1);
    let mut buf = pool.take(64);
    for msg in [
        panic_message(|| drop(buf.typed::<()>())),
        panic_message(|| drop(buf.typed_prefix::<[u32; 0]>(1))),
        panic_message(|| drop(buf.typed_mut::<()>())),
        panic_message(|| drop(buf.typed_prefix_mut::<()>(0))),
    ] {
        assert!(msg.starts_with("pinpool:"), "unclear panic: {msg:?}");
    }
    // The buffer is still usable after the caught panics.
    buf[0] = 1;
}

#[test]
fn out_of_range_prefixes_panic_clearly() {
    let pool = host(1);
    let mut buf = pool.take(100); // 128 bytes
    let len = buf.len();
    assert_eq!(buf.prefix(len).len(), len);
    assert_eq!(buf.prefix(0).len(), 0);
    for msg in [
        panic_message(|| drop(buf.prefix(len + 1))),
        panic_message(|| drop(buf.prefix(usize::MAX))),
        panic_message(|| drop(buf.typed_prefix::<u32>(len / 4 + 1))),
        // count * size overflows usize: must not wrap into "fits".
        panic_message(|| drop(buf.typed_prefix::<u64>(usize::MAX / 4 + 1))),
        panic_message(|| drop(buf.typed_prefix::<u64>(1usize << 61))),
        panic_message(|| drop(buf.prefix_mut(len + 1))),
    ] {
        assert!(msg.starts_with("pinpool:"), "unclear panic: {msg:?}");
    }
}

#[test]
fn typed_views_round_down_and_see_writes() {
    let pool = host(1);
    let mut buf = pool.take(10); // 16 bytes
    assert_eq!(buf.typed::<[u8; 3]>().len(), 5);
    assert_eq!(buf.typed::<u64>().len(), 2);
    assert_eq!(buf.typed::<[u64; 4]>().len(), 0);
    buf.typed_mut::<u32>()[3] = 0xDEADBEEF;
    assert_eq!(buf[12..16], 0xDEADBEEFu32.to_ne_bytes());
    assert_eq!(buf.typed_prefix::<u32>(4)[3], 0xDEADBEEF);
    let small = pool.take(3); // 4 bytes, page-aligned
    assert_eq!(small.typed::<u64>().len(), 0);
}

#[test]
fn over_aligned_types_panic_clearly_or_work() {
    let pool = host(1);
    for size in [8192usize, 16384, 1 << 20] {
        let buf = pool.take(size);
        let aligned = (buf.as_ptr() as usize).is_multiple_of(8192);
        let r = catch_unwind(AssertUnwindSafe(|| buf.typed::<Page2>().len()));
        match r {
            Ok(n) => assert!(aligned && n == buf.len() / 8192),
            Err(e) => {
                let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
                assert!(!aligned && msg.starts_with("pinpool:"), "{msg:?}");
            }
        }
    }
}

#[test]
fn typed_views_cover_whole_elements() {
    let pool = host_pool(1);
    let mut buf = pool.take(10); // 16 bytes
    buf.typed_mut::<u64>()[1] = u64::MAX;
    assert_eq!(buf.typed::<u64>().len(), 2);
    assert_eq!(
        buf.typed::<[u8; 3]>().len(),
        5,
        "the 1-byte tail is left out"
    );
    assert!(buf[..8].iter().all(|&b| b == 0) && buf[8..].iter().all(|&b| b == 0xFF));
}
