//! `PinnedAlloc`: collections whose memory is pooled buffers. Allocating
//! takes, freeing drops through the cleaner (which waits for the copies
//! recorded for the allocation, or synchronizes the device), growing takes
//! a longer buffer and copies, and every allocation is zero and aligned as
//! asked up to a page.

use std::time::Duration;

use allocator_api2::alloc::{Allocator, Layout};
use allocator_api2::vec::Vec;
use pinpool::testing::TestFence;
use pinpool::{BackendKind, Error, PinnedAlloc, Pool, MAX_CLASS_SIZE};

use crate::common::{eventually, faulty};

fn host_pool() -> Pool {
    Pool::builder().backend(BackendKind::Host).build().unwrap()
}

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// Vectors grown one chunk at a time from empty to 64 MiB on several
/// threads at once keep every element, and give all their memory back.
#[test]
fn vecs_grow_from_empty_to_64_mib_on_several_threads() {
    const THREADS: u64 = 4;
    const ELEMS: usize = (64 << 20) / 8;
    let (pool, _faults) = faulty(2);
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let alloc = alloc.clone();
            s.spawn(move || {
                let mut v: Vec<u64, PinnedAlloc> = Vec::new_in(alloc.clone());
                let mut moves = 0;
                let chunk: std::vec::Vec<u64> = (0..4096).collect();
                while v.len() < ELEMS {
                    let before = v.as_ptr();
                    let base = (t << 32) + v.len() as u64;
                    v.extend(chunk.iter().map(|i| base + i));
                    moves += usize::from(before != v.as_ptr());
                    alloc.set_dirty_len(v.as_ptr(), v.len() * 8).unwrap();
                }
                assert_eq!(v.len(), ELEMS);
                assert!(moves > 10, "the vector moved only {moves} times");
                for (i, &x) in v.iter().enumerate() {
                    assert_eq!(x, (t << 32) + i as u64, "element {i} of thread {t}");
                }
            });
        }
    });
    assert_eq!(alloc.allocations(), 0);
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.in_use_bytes, 0, "{stats}");
    assert!(stats.pooled_buffers > 0, "{stats}");
}

/// A vector is grown in one thread and freed in another.
#[test]
fn a_vec_freed_on_another_thread_goes_back_to_the_pool() {
    let pool = host_pool();
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    let mut v: Vec<u8, PinnedAlloc> = Vec::with_capacity_in(1 << 20, alloc.clone());
    v.resize(1 << 20, 3);
    std::thread::spawn(move || drop(v)).join().unwrap();
    assert_eq!(alloc.allocations(), 0);
    pool.flush();
    let again: Vec<u8, PinnedAlloc> = Vec::with_capacity_in(1 << 20, alloc);
    assert_eq!(pool.stats().hits, 1, "the freed buffer was not reused");
    drop(again);
}

/// Zeroed allocations are zero, also from buffers written and freed.
#[test]
fn zeroed_allocations_are_zero_after_reuse() {
    let pool = host_pool();
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    for size in [1, 100, 4096, 5000, 1 << 20] {
        let layout = Layout::from_size_align(size, 1).unwrap();
        for round in 0..2 {
            let block = alloc.allocate_zeroed(layout).unwrap();
            assert!(block.len() >= size);
            // SAFETY: the block is ours, `block.len()` bytes long.
            let bytes =
                unsafe { std::slice::from_raw_parts_mut(block.cast::<u8>().as_ptr(), block.len()) };
            assert!(bytes.iter().all(|&b| b == 0), "{size} bytes, round {round}");
            bytes.fill(0xa5);
            // SAFETY: allocated above with `layout`.
            unsafe { alloc.deallocate(block.cast(), layout) };
            pool.flush();
        }
    }
    assert!(pool.stats().hits >= 5);
}

