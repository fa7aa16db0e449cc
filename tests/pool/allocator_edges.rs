//! `PinnedAlloc` at the edges of the `Allocator` contract: failed shrinks
//! and growths keep the block, alignments above a page fail on every path,
//! narrowed dirty prefixes never leave non-zero memory in the pool, copies
//! recorded before a move still gate the old buffer, and allocations come
//! back whatever happens to the pool or the threads.

use std::time::Duration;

use allocator_api2::alloc::{Allocator, Layout};
use allocator_api2::boxed::Box;
use allocator_api2::vec::Vec;
use pinpool::testing::TestFence;
use pinpool::{BackendKind, PinnedAlloc, Pool, SizeClasses};

use crate::common::faulty;

fn host_pool() -> Pool {
    Pool::builder().backend(BackendKind::Host).build().unwrap()
}

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// The offsets of the non-zero bytes of `len` bytes at `ptr`: the first
/// few, and how many there are.
///
/// # Safety
/// `ptr` is valid for reads of `len` bytes.
unsafe fn nonzero(ptr: *const u8, len: usize) -> (usize, std::vec::Vec<usize>) {
    // SAFETY: forwarded.
    let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
    let all: std::vec::Vec<usize> = (0..len).filter(|&i| bytes[i] != 0).collect();
    (all.len(), all.into_iter().take(4).collect())
}

/// A zeroed block for `layout`, freed again: its address, and its non-zero
/// bytes as [`nonzero`] counts them.
fn zeroed_block(alloc: &PinnedAlloc, layout: Layout) -> (usize, usize, std::vec::Vec<usize>) {
    let block = alloc.allocate_zeroed(layout).unwrap();
    let ptr = block.cast::<u8>().as_ptr();
    // SAFETY: the block is ours, `block.len()` bytes long.
    let (count, first) = unsafe { nonzero(ptr, block.len()) };
    // SAFETY: allocated above with `layout`, not used after.
    unsafe { alloc.deallocate(block.cast(), layout) };
    (ptr as usize, count, first)
}

// === the Allocator trait's contract ===

/// `shrink` returning `Err` leaves the block allocated ("ownership of the
/// memory block has not been transferred to this allocator"), also for a
/// shrink to a zero-sized layout whose alignment is above a page: the
/// block must not be freed and handed to someone else.
#[test]
fn a_failed_shrink_to_zero_size_keeps_the_block() {
    let pool = host_pool();
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    let layout = Layout::from_size_align(4096, 8).unwrap();
    let block = alloc.allocate(layout).unwrap();
    let ptr = block.cast::<u8>();
    // SAFETY: the block is ours, at least 4096 bytes.
    unsafe { ptr.as_ptr().write_bytes(0x5a, 4096) };
    let zero_big_align = Layout::from_size_align(0, 2 * page()).unwrap();
    // SAFETY: `ptr` is live, `layout` fits it, 0 <= 4096.
    let shrunk = unsafe { alloc.shrink(ptr, layout, zero_big_align) };
    assert!(shrunk.is_err(), "an alignment above a page is an error");
    let live = alloc.allocations();
    let in_use = pool.stats().in_use_bytes;
    // The pool may now hand the caller's block to another allocation.
    pool.flush();
    let other = alloc.allocate(layout).unwrap();
    let reused = other.cast::<u8>() == ptr;
    assert!(
        live == 1 && in_use >= 4096 && !reused,
        "shrink returned Err but freed the block: {live} live allocations, \
         {in_use} bytes in use, the block handed out again: {reused}"
    );
}

/// Alignments above a page are an error in `grow` and `shrink` as in
/// `allocate`, wherever the pool put the buffer (a block that happens to
/// sit at a two-page boundary included).
#[test]
fn an_over_page_alignment_is_an_error_in_grow_too() {
    let pool = host_pool();
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    let big = Layout::from_size_align(page(), 2 * page()).unwrap();
    assert!(alloc.allocate(big).is_err());
    let small = Layout::from_size_align(page(), 8).unwrap();
    let mut kept = std::vec::Vec::new();
    let mut found = None;
    for _ in 0..64 {
        let block = alloc.allocate(small).unwrap();
        if (block.cast::<u8>().as_ptr() as usize).is_multiple_of(2 * page()) {
            found = Some(block);
            break;
        }
        kept.push(block);
    }
    let block = found.expect("no block at a two-page boundary in 64 tries");
    // SAFETY: `block` is live and `small` fits it; sizes are equal.
    let grown = unsafe { alloc.grow(block.cast(), small, big) };
    let outcome = grown.is_ok();
    let ptr = grown.map_or(block.cast(), |b| b.cast());
    // SAFETY: allocated above with `small` (or grown to `big`, which fits).
    unsafe { alloc.deallocate(ptr, small) };
    for b in kept {
        // SAFETY: allocated above with `small`.
        unsafe { alloc.deallocate(b.cast(), small) };
    }
    assert!(
        !outcome,
        "grow to a {}-byte alignment succeeded, while allocate of it fails",
        2 * page()
    );
}

