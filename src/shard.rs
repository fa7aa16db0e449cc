//! One device's share of the pool: a lock-free stack per size class.

use crate::alloc::Block;
use crate::size_class::CLASSES;
use crate::stack::Stack;

/// Ready (registered where the backend pins, all-zero, quiescent) buffers
/// of one device, by size class.
#[derive(Debug)]
pub(crate) struct Shard {
    classes: Box<[Stack<Block>]>,
}

// === impl Shard ===

impl Shard {
    pub(crate) fn new() -> Self {
        Self {
            classes: (0..CLASSES).map(|_| Stack::new()).collect(),
        }
    }

    /// Takes a ready buffer of class `shift`.
    #[inline]
    pub(crate) fn pop(&self, shift: u32) -> Option<Block> {
        self.classes[shift as usize].pop()
    }

    /// Makes `block` available; hands it back if its class is full.
    pub(crate) fn push(&self, block: Block) -> Result<(), Block> {
        self.classes[block.shift() as usize].push(block)
    }

    /// Buffers held, by size class.
    pub(crate) fn buffers(&self) -> impl Iterator<Item = usize> + '_ {
        self.classes.iter().map(Stack::len)
    }

    /// Whether any buffer of class `shift` is held.
    pub(crate) fn has(&self, shift: u32) -> bool {
        self.classes[shift as usize].len() > 0
    }

    /// Takes every held buffer.
    pub(crate) fn drain(&self) -> Vec<Block> {
        let mut out = Vec::new();
        for stack in self.classes.iter() {
            while let Some(block) = stack.pop() {
                out.push(block);
            }
        }
        out
    }
}
