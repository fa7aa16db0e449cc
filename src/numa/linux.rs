//! The Linux system calls behind placement: `get_mempolicy(2)` (the
//! thread's policy and allowed nodes), `mbind(2)`, `sched_getaffinity(2)`
//! and `sched_setaffinity(2)`, and `move_pages(2)` (where pages are). Each
//! passes an [`IdSet`]'s words to the kernel as its bitmap.

use std::io;

use libc::{c_int, c_long, c_ulong, c_void};

use super::ids::{IdSet, MAX_NODES, WORD_BITS};
use crate::size_class::page_size;

/// Pages asked about per `move_pages` call.
#[cfg_attr(not(test), allow(dead_code))] // for tests and diagnostics
const BATCH: usize = 1024;

/// The nodes the calling thread's cpuset lets it allocate on.
pub(super) fn allowed_mems() -> io::Result<IdSet> {
    let mut mems = IdSet::new();
    // One more than the bits wanted (the kernel counts `maxnode - 1`),
    // at least the kernel's node count and at most a page of bits.
    let maxnode = (MAX_NODES + 1) as c_ulong;
    // SAFETY:
    // - MPOL_F_MEMS_ALLOWED asks for the allowed nodes only: the mode
    //   pointer may be null, and the address is ignored;
    // - the kernel writes `MAX_NODES` bits (128 bytes) of mask into
    //   `mems.words`, a live, `unsigned long`-aligned buffer of 8 KiB.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            std::ptr::null_mut::<c_int>(),
            mems.words.as_mut_ptr(),
            maxnode,
            std::ptr::null_mut::<c_void>(),
            MPOL_F_MEMS_ALLOWED,
        )
    };
    check(rc)?;
    Ok(mems)
}

/// `get_mempolicy(2)`'s flag asking for the allowed nodes.
const MPOL_F_MEMS_ALLOWED: c_ulong = 1 << 2;

/// The calling thread's memory policy mode, flags included.
pub(super) fn task_policy() -> io::Result<c_int> {
    let mut mode: c_int = 0;
    // SAFETY:
    // - the kernel writes one int to `mode`, a live local;
    // - a null node mask with `maxnode` 0 asks for no mask, and a null
    //   address with no flags for the calling thread's policy, so
    //   nothing else is read or written.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut mode as *mut c_int,
            std::ptr::null_mut::<c_ulong>(),
            0 as c_ulong,
            std::ptr::null_mut::<c_void>(),
            0 as c_ulong,
        )
    };
    check(rc)?;
    Ok(mode)
}

/// A system call's `-1` as the thread's `errno`.
fn check(rc: c_long) -> io::Result<c_long> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

pub(super) fn bind_range(ptr: *mut u8, len: usize, node: u32) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let mut nodes = IdSet::new();
    if !nodes.insert(node as usize) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("node {node} out of range"),
        ));
    }
    let mask = nodes.used_words();
    // The kernel reads `maxnode - 1` bits of the mask (mbind(2) BUGS:
    // it decrements `maxnode` first), so one more than the mask holds;
    // only the words up to the node's, as it refuses masks longer than
    // a page of bits.
    let maxnode = (mask.len() * WORD_BITS + 1) as c_ulong;
    // SAFETY:
    // - mbind reads `mask.len()` words from `mask`, a live slice, and
    //   writes nothing to user memory;
    // - it changes only the placement of pages faulted in later, never
    //   the contents or mapping of `[ptr, ptr + len)`; without
    //   MPOL_MF_MOVE it moves no page;
    // - the kernel validates the range (EFAULT/EINVAL on a bad one).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            ptr as *mut c_void,
            len as c_ulong,
            libc::MPOL_PREFERRED as c_ulong,
            mask.as_ptr(),
            maxnode,
            0 as c_ulong,
        )
    };
    check(rc).map(drop)
}

/// The CPUs the calling thread may run on.
pub(super) fn current_affinity() -> io::Result<IdSet> {
    let mut set = IdSet::new();
    let bytes = std::mem::size_of_val(&*set.words);
    // SAFETY:
    // - pid 0 names the calling thread;
    // - the kernel writes at most `bytes` bytes (its own mask size, at
    //   most 1 KiB for 8192 CPUs; it fails with EINVAL if `bytes` were
    //   shorter) into `set.words`, a live, `unsigned long`-aligned
    //   buffer of that size, and reads nothing from it.
    let rc = unsafe { libc::sched_getaffinity(0, bytes, set.words.as_mut_ptr().cast()) };
    check(c_long::from(rc))?;
    Ok(set)
}

pub(super) fn pin_current_thread(cpus: &IdSet) -> io::Result<()> {
    let mask = cpus.used_words();
    let bytes = std::mem::size_of_val(mask);
    // SAFETY:
    // - pid 0 names the calling thread;
    // - the kernel reads `bytes` bytes from `mask`, a live slice of
    //   that size; `cpu_set_t` is itself an array of `unsigned long`,
    //   so the pointer is suitably aligned, and the kernel accepts any
    //   whole number of words (it zero-extends a short mask);
    // - it writes nothing to user memory.
    let rc = unsafe { libc::sched_setaffinity(0, bytes, mask.as_ptr().cast()) };
    check(c_long::from(rc)).map(drop)
}

#[cfg_attr(not(test), allow(dead_code))]
pub(super) fn pages_on_node(ptr: *const u8, len: usize, node: u32) -> io::Result<usize> {
    let page = page_size();
    let start = ptr as usize / page * page;
    let end = (ptr as usize).checked_add(len).ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "range wraps the address space")
    })?;
    let node = c_int::try_from(node)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "node out of range"))?;
    let mut pages: Vec<*mut c_void> = Vec::with_capacity(BATCH);
    let mut status: Vec<c_int> = vec![0; BATCH];
    let mut on_node = 0;
    let mut addr = start;
    while addr < end {
        pages.clear();
        while addr < end && pages.len() < BATCH {
            pages.push(addr as *mut c_void);
            addr += page;
        }
        // SAFETY:
        // - pid 0 is the calling process;
        // - `pages` holds `pages.len()` addresses, read by the kernel,
        //   which only looks them up (an unmapped one gets -EFAULT in
        //   its status entry) and touches no page;
        // - a null `nodes` asks for each page's node and moves nothing;
        // - the kernel writes `pages.len() <= BATCH` entries to
        //   `status`, which holds BATCH.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_move_pages,
                0 as c_long,
                pages.len() as c_ulong,
                pages.as_ptr(),
                std::ptr::null::<c_int>(),
                status.as_mut_ptr(),
                0 as c_int,
            )
        };
        check(rc)?;
        on_node += status[..pages.len()].iter().filter(|&&s| s == node).count();
    }
    Ok(on_node)
}