/// Every alignment up to a page is honoured on every path a buffer can
/// come from: pooled, borrowed from a larger class, carved from a region,
/// slab siblings (pinned on the fault backend), both size-class tables.
/// (The allocator's `debug_assert!` on a misaligned buffer would panic.)
#[test]
fn alignments_hold_on_every_take_path() {
    let pools: std::vec::Vec<(&str, Pool)> = vec![
        ("fine", host_pool()),
        (
            "pow2",
            Pool::builder()
                .backend(BackendKind::Host)
                .size_classes(SizeClasses::PowersOfTwo)
                .build()
                .unwrap(),
        ),
        (
            "regions",
            Pool::builder()
                .backend(BackendKind::Host)
                .regions(true)
                .build()
                .unwrap(),
        ),
        ("faulty", faulty(1).0),
    ];
    let sizes = [
        1, 7, 24, 100, 255, 256, 257, 300, 1000, 2048, 3000, 4095, 4096, 4097, 5000, 9000, 70_000,
    ];
    for (name, pool) in pools {
        let alloc = PinnedAlloc::new(&pool, 0).unwrap();
        for round in 0..3 {
            let mut live = std::vec::Vec::new();
            let mut align = 1;
            while align <= page() {
                for &size in &sizes {
                    let layout = Layout::from_size_align(size, align).unwrap();
                    let block = alloc.allocate(layout).unwrap();
                    let addr = block.cast::<u8>().as_ptr() as usize;
                    assert_eq!(
                        addr % align,
                        0,
                        "{name} round {round}: {size} bytes, align {align}"
                    );
                    assert!(block.len() >= size);
                    // SAFETY: the block is ours, `block.len()` bytes long.
                    let (count, first) =
                        unsafe { nonzero(block.cast::<u8>().as_ptr(), block.len()) };
                    assert_eq!(
                        count, 0,
                        "{name} round {round}: {size}/{align} not zero at {first:?}"
                    );
                    // SAFETY: as above.
                    unsafe { block.cast::<u8>().as_ptr().write_bytes(0xee, block.len()) };
                    live.push((block, layout));
                }
                align *= 2;
            }
            for (block, layout) in live {
                // SAFETY: allocated above with `layout`.
                unsafe { alloc.deallocate(block.cast(), layout) };
            }
            pool.flush();
        }
    }
}

/// A type aligned to a page, and a zero-sized one aligned past a page, in
/// `Box`es: the first allocates an aligned page, the second nothing.
#[test]
fn boxes_of_page_aligned_and_over_aligned_zero_sized_types() {
    #[repr(align(4096))]
    struct PageAligned([u8; 16]);
    #[repr(align(512))]
    struct Sector([u8; 512]);
    #[repr(align(8192))]
    struct Marker;
    let pool = host_pool();
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    let a = Box::new_in(PageAligned([3; 16]), alloc.clone());
    assert_eq!((&*a as *const PageAligned as usize) % 4096, 0);
    assert_eq!(a.0, [3; 16]);
    let s = Box::new_in(Sector([4; 512]), alloc.clone());
    assert_eq!((&*s as *const Sector as usize) % 512, 0);
    assert!(s.0.iter().all(|&b| b == 4));
    let m = Box::new_in(Marker, alloc.clone());
    assert_eq!((&*m as *const Marker as usize) % 8192, 0);
    assert_eq!(alloc.allocations(), 2);
    drop((a, s, m));
    assert_eq!(alloc.allocations(), 0);
}

