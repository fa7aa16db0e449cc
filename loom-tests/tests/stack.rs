//! Loom models of the lock-free size-class stack, of a take racing a trim
//! that holds the stack's values out, and of a thread cache's batched
//! returns.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use pinpool::loom_internals::{HeldOut, Returns, Stack};

/// Collects what is left on `stack` plus what threads popped, and checks
/// that every pushed value comes out exactly once.
fn assert_exactly_once(stack: &Stack, mut popped: Vec<u64>, pushed: &[u64]) {
    while let Some(v) = stack.pop() {
        popped.push(v);
    }
    popped.sort_unstable();
    let mut expected = pushed.to_vec();
    expected.sort_unstable();
    assert_eq!(popped, expected, "a value was lost or popped twice");
}

/// Concurrent pushes and pops on one size class.
///
/// Catches: a push whose CAS publishes the slot before its value is
/// written (or with Relaxed ordering), so a popper reads an empty slot and
/// loses the value; or two poppers winning the same slot.
#[test]
fn concurrent_push_pop_hands_out_each_value_once() {
    loom::model(|| {
        let stack = Arc::new(Stack::new());
        stack.push(1).unwrap();
        let threads: Vec<_> = [2u64, 3]
            .into_iter()
            .map(|v| {
                let stack = stack.clone();
                thread::spawn(move || {
                    stack.push(v).unwrap();
                    stack.pop()
                })
            })
            .collect();
        let popped: Vec<u64> = threads
            .into_iter()
            .filter_map(|t| t.join().unwrap())
            .collect();
        assert_exactly_once(&stack, popped, &[1, 2, 3]);
    });
}

/// The ABA schedule: one thread reads head A (next B) and stalls; another
/// pops A and B and pushes A back, so the head is A again but its next is no
/// longer B.
///
/// Catches: a head CAS without the generation tag, which would install the
/// stale next (B, now owned by the other thread) and hand B out twice.
#[test]
fn pop_is_aba_safe() {
    loom::model(|| {
        let stack = Arc::new(Stack::new());
        for v in [1, 2, 3] {
            stack.push(v).unwrap();
        }
        let stalled = {
            let stack = stack.clone();
            thread::spawn(move || stack.pop().into_iter().collect::<Vec<_>>())
        };
        let a = stack.pop();
        let b = stack.pop();
        if let Some(a) = a {
            stack.push(a).unwrap();
        }
        let mut popped = stalled.join().unwrap();
        popped.extend(b);
        assert_exactly_once(&stack, popped, &[1, 2, 3]);
    });
}

/// Two threads drop into one cache's returns (batches of two, so batches
/// fill, open and pass between the pushers) while its owner takes the full
/// batches and then the open one, as its takes do.
///
/// Catches: a batch two threads append to at once, or one whose values a
/// taker reads before they are published (the swap out of `open` with its
/// Acquire weakened: loom reports the race on the batch's values; seen
/// failing so); a value lost (a pusher putting its batch back into `open`
/// with a store over a batch another pusher opened, not a CAS: seen failing
/// so).
#[test]
fn returns_hand_out_each_value_once() {
    loom::model(|| {
        let returns = Arc::new(Returns::new());
        let pushers: Vec<_> = [vec![1u64, 2, 5], vec![3, 4]]
            .into_iter()
            .map(|values| {
                let returns = returns.clone();
                thread::spawn(move || {
                    for v in values {
                        returns.push(v);
                    }
                })
            })
            .collect();
        let mut taken = returns.take_full();
        taken.extend(returns.take_open());
        for pusher in pushers {
            pusher.join().unwrap();
        }
        taken.extend(returns.take_all());
        taken.sort_unstable();
        assert_eq!(taken, [1, 2, 3, 4, 5], "a value was lost or taken twice");
    });
}

/// A trim's holds of slot 0, `holds` times in a row: each pops every value
/// of `stack` and pushes them back, as a trim pushes back what it keeps.
fn spawn_trim(stack: &Arc<Stack>, held: &Arc<HeldOut>, holds: usize) -> thread::JoinHandle<()> {
    let (stack, held) = (stack.clone(), held.clone());
    thread::spawn(move || {
        for _ in 0..holds {
            let _holding = held.hold(0);
            let kept: Vec<u64> = std::iter::from_fn(|| stack.pop()).collect();
            for v in kept {
                stack.push(v).unwrap();
            }
        }
    })
}

/// A take of slot 0 as the pool's takes do it: a mark, a pop, and while it
/// found nothing and a hold overlapped its last look, a wait for the hold
/// and a pop under a new mark, four times at most (`HOLDS_WAITED`).
fn take(stack: &Stack, held: &HeldOut) -> Option<u64> {
    let mut mark = held.mark(0);
    let mut took = stack.pop();
    for _ in 0..4 {
        if took.is_some() || !held.waited(mark) {
            break;
        }
        mark = held.mark(0);
        took = stack.pop();
    }
    took
}

/// A trim holds a slot's buffers out of its stack (pops them all, pushes
/// back those it keeps) while a take of the slot looks at the stack; the
/// take, finding it empty, asks whether a hold overlapped its look and
/// pops again. A hold of another slot runs beside them (the pool runs one
/// trim at a time; `HeldOut` does not rely on it), whose end wakes the
/// take's wait, if any, for nothing.
///
/// Catches: a take that finds the stack the hold emptied and reads the
/// sequence number from before the hold (the Release fence in
/// `HeldOut::hold` left out); one that reads the number the hold's end
/// left and the head from before the push-back (the end's increment or
/// the mark's load Relaxed; `waited`'s own Acquire load is not needed by a
/// take that marks again before it pops, and the model passes without it);
/// one that pops again without waiting for the hold to end; a wait whose
/// wake-up is lost (the end's notification sent without taking the lock:
/// loom reports the deadlock).
/// Each seen failing so; each miss is a buffer the trim kept. (The
/// Acquire fence in `waited` is for looks that read Relaxed; this take's
/// look is the stack's Acquire load, so the model passes without the
/// fence.)
#[test]
fn a_take_racing_a_hold_finds_what_it_kept() {
    loom::model(|| {
        let stack = Arc::new(Stack::new());
        let held = Arc::new(HeldOut::new(2));
        stack.push(1).unwrap();
        let trim = spawn_trim(&stack, &held, 1);
        let other = {
            let held = held.clone();
            thread::spawn(move || drop(held.hold(1)))
        };
        let took = take(&stack, &held);
        trim.join().unwrap();
        other.join().unwrap();
        assert_eq!(took, Some(1), "the take missed a buffer the trim kept");
    });
}

/// A trim holds the slot twice in a row (`Pool::trim` in a loop): a take
/// woken by the first hold's end can look again only after the second
/// emptied the stack. The take looks again under a new mark for as long
/// as a hold overlapped its last look, a few times at most, as the
/// pool's takes do.
///
/// Catches: a take that waits for the hold running at its first look
/// only, and pops once (seen failing so: it missed).
#[test]
fn a_take_racing_two_holds_finds_what_they_kept() {
    loom::model(|| {
        let stack = Arc::new(Stack::new());
        let held = Arc::new(HeldOut::new(1));
        stack.push(1).unwrap();
        let trim = spawn_trim(&stack, &held, 2);
        let took = take(&stack, &held);
        trim.join().unwrap();
        assert_eq!(took, Some(1), "the take missed a buffer the trim kept");
    });
}
