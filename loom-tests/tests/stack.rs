//! Loom models of the lock-free size-class stack.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use pinpool::loom_internals::Stack;

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