/// `grow_zeroed` after a shrink that moved: the bytes past the old size
/// are zero, the kept ones are kept.
#[test]
fn grow_zeroed_after_a_moving_shrink_is_zero_past_the_old_size() {
    let pool = host_pool();
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    let big = Layout::from_size_align(1 << 16, 8).unwrap();
    let block = alloc.allocate(big).unwrap();
    // SAFETY: the block is ours.
    unsafe { block.cast::<u8>().as_ptr().write_bytes(0x11, block.len()) };
    let small = Layout::from_size_align(100, 8).unwrap();
    // SAFETY: live, fits, 100 <= 65536.
    let shrunk = unsafe { alloc.shrink(block.cast(), big, small) }.unwrap();
    // SAFETY: live, `small` fits, 5000 >= 100.
    let grown = unsafe {
        alloc.grow_zeroed(
            shrunk.cast(),
            small,
            Layout::from_size_align(5000, 8).unwrap(),
        )
    }
    .unwrap();
    let p = grown.cast::<u8>().as_ptr();
    // SAFETY: the block is ours, `grown.len()` bytes long.
    let bytes = unsafe { std::slice::from_raw_parts(p, grown.len()) };
    assert!(bytes[..100].iter().all(|&b| b == 0x11));
    // Bytes between 100 and the shrunk block's length may be kept; past
    // it they are zero.
    assert!(bytes[shrunk.len().max(100)..].iter().all(|&b| b == 0));
    // SAFETY: allocated with a layout of 5000 bytes.
    unsafe { alloc.deallocate(grown.cast(), Layout::from_size_align(5000, 8).unwrap()) };
}

// === zeroing: set_dirty_len and growth ===

/// `set_dirty_len` after each `extend`: `extend` fills the allocation up
/// to its capacity *before* it grows, writing past the narrowed prefix, so
/// the move must free the old allocation wholly dirty; otherwise the
/// cleaner re-zeroes only the prefix, and the next allocation of the size
/// (`allocate_zeroed` included) is not zero.
#[test]
fn a_moving_grow_frees_the_old_block_wholly_dirty() {
    let pool = host_pool();
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    let mut v: Vec<u64, PinnedAlloc> = Vec::with_capacity_in(512, alloc.clone());
    let first = v.as_ptr() as usize;
    v.extend(std::iter::repeat_n(u64::MAX, 256));
    // True when said: 2048 bytes written.
    alloc.set_dirty_len(v.as_ptr(), v.len() * 8).unwrap();
    // Fills elements 256..512 of the first allocation, then grows.
    v.extend(std::iter::repeat_n(u64::MAX, 512));
    assert_ne!(v.as_ptr() as usize, first, "the vector did not move");
    drop(v);
    pool.flush();
    let layout = Layout::from_size_align(4096, 8).unwrap();
    let mut dirty = std::vec::Vec::new();
    let mut blocks = std::vec::Vec::new();
    for _ in 0..4 {
        let block = alloc.allocate_zeroed(layout).unwrap();
        // SAFETY: the block is ours, `block.len()` bytes long.
        let (count, at) = unsafe { nonzero(block.cast::<u8>().as_ptr(), block.len()) };
        if count > 0 {
            dirty.push((block.cast::<u8>().as_ptr() as usize == first, count, at));
        }
        blocks.push(block);
    }
    for b in blocks {
        // SAFETY: allocated above with `layout`.
        unsafe { alloc.deallocate(b.cast(), layout) };
    }
    assert!(
        dirty.is_empty(),
        "allocate_zeroed returned non-zero blocks (was the first allocation, \
         non-zero bytes, first offsets): {dirty:?}"
    );
}

/// The same through `grow_zeroed`, whose bytes past the old block's
/// length must be zero, also when it moves into the size that a growth
/// with a narrowed prefix gave back.
#[test]
fn grow_zeroed_after_a_narrowed_growth_is_zero() {
    let pool = host_pool();
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    let mut v: Vec<u8, PinnedAlloc> = Vec::with_capacity_in(4096, alloc.clone());
    v.push(1);
    alloc.set_dirty_len(v.as_ptr(), 1).unwrap();
    v.resize(4096, 0xcd); // fills the block, still in place
    v.push(2); // grows: moves, freeing the block dirty but for byte 0
    drop(v);
    pool.flush();
    let small = Layout::from_size_align(16, 1).unwrap();
    let a = alloc.allocate(small).unwrap();
    // SAFETY: live, fits, 4096 >= 16.
    let g =
        unsafe { alloc.grow_zeroed(a.cast(), small, Layout::from_size_align(4096, 1).unwrap()) }
            .unwrap();
    // SAFETY: the block is ours, `g.len()` bytes long.
    let bytes = unsafe { std::slice::from_raw_parts(g.cast::<u8>().as_ptr(), g.len()) };
    let bad = bytes[a.len()..].iter().filter(|&&b| b != 0).count();
    // SAFETY: allocated with a 4096-byte layout.
    unsafe { alloc.deallocate(g.cast(), Layout::from_size_align(4096, 1).unwrap()) };
    assert_eq!(
        bad, 0,
        "grow_zeroed returned {bad} non-zero bytes past the old block"
    );
}

