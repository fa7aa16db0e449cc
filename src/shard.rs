//! One device's share of the pool: a lock-free stack per size class, and
//! the regions its buffers are carved from.

use crate::alloc::{Block, Regions};
use crate::size_class::SizeClass;
use crate::stack::Stack;

/// Ready (registered where the backend pins, all-zero, quiescent) buffers
/// of one device, by size class.
#[derive(Debug)]
pub(crate) struct Shard {
    classes: Box<[Stack<Block>]>,
    /// The host NUMA node the device's blocks are placed on, if any.
    node: Option<u32>,
    /// The device's regions (see `alloc::region`), which its buffers of
    /// whole pages are carved from.
    regions: Regions,
}

// === impl Shard ===

impl Shard {
    /// A shard of `classes` empty stacks whose blocks go on `node`.
    pub(crate) fn new(classes: usize, node: Option<u32>) -> Self {
        Self {
            classes: (0..classes).map(|_| Stack::new()).collect(),
            node,
            regions: Regions::new(node),
        }
    }

    /// The regions this device's blocks are carved from.
    #[inline]
    pub(crate) fn regions(&self) -> &Regions {
        &self.regions
    }

    /// Bytes of free extents in the shard's regions.
    pub(crate) fn free_extent_bytes(&self) -> usize {
        self.regions.figures().free
    }

    /// The host NUMA node new blocks of this shard are bound to, if any
    /// (see [`numa`](crate::numa)).
    #[inline]
    pub(crate) fn node(&self) -> Option<u32> {
        self.node
    }

    /// Takes a ready buffer of `class`.
    #[inline]
    pub(crate) fn pop(&self, class: SizeClass) -> Option<Block> {
        self.classes[class.index()].pop()
    }

    /// Makes `block` available; hands it back if its class is full.
    pub(crate) fn push(&self, block: Block) -> Result<(), Block> {
        self.classes[block.class().index()].push(block)
    }

    /// Buffers held of `class` (a racing read over-counts).
    pub(crate) fn len(&self, class: SizeClass) -> usize {
        self.classes[class.index()].len()
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