/// Every alignment up to a page is honoured, at every size; a larger one
/// is an allocation error, and takes nothing.
#[test]
fn alignments_up_to_a_page_are_honoured_and_larger_fail() {
    let pool = host_pool();
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    let mut align = 1;
    while align <= page() {
        for size in [0, 1, 24, 100, 300, 1000, 4096, 5000, 70_000] {
            let layout = Layout::from_size_align(size, align).unwrap();
            let block = alloc.allocate(layout).unwrap();
            let addr = block.cast::<u8>().as_ptr() as usize;
            assert_eq!(addr % align, 0, "{size} bytes at {addr:#x}, align {align}");
            assert!(block.len() >= size);
            // SAFETY: allocated above with `layout`.
            unsafe { alloc.deallocate(block.cast(), layout) };
        }
        align *= 2;
    }
    let takes = pool.stats().hits + pool.stats().misses;
    for size in [0, 1, 1 << 20] {
        let layout = Layout::from_size_align(size, 2 * page()).unwrap();
        assert!(alloc.allocate(layout).is_err(), "{size} bytes at two pages");
    }
    let huge = Layout::from_size_align(MAX_CLASS_SIZE + 1, 1).unwrap();
    assert!(alloc.allocate(huge).is_err());
    let stats = pool.stats();
    assert_eq!(stats.hits + stats.misses, takes, "a failed allocation took");
    assert_eq!(alloc.allocations(), 0);
}

/// A vector's `try_reserve` past the largest class fails with an error
/// and keeps the vector as it was.
#[test]
fn a_failed_growth_keeps_the_vector() {
    let pool = host_pool();
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    let mut v: Vec<u8, PinnedAlloc> = Vec::new_in(alloc.clone());
    v.extend_from_slice(b"kept");
    assert!(v.try_reserve(MAX_CLASS_SIZE + 1).is_err());
    assert_eq!(&v[..], b"kept");
    assert_eq!(alloc.allocations(), 1);
}

/// Growing keeps the contents and frees the old buffer; shrinking to a
/// small fraction moves to a shorter buffer and frees the long one.
#[test]
fn growing_and_shrinking_move_between_buffers() {
    let pool = host_pool();
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    let mut v: Vec<u32, PinnedAlloc> = Vec::with_capacity_in(1000, alloc.clone());
    v.extend(0..1000);
    let first = v.as_ptr();
    // 4,000 bytes took a buffer of a page or more: growing to a page
    // stays in it.
    v.reserve_exact(24);
    v.extend(1000..1024);
    assert_eq!(v.as_ptr(), first, "a growth within the buffer moved");
    v.extend(1024..300_000);
    assert_ne!(v.as_ptr(), first);
    assert!(v.iter().copied().eq(0..300_000));
    assert_eq!(alloc.allocations(), 1);
    let before = pool.stats().in_use_bytes;
    assert!(before >= 300_000 * 4, "{before} bytes in use");
    v.truncate(10);
    v.shrink_to_fit();
    assert!(v.iter().copied().eq(0..10));
    assert_eq!(alloc.allocations(), 1);
    // The long buffer went back: what is in use now is one short buffer.
    let after = pool.stats().in_use_bytes;
    assert!(
        after > 0 && after < 4096,
        "{after} bytes in use after shrinking"
    );
    // Shrinking by less than half keeps the buffer.
    let mut w: Vec<u8, PinnedAlloc> = Vec::with_capacity_in(1 << 20, alloc.clone());
    w.resize(600 << 10, 1);
    let at = w.as_ptr();
    w.shrink_to_fit();
    assert_eq!(w.as_ptr(), at);
    assert_eq!(w.capacity(), 600 << 10);
}

/// A freed allocation waits for the copy recorded for it before its
/// buffer is reused.
#[test]
fn freeing_waits_for_the_recorded_copy() {
    let (pool, _faults) = faulty(1);
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    let v: Vec<u8, PinnedAlloc> = Vec::with_capacity_in(1 << 16, alloc.clone());
    let fence = TestFence::default();
    fence.record_in(&alloc, v.as_ptr()).unwrap();
    drop(v);
    assert_eq!(alloc.allocations(), 0);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        pool.stats().in_cleaner,
        1,
        "the allocation came back before its copy finished"
    );
    fence.complete();
    pool.flush();
    assert_eq!(pool.stats().in_cleaner, 0);
    assert_eq!(pool.stats().pooled_buffers, 1);
}