/// A growth within the buffer's length, which does not move, makes the
/// allocation wholly dirty again as a moving one does: what the collection
/// writes past the old narrowed prefix is re-zeroed.
#[test]
fn a_growth_in_place_makes_the_allocation_wholly_dirty() {
    let pool = host_pool();
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    let mut v: Vec<u8, PinnedAlloc> = Vec::with_capacity_in(3000, alloc.clone());
    v.extend_from_slice(&[1; 100]);
    alloc.set_dirty_len(v.as_ptr(), v.len()).unwrap(); // true now
    let at = v.as_ptr();
    v.reserve_exact(4096 - v.len()); // a growth: in place, in the 4 KiB buffer
    assert_eq!(v.as_ptr(), at, "the growth moved");
    v.resize(4096, 0xab);
    drop(v);
    pool.flush();
    let (addr, count, first) = zeroed_block(&alloc, Layout::from_size_align(4096, 1).unwrap());
    let same = addr == at as usize;
    assert_eq!(
        count, 0,
        "allocate_zeroed (same buffer: {same}) returned {count} non-zero bytes, first at {first:?}"
    );
}

/// The same after a shrink that keeps the block and a later growth within
/// it.
#[test]
fn a_shrink_in_place_then_growth_makes_the_allocation_wholly_dirty() {
    let pool = host_pool();
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    let mut v: Vec<u8, PinnedAlloc> = Vec::with_capacity_in(1 << 20, alloc.clone());
    v.resize(600 << 10, 0);
    v.truncate(10);
    alloc.set_dirty_len(v.as_ptr(), 10).unwrap(); // only zeros written anyway
    v.resize(600 << 10, 0); // (resize writes zeros: still clean)
    v.shrink_to_fit(); // in place: more than half
    let at = v.as_ptr();
    v.reserve_exact((1 << 20) - v.len()); // in place
    assert_eq!(v.as_ptr(), at);
    v.resize(1 << 20, 0x77);
    drop(v);
    pool.flush();
    let (_, count, first) = zeroed_block(&alloc, Layout::from_size_align(1 << 20, 1).unwrap());
    assert_eq!(count, 0, "{count} non-zero bytes, first at {first:?}");
}

// === fences ===

/// A copy recorded for an allocation, then a growth that moves it: the old
/// buffer is not reused until the copy has finished.
#[test]
fn a_moving_growth_keeps_the_old_buffer_waiting_for_its_copy() {
    let (pool, _faults) = faulty(1);
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    let mut v: Vec<u8, PinnedAlloc> = Vec::with_capacity_in(1 << 16, alloc.clone());
    v.resize(1 << 16, 9);
    let fence = TestFence::default();
    fence.record_in(&alloc, v.as_ptr()).unwrap();
    let old = v.as_ptr() as usize;
    v.reserve(1 << 17);
    assert_ne!(v.as_ptr() as usize, old);
    std::thread::sleep(Duration::from_millis(50));
    let mut reused = false;
    let mut taken = std::vec::Vec::new();
    for _ in 0..8 {
        let b = pool.take(1 << 16);
        reused |= b.as_ptr() as usize == old;
        taken.push(b);
    }
    let layout = Layout::from_size_align(1 << 16, 1).unwrap();
    for _ in 0..8 {
        let b = alloc.allocate(layout).unwrap();
        reused |= b.cast::<u8>().as_ptr() as usize == old;
        // SAFETY: allocated above.
        unsafe { alloc.deallocate(b.cast(), layout) };
    }
    fence.complete();
    pool.flush();
    assert!(
        !reused,
        "the old buffer was reused before its copy finished"
    );
    drop(taken);
    drop(v);
}

