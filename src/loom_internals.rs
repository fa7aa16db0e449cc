//! Internals exposed to the `loom-tests` crate, in loom builds only.

use crate::stack;

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