/// A pinned allocation freed with no copy recorded waits for a device
/// synchronize.
#[test]
fn freeing_without_a_recorded_copy_synchronizes_the_device() {
    let (pool, faults) = faulty(1);
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    drop(Vec::<u8, PinnedAlloc>::with_capacity_in(
        1 << 16,
        alloc.clone(),
    ));
    pool.flush();
    let v: Vec<u8, PinnedAlloc> = Vec::with_capacity_in(1 << 16, alloc.clone());
    assert!(alloc.is_pinned(v.as_ptr()).unwrap());
    let before = faults.synchronize_calls();
    faults.hold_synchronize();
    drop(v);
    // The synchronize blocks before it is counted; the buffer waits.
    std::thread::sleep(Duration::from_millis(200));
    let waiting = pool.stats();
    // Released before asserting, so that a failure does not leave the
    // cleaner blocked.
    faults.release();
    let back = eventually(Duration::from_secs(10), || pool.stats().pooled_buffers == 1);
    assert_eq!(
        waiting.in_cleaner, 1,
        "reused before the synchronize: {waiting}"
    );
    assert_eq!(waiting.pooled_buffers, 0);
    assert!(back, "not pooled after the synchronize");
    assert!(faults.synchronize_calls() > before);
}

/// A pointer that begins no live allocation of the allocator is an error:
/// inside one, freed, another allocator's, or a zero-sized one.
#[test]
fn unknown_pointers_are_errors() {
    let pool = host_pool();
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    let other = PinnedAlloc::new(&pool, 0).unwrap();
    let mut v: Vec<u64, PinnedAlloc> = Vec::with_capacity_in(100, alloc.clone());
    v.push(1);
    let inside = v[..].as_ptr().wrapping_add(1);
    assert!(matches!(
        alloc.set_dirty_len(inside, 0),
        Err(Error::UnknownAllocation { addr }) if addr == inside as usize
    ));
    assert!(other.is_pinned(v.as_ptr()).is_err());
    assert!(!alloc.is_pinned(v.as_ptr()).unwrap());
    let fence = TestFence::default();
    assert!(fence.record_in(&other, v.as_ptr()).is_err());
    let empty: Vec<u64, PinnedAlloc> = Vec::new_in(alloc.clone());
    assert!(alloc.set_dirty_len(empty.as_ptr(), 0).is_err());
    let freed = v.as_ptr();
    drop(v);
    let err = alloc.set_dirty_len(freed, 0).unwrap_err();
    assert!(err.to_string().contains("no live allocation"), "{err}");
}

/// The allocator names a device the pool serves, and takes from it.
#[test]
fn the_allocator_takes_from_its_device() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .devices(2)
        .build()
        .unwrap();
    assert!(matches!(
        PinnedAlloc::new(&pool, 2),
        Err(Error::UnknownDevice {
            device: 2,
            devices: 2
        })
    ));
    let alloc = PinnedAlloc::new(&pool, 1).unwrap();
    let v: Vec<u8, PinnedAlloc> = Vec::with_capacity_in(1 << 20, alloc.clone());
    drop(v);
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.per_device[1].pooled_buffers, 1, "{stats}");
    assert_eq!(stats.per_device[0].pooled_buffers, 0, "{stats}");
}

/// A narrowed dirty prefix is what the cleaner re-zeroes.
#[test]
fn a_narrowed_dirty_prefix_is_all_that_is_zeroed() {
    let pool = host_pool();
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    let mut v: Vec<u8, PinnedAlloc> = Vec::with_capacity_in(1 << 20, alloc.clone());
    v.extend_from_slice(&[7; 100]);
    alloc.set_dirty_len(v.as_ptr(), v.len()).unwrap();
    let before = pool.stats().bytes_zeroed;
    drop(v);
    pool.flush();
    assert_eq!(pool.stats().bytes_zeroed - before, 100);
    let again: Vec<u8, PinnedAlloc> = Vec::with_capacity_in(1 << 20, alloc.clone());
    // SAFETY: the capacity is allocated; u8 has no invalid values, and the
    // allocation is zero.
    let spare = unsafe { std::slice::from_raw_parts(again.as_ptr(), again.capacity()) };
    assert!(spare.iter().all(|&b| b == 0));
}