/// The same for a shrink that moves.
#[test]
fn a_moving_shrink_keeps_the_old_buffer_waiting_for_its_copy() {
    let (pool, _faults) = faulty(1);
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    let mut v: Vec<u8, PinnedAlloc> = Vec::with_capacity_in(1 << 16, alloc.clone());
    v.resize(1 << 16, 9);
    let fence = TestFence::default();
    fence.record_in(&alloc, v.as_ptr()).unwrap();
    let old = v.as_ptr() as usize;
    v.truncate(10);
    v.shrink_to_fit();
    assert_ne!(v.as_ptr() as usize, old);
    std::thread::sleep(Duration::from_millis(50));
    let mut reused = false;
    let mut taken = std::vec::Vec::new();
    for _ in 0..8 {
        let b = pool.take(1 << 16);
        reused |= b.as_ptr() as usize == old;
        taken.push(b);
    }
    fence.complete();
    assert!(
        !reused,
        "the old buffer was reused before its copy finished"
    );
    drop(taken);
}

// === lifecycle, leaks, threads ===

/// Allocations never freed are given back when the last clone of the
/// allocator goes, also after the pool's own handles are gone.
#[test]
fn allocations_left_in_a_dropped_allocator_are_given_back() {
    let (pool, faults) = faulty(1);
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    // Pinned buffers: a round trip through the cleaner first.
    for size in [100, 4096, 1 << 20] {
        let layout = Layout::from_size_align(size, 8).unwrap();
        let b = alloc.allocate(layout).unwrap();
        // SAFETY: allocated above.
        unsafe { alloc.deallocate(b.cast(), layout) };
    }
    pool.flush();
    for size in [100, 4096, 1 << 20] {
        let b = alloc
            .allocate(Layout::from_size_align(size, 8).unwrap())
            .unwrap();
        // SAFETY: the block is ours.
        unsafe { b.cast::<u8>().as_ptr().write_bytes(1, size) };
    }
    assert_eq!(alloc.allocations(), 3);
    let stats = pool.stats();
    assert!(stats.in_use_bytes > 0);
    drop(pool);
    drop(alloc);
    assert!(
        crate::common::state_freed(&faults, Duration::from_secs(10)),
        "the pool's state was not freed"
    );
    assert_eq!(
        faults.registered(),
        faults.unregistered(),
        "a registration leaked"
    );
}

/// Allocations freed after `shutdown` and `clear` go back, and later
/// allocations are zero.
#[test]
fn freeing_after_shutdown_and_clear() {
    let (pool, _faults) = faulty(2);
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    let mut a: Vec<u32, PinnedAlloc> = Vec::new_in(alloc.clone());
    a.extend(1..100_000);
    let mut b: Vec<u8, PinnedAlloc> = Vec::with_capacity_in(5000, alloc.clone());
    b.resize(5000, 0xff);
    pool.shutdown();
    drop(a);
    pool.clear();
    drop(b);
    pool.flush();
    assert_eq!(alloc.allocations(), 0);
    assert_eq!(pool.stats().in_use_bytes, 0, "{}", pool.stats());
    for size in [5000, 100_000 * 4, 1 << 19] {
        let (_, count, _) = zeroed_block(&alloc, Layout::from_size_align(size, 4).unwrap());
        assert_eq!(count, 0);
    }
}

/// Vectors made on one thread, grown on a second and freed on a third,
/// through clones of one allocator, on a pool with a small cap: nothing is
/// lost, every element kept, everything given back.
#[test]
fn vecs_handed_between_threads_through_clones() {
    let pool = Pool::builder()
        .backend(BackendKind::Host)
        .max_pooled_bytes(1 << 20)
        .build()
        .unwrap();
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    let (to_grow, grow_rx) = std::sync::mpsc::sync_channel::<Vec<u64, PinnedAlloc>>(8);
    let (to_free, free_rx) = std::sync::mpsc::sync_channel::<Vec<u64, PinnedAlloc>>(8);
    std::thread::scope(|s| {
        let a = alloc.clone();
        s.spawn(move || {
            for i in 0..400u64 {
                let mut v = Vec::with_capacity_in((i as usize % 37) + 1, a.clone());
                v.extend(0..=i % 37);
                to_grow.send(v).unwrap();
            }
        });
        s.spawn(move || {
            for mut v in grow_rx {
                let n = v.len() as u64;
                v.extend(n..n + 3000);
                v.shrink_to_fit();
                to_free.send(v).unwrap();
            }
        });
        s.spawn(move || {
            for v in free_rx {
                assert!(v.iter().copied().eq(0..v.len() as u64));
                drop(v);
            }
        });
    });
    assert_eq!(alloc.allocations(), 0);
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.in_use_bytes, 0, "{stats}");
}

