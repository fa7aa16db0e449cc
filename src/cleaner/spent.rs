//! Spent fences: the fences and spare events of buffers that their droppers
//! freed themselves (past the cleaner's backlog), on their way to the
//! cleaner.
//!
//! A dropping thread may unmap a pageable buffer, but not destroy its
//! events (a driver call) nor hand its spare events back to the
//! pool's event pool (a lock every copy takes). So it moves the
//! buffer's fences into this list and the cleaner gives them back or
//! destroys them. A push is one CAS onto the head and the cleaner takes
//! everything with one swap, as in a thread cache's
//! [remote list](crate::remote): there is no single pop, so no ABA. The
//! push that finds the list empty tells its caller to queue one job that
//! collects the list, so the queue holds at most one such job per
//! collection, however many buffers are shed.

use std::ptr;

use crate::fence::Fences;
use crate::sync::{AtomicPtr, Ordering};

struct Node {
    fences: Fences,
    next: *mut Node,
}

/// See the module docs.
pub(crate) struct Spent {
    head: AtomicPtr<Node>,
}

impl Spent {
    pub(crate) fn new() -> Self {
        Self {
            head: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// Pushes `fences`; returns whether the list was empty before (the
    /// caller then queues a job that collects it).
    pub(crate) fn push(&self, fences: Fences) -> bool {
        let node = Box::into_raw(Box::new(Node {
            fences,
            next: ptr::null_mut(),
        }));
        // Relaxed: only the expected value of the CAS, which re-checks it.
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            // SAFETY: `node` came from `Box::into_raw` and is not yet shared.
            unsafe { (*node).next = head };
            // Release publishes the node (the fences moved into it) to the
            // swap in `take_all`, whose Acquire pairs with it.
            match self
                .head
                .compare_exchange_weak(head, node, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return head.is_null(),
                Err(actual) => head = actual,
            }
        }
    }

    /// Takes every fence set on the list.
    pub(crate) fn take_all(&self) -> Vec<Fences> {
        // Acquire pairs with the Release CAS of every push it takes.
        let mut node = self.head.swap(ptr::null_mut(), Ordering::Acquire);
        let mut out = Vec::new();
        while !node.is_null() {
            // SAFETY: the swap transferred the whole chain to this thread;
            // each node came from `Box::into_raw` in `push` and is taken
            // once, here.
            let boxed = unsafe { Box::from_raw(node) };
            node = boxed.next;
            out.push(boxed.fences);
        }
        out
    }
}

impl Drop for Spent {
    fn drop(&mut self) {
        // The cleaner collects the list before its pool goes away; whatever
        // a racing drop left is destroyed here.
        for mut fences in self.take_all() {
            fences.abandon();
        }
    }
}

impl std::fmt::Debug for Spent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spent").finish_non_exhaustive()
    }
}
