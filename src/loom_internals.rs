//! Internals exposed to the `loom-tests` crate, in loom builds only.

use crate::{held_out, remote, stack};

/// Does what a thread's per-thread guard does when its teardown reaches
/// it: the thread stops owning its caches (its takes go through the orphan
/// cache from now on), and its index goes to the next thread that starts,
/// with the caches it leaves. Loom runs thread-local destructors in no set
/// order, so models call this where a teardown would reach the guard.
pub fn end_thread() {
    crate::sync::per_thread::end_thread();
}

/// The lock-free size-class stack, over `u64` values.
#[derive(Debug)]
pub struct Stack(stack::Stack<u64>);

impl Stack {
    /// An empty stack.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Self(stack::Stack::new())
    }

    /// Pushes `value`; `Err` if the slot table is full.
    pub fn push(&self, value: u64) -> Result<(), u64> {
        self.0.push(value)
    }

    /// Pops the most recently pushed value.
    pub fn pop(&self) -> Option<u64> {
        self.0.pop()
    }

    /// Values on the stack.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the stack is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A thread cache's batched returns, over `u64` values (batches of two in
/// loom builds).
#[derive(Debug)]
pub struct Returns(remote::Returns<u64>);

impl Returns {
    /// No values.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Self(remote::Returns::new(|_| {}))
    }

    /// Appends `value` to the open batch.
    pub fn push(&self, value: u64) {
        self.0.push(value)
    }

    /// Takes the full batches' values (as the owner's take does).
    pub fn take_full(&self) -> Vec<u64> {
        self.0.take_full().collect()
    }

    /// Takes the open batch's values (as the owner's take does when its
    /// slot is empty).
    pub fn take_open(&self) -> Vec<u64> {
        self.0.take_open().collect()
    }

    /// Takes every value (as a sweep, a steal or closing does).
    pub fn take_all(&self) -> Vec<u64> {
        self.0.take_all().collect()
    }
}

/// What tells a take that a trim held its slot's pooled buffers out of
/// their stack (the pool's `HeldOut`).
#[derive(Debug)]
pub struct HeldOut(held_out::HeldOut);

/// A hold under way; ends when dropped.
#[allow(missing_debug_implementations)]
pub struct Holding<'a>(#[allow(dead_code)] held_out::Holding<'a>);

/// What a take read before it looked (the pool's `Mark`).
#[derive(Clone, Copy, Debug)]
pub struct Mark(held_out::Mark);

impl HeldOut {
    /// No hold under way, for `slots` slots.
    pub fn new(slots: usize) -> Self {
        Self(held_out::HeldOut::new(slots))
    }

    /// Begins a hold of `slot`, as a trim does before it empties its stack.
    pub fn hold(&self, slot: usize) -> Holding<'_> {
        Holding(self.0.hold(slot))
    }

    /// What a take of `slot` reads before it pops.
    pub fn mark(&self, slot: usize) -> Mark {
        Mark(self.0.mark(slot))
    }

    /// Whether a hold of the mark's slot overlapped the take since the
    /// mark (after waiting for one running to end).
    pub fn waited(&self, mark: Mark) -> bool {
        self.0.waited(mark.0)
    }
}