/// Collections in thread-locals, freed at thread exit, and a thread-local
/// whose destructor allocates and frees: no panic, nothing lost.
#[test]
fn allocating_and_freeing_in_thread_local_destructors() {
    use std::cell::RefCell;
    struct AllocOnDrop(Option<PinnedAlloc>);
    impl Drop for AllocOnDrop {
        fn drop(&mut self) {
            if let Some(alloc) = self.0.take() {
                let mut v: Vec<u64, PinnedAlloc> = Vec::new_in(alloc);
                v.extend(0..10_000);
                assert_eq!(v[9_999], 9_999);
            }
        }
    }
    thread_local! {
        static KEPT: RefCell<Option<Vec<u8, PinnedAlloc>>> = const { RefCell::new(None) };
        static LATE: RefCell<AllocOnDrop> = const { RefCell::new(AllocOnDrop(None)) };
    }
    let (pool, _faults) = faulty(1);
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    for _ in 0..4 {
        let a = alloc.clone();
        std::thread::spawn(move || {
            LATE.with(|l| l.borrow_mut().0 = Some(a.clone()));
            let mut v = Vec::with_capacity_in(1 << 16, a);
            v.resize(1 << 16, 1u8);
            KEPT.with(|k| *k.borrow_mut() = Some(v));
        })
        .join()
        .expect("a thread-local destructor panicked");
    }
    assert_eq!(alloc.allocations(), 0);
    pool.flush();
    assert_eq!(pool.stats().in_use_bytes, 0, "{}", pool.stats());
}

/// An allocation the system cannot map (several times the host's memory,
/// under the kernel's heuristic overcommit) is an `AllocError`, not a
/// panic or an abort, and the vector is kept.
#[test]
fn an_allocation_the_system_cannot_map_is_an_error() {
    let mode = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap_or_default();
    if mode.trim() == "1" {
        eprintln!("overcommit_memory=1: every mapping succeeds; skipped");
        return;
    }
    // SAFETY: sysconf has no preconditions.
    let phys = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) } as usize * page();
    let huge = (phys * 4).min(pinpool::MAX_CLASS_SIZE);
    let pool = host_pool();
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    assert!(alloc
        .allocate(Layout::from_size_align(huge, 8).unwrap())
        .is_err());
    let mut v: Vec<u8, PinnedAlloc> = Vec::new_in(alloc.clone());
    v.extend_from_slice(b"kept");
    assert!(v.try_reserve(huge).is_err());
    assert_eq!(&v[..], b"kept");
    assert_eq!(alloc.allocations(), 1);
}

/// The loop of `vecs_grow_from_empty_to_64_mib_on_several_threads`
/// (extend a chunk, then `set_dirty_len(v.len() * 8)`), to 1 MiB on one
/// thread, with chunks of varying length (chunks of 4096 from empty divide
/// every capacity, so `extend` never writes into a block it then grows out
/// of; uneven ones do), then every buffer it went through taken again:
/// each must be zero.
#[test]
fn a_growth_loop_with_uneven_chunks_leaves_every_buffer_zero() {
    const ELEMS: usize = (1 << 20) / 8;
    let pool = host_pool();
    let alloc = PinnedAlloc::new(&pool, 0).unwrap();
    let mut v: Vec<u64, PinnedAlloc> = Vec::new_in(alloc.clone());
    let mut seen = std::vec::Vec::new();
    let chunk: std::vec::Vec<u64> = (1..=4096).collect();
    let mut round = 0;
    while v.len() < ELEMS {
        let before = v.capacity();
        round += 1;
        v.extend(chunk[..1000 + (round * 777) % 3000].iter().copied());
        if v.capacity() != before {
            seen.push(v.capacity() * 8);
        }
        alloc.set_dirty_len(v.as_ptr(), v.len() * 8).unwrap();
    }
    drop(v);
    pool.flush();
    let mut dirty = std::vec::Vec::new();
    for &size in &seen {
        let (_, count, _) = zeroed_block(&alloc, Layout::from_size_align(size, 8).unwrap());
        if count > 0 {
            dirty.push((size, count));
        }
    }
    assert!(
        dirty.is_empty(),
        "(size, non-zero bytes) of zeroed allocations: {dirty:?}"
    );
}
