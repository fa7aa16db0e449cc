//! Every take is all zero: a recycled buffer is zeroed again up to its dirty
//! length, in chunks when it is large (with streaming stores from 32 MiB,
//! whether the cleaner recycles it or sheds it back to its region), and
//! small dirty prefixes around the fixed-store zeroing's boundaries are
//! zeroed whole.

use crate::common::{all_zero, first_nonzero, host, host_pool, host_pow2};

#[test]
fn recycled_buffer_is_reused_and_rezeroed() {
    let pool = host_pool(1);
    let mut buf = pool.take(8192);
    let ptr = buf.as_ptr();
    buf.fill(0xAB);
    drop(buf);
    pool.flush();
    let buf = pool.take(8192);
    assert_eq!(buf.as_ptr(), ptr, "a pool hit reuses the allocation");
    assert!(all_zero(&buf), "recycled buffer not re-zeroed");
    let stats = pool.stats();
    assert_eq!((stats.hits, stats.misses), (1, 1));
    assert_eq!(stats.recycled, 1);
    assert_eq!(stats.bytes_zeroed, 8192);
}

#[test]
fn dirty_len_limits_rezeroing_and_is_clamped() {
    let pool = host_pool(1);
    let mut buf = pool.take(1 << 16);
    buf[..100].fill(7);
    buf.set_dirty_len(100);
    assert_eq!(buf.dirty_len(), 100);
    drop(buf);
    pool.flush();
    assert_eq!(pool.stats().bytes_zeroed, 100);

    let mut buf = pool.take(1 << 16);
    assert!(all_zero(&buf));
    buf.fill(9);
    buf.set_dirty_len(usize::MAX);
    assert_eq!(buf.dirty_len(), 1 << 16, "past the end clamps to len()");
    drop(buf);
    pool.flush();
    assert!(all_zero(&pool.take(1 << 16)));
}

#[test]
fn large_buffers_are_cleaned_in_chunks_completely() {
    let pool = host_pool(1);
    let mut buf = pool.take(64 << 20);
    buf.fill(0x5A);
    let ptr = buf.as_ptr();
    drop(buf);
    pool.flush();
    let buf = pool.take(64 << 20);
    assert_eq!(buf.as_ptr(), ptr);
    assert!(
        all_zero(&buf),
        "some chunk of a large buffer was not re-zeroed"
    );
}

/// A dirty prefix long enough to be zeroed with streaming stores (32 MiB
/// or more), ending inside a 64-byte line and inside a chunk: every byte of
/// it zero again, the line's last bytes included.
#[test]
fn a_long_dirty_prefix_ending_mid_line_is_rezeroed_whole() {
    let pool = host_pool(1);
    let dirty = (40 << 20) + 37;
    let mut buf = pool.take(64 << 20);
    buf[..dirty].fill(0xC3);
    buf.set_dirty_len(dirty);
    let ptr = buf.as_ptr();
    drop(buf);
    pool.flush();
    let buf = pool.take(64 << 20);
    assert_eq!(buf.as_ptr(), ptr);
    let left = first_nonzero(&buf);
    assert!(
        left.is_none(),
        "byte {left:?} of the dirty prefix is not zero"
    );
    assert_eq!(pool.stats().bytes_zeroed, dirty as u64);
}

/// A pinned buffer carved from a region, dropped with a dirty prefix longer
/// than the cleaner's zeroing backlog allows (with the cap at 0, 64 MiB):
/// shed, released in bulk, its prefix zeroed (with streaming stores: it is
/// over 32 MiB, ending mid-line) as it goes back to its region, whose later
/// carves must be all-zero.
#[cfg(feature = "testing")]
#[test]
fn a_shed_buffer_goes_back_to_its_region_all_zero() {
    const M: usize = 1 << 20;
    let (builder, _faults) = crate::common::faulty_builder(2);
    let pool = builder.regions(true).build().unwrap();
    for _ in 0..2 {
        drop(pool.take(128 * M));
        pool.flush();
    }
    // Out of the region throughout, so that it stays listed while the
    // shed buffer goes back to it.
    let _kept = pool.take(16 * M);
    pool.set_max_pooled_bytes(0);
    for dirty in [(100 * M) + 37, (96 * M) + 1, 128 * M] {
        let skipped = pool.stats().zeroing_skipped;
        let mut buf = pool.take(128 * M);
        assert!(buf.is_pinned());
        buf[..dirty].fill(0xEE);
        buf.set_dirty_len(dirty);
        drop(buf);
        pool.flush();
        assert_eq!(
            pool.stats().zeroing_skipped,
            skipped + 1,
            "the buffer was not shed"
        );
        // Each back to the region (the cap is 0) before the next carves.
        for size in [128 * M, 64 * M, 100 * M] {
            let b = pool.take(size);
            assert!(b.is_pinned(), "a take of {size} did not carve");
            let left = first_nonzero(&b);
            assert!(
                left.is_none(),
                "a take of {size}: byte {left:?} is not zero"
            );
            drop(b);
            pool.flush();
        }
    }
}

/// Dirty prefixes around the fixed-store zeroing's boundaries (16, 32, 64
/// bytes), re-zeroed by the owner on its next take.
#[test]
fn small_dirty_prefixes_are_fully_rezeroed() {
    let pool = host_pow2(1);
    for &size in &[32usize, 64, 128, 4096] {
        for n in [
            1usize, 7, 15, 16, 17, 24, 31, 32, 33, 40, 47, 48, 49, 63, 64, 65, 96, 127,
        ] {
            if n > size {
                continue;
            }
            let mut b = pool.take(size);
            assert_eq!(b.len(), size);
            for (i, x) in b[..n].iter_mut().enumerate() {
                *x = (i as u8) | 0x80;
            }
            b.set_dirty_len(n);
            assert_eq!(b.dirty_len(), n);
            let p = b.as_ptr();
            drop(b);
            let b = pool.take(size);
            if b.as_ptr() == p {
                assert!(
                    all_zero(&b),
                    "class {size}, dirty {n}: bytes left: {:?}",
                    b.iter()
                        .enumerate()
                        .filter(|(_, &x)| x != 0)
                        .map(|(i, _)| i)
                        .collect::<Vec<_>>()
                );
            } else {
                assert!(
                    all_zero(&b),
                    "class {size}, dirty {n}: another buffer, non-zero"
                );
            }
            drop(b);
        }
    }
}

#[test]
fn set_dirty_len_edges() {
    let pool = host(1);
    let mut buf = pool.take(4096);
    buf.set_dirty_len(usize::MAX);
    assert_eq!(buf.dirty_len(), 4096);
    buf.set_dirty_len(0);
    assert_eq!(buf.dirty_len(), 0);
    drop(buf);
    pool.flush();
    // Written bytes inside the dirty prefix come back zero, whatever the path
    // (the owner's own re-zeroing, the cleaner, a thief).
    for dirty in [1usize, 4096, 64 << 10, (64 << 10) + 1, 1 << 20] {
        let mut buf = pool.take(dirty);
        buf[..dirty].fill(0xFF);
        buf.set_dirty_len(dirty);
        drop(buf);
        let again = pool.take(dirty);
        assert!(all_zero(&again), "dirty {dirty}: non-zero bytes handed out");
        drop(again);
        pool.flush();
        let p = pool.clone();
        let b = std::thread::spawn(move || p.take(dirty)).join().unwrap();
        assert!(all_zero(&b), "dirty {dirty}, other thread: non-zero bytes");
    }
}
