//! One device's share of the pool: a lock-free stack per size class, and
//! the regions its buffers are carved from.

use crate::alloc::{Block, Regions};
use crate::size_class::{Classes, SizeClass};
use crate::stack::Stack;
use crate::tune::{Tune, Tuning};

/// Ready (registered where the backend pins, all-zero, quiescent) buffers
/// of one device, by size class.
#[derive(Debug)]
pub(crate) struct Shard {
    classes: Box<[Stack<Block>]>,
    /// The host NUMA node the device's blocks are placed on, if any.
    node: Option<u32>,
    /// The device's regions (see `alloc::region`): those small buffers
    /// are carved from, and those of large ones, so that small buffers
    /// kept idle by their classes do not scatter through the extents that
    /// large ones need whole.
    regions: [Regions; 2],
}

// === impl Shard ===

impl Shard {
    /// A shard of `classes` empty stacks whose blocks go on `node`.
    pub(crate) fn new(classes: usize, node: Option<u32>) -> Self {
        Self {
            classes: (0..classes).map(|_| Stack::new()).collect(),
            node,
            regions: [Regions::new(node), Regions::new(node)],
        }
    }

    /// The regions that blocks of `footprint` bytes are carved from: the
    /// small ones below [`LARGE_BUFFER`](Tuning::LARGE_BUFFER).
    #[inline]
    pub(crate) fn regions(&self, footprint: usize) -> &Regions {
        &self.regions[usize::from(footprint >= Tune::LARGE_BUFFER)]
    }

    /// Whether buffers of `class` are carved from `regions` (a class of
    /// whole pages whose footprint falls in that set; sub-page classes
    /// come from slabs).
    pub(crate) fn carves_into(
        &self,
        classes: &Classes,
        class: SizeClass,
        regions: &Regions,
    ) -> bool {
        classes.per_slab(class) == 1
            && std::ptr::eq(self.regions(classes.footprint(class)), regions)
    }

    /// The regions small buffers are carved from: sub-regions of the large
    /// ones (see `alloc::region`).
    pub(crate) fn small_regions(&self) -> &Regions {
        &self.regions[0]
    }

    /// Whether the set `regions` carves from is being grown now: for the
    /// small set, a growth of the large set running (its sub-regions are
    /// carved from the large set's space); never for the large set.
    pub(crate) fn parent_growing(&self, regions: &Regions) -> bool {
        std::ptr::eq(regions, self.small_regions()) && self.large_regions().growth_running()
    }

    /// The regions large buffers are carved from, each one registration.
    pub(crate) fn large_regions(&self) -> &Regions {
        &self.regions[1]
    }

    /// Bytes of free extents in the shard's regions (the small regions'
    /// lie inside the large ones' carved space, so the two do not
    /// overlap).
    pub(crate) fn free_extent_bytes(&self) -> usize {
        self.regions.iter().map(|r| r.figures().free).sum()
    }

    /// A footprint that falls in `regions`, one of this shard's sets: what
    /// the per-set figures kept by footprint (misses out) are asked with.
    pub(crate) fn set_footprint(&self, regions: &Regions) -> usize {
        if std::ptr::eq(regions, self.small_regions()) {
            crate::size_class::page_size()
        } else {
            Tune::LARGE_BUFFER
        }
    }

    /// Both sets of regions, the small first (whose regions go back to the
    /// large ones when freed).
    pub(crate) fn all_regions(&self) -> &[Regions] {
        &self.regions
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
