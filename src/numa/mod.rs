//! NUMA placement: which host node each device's shard lives on, and the
//! system calls that put memory and cleaner workers there.
//!
//! On a machine with several NUMA nodes a copy to a GPU reads host memory
//! across the socket interconnect unless that memory sits on the node the
//! GPU's PCIe root hangs off. The pool therefore places each device's
//! blocks on the device's host node. When every placed device is on one
//! node, cleaner workers run on that node's CPUs (those the worker may
//! use), so that pre-faulting and zeroing stay local too; with devices on
//! several nodes they run unpinned, because the cleaner's work is not
//! routed by node (any worker cleans any device's blocks), and the pages
//! still land on each device's node through the blocks' memory policy.
//! This module decides the placement and wraps the system calls; the
//! backend supplies what the driver knows about each device, and the
//! allocator and the cleaner act on the result.
//!
//! A device's node comes from, in order:
//!
//! 1. the driver (`CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID`, CUDA 12.2 and later),
//!    passed in as a [`DeviceHint`];
//! 2. the `numa_node` file of the device's PCI function in sysfs
//!    (`bus/pci/devices/<bus id>/numa_node`, `-1` where the firmware does
//!    not say), found from the bus id the driver reports;
//! 3. nothing: the kernel's default policy places its memory, as on a
//!    machine without NUMA.
//!
//! A node without memory (listed online but not in `has_memory`: CPUs
//! only), or one the cpuset of the thread building the pool does not let
//! it allocate on (a container's `cpuset.mems`), is never a device's node:
//! binding memory to it fails. Nor is any
//! device placed when the thread building the pool has a memory policy of
//! its own (`numactl --membind`, `--interleave`, `--preferred`,
//! `--localalloc`, or `set_mempolicy(2)`: threads inherit it), or one that
//! cannot be read: a range's policy would override the operator's choice.
//!
//! The topology is read from sysfs (`devices/system/node/online`,
//! `devices/system/node/has_memory` and each node's `cpulist`, all in the
//! kernel's list format; see
//! `Documentation/ABI/stable/sysfs-devices-node` and
//! `Documentation/ABI/testing/sysfs-bus-pci` in the kernel tree) under a
//! root that tests replace with a fake tree. [`NumaMode::Off`], a machine
//! with one online node, or no readable topology leave every device
//! unplaced. Missing or malformed data is never an error: the device (or
//! the machine) falls back to no placement, and [`Placement::choose`]
//! explains each fallback in exactly one trace line.
//!
//! Acting on a placement: [`bind_range`] gives a fresh mapping a preferred
//! node with `mbind(2)` before any of its pages is touched, so that every
//! later fault (the caller writing a miss buffer, a cleaner pre-faulting,
//! the driver pinning) allocates there; [`pin_current_thread`] restricts a
//! cleaner worker to the node's CPUs among those it may already use, with
//! `sched_setaffinity(2)`; and
//! [`pages_on_node`] counts, with `move_pages(2)`, how many pages of a
//! range ended up on a node (tests and diagnostics). All three are
//! Linux-only; elsewhere the first two do nothing and the last reports
//! that it is unsupported.
//!
//! This file holds the setting ([`NumaMode`]), the placement decisions
//! ([`Placement`]) and the calls that act on them. Beside it: `ids`, the
//! sets of CPU and node ids and the kernel's list format; `topology`, the
//! nodes as sysfs describes them; `task`, what the building thread's
//! memory policy and cpuset allow; and `linux`, the system calls.

use std::fmt;
use std::io;
use std::str::FromStr;

mod ids;
#[cfg(target_os = "linux")]
mod linux;
mod task;
mod topology;

pub(crate) use topology::Topology;

use ids::IdSet;
use task::{Task, TaskPolicy};
use topology::{Miss, Node};

// === impl NumaMode ===

/// Whether a pool places memory by NUMA node (the `numa` setting).
///
/// With [`Auto`](NumaMode::Auto), on a machine with several NUMA nodes, each
/// device's buffers are bound to the node its PCIe root hangs off; when
/// every device placed is on one node (devices whose node is unknown do
/// not count), cleaner workers pre-fault and zero buffers from that node's
/// CPUs, among those they may already use.
///
/// # Examples
///
/// ```
/// use pinpool::{BackendKind, NumaMode, Pool};
///
/// let pool = Pool::builder().backend(BackendKind::Host).numa(NumaMode::Off).build()?;
/// assert_eq!(pool.config().numa, NumaMode::Off);
/// assert_eq!("auto".parse::<NumaMode>(), Ok(NumaMode::Auto));
/// # Ok::<(), pinpool::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum NumaMode {
    /// Place each device's blocks on its host node when the machine has
    /// more than one node and says which node a device is on.
    #[default]
    Auto,
    /// Place nothing: the kernel's default policy decides, as without NUMA.
    Off,
}

impl FromStr for NumaMode {
    type Err = String;

    /// Parses `auto` or `off`, ignoring case and surrounding whitespace.
    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(NumaMode::Auto),
            "off" => Ok(NumaMode::Off),
            _ => Err("numa must be auto or off".into()),
        }
    }
}

impl fmt::Display for NumaMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NumaMode::Auto => "auto",
            NumaMode::Off => "off",
        })
    }
}

// === impl Placement ===

/// What the driver says about one device, gathered by the backend.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DeviceHint {
    /// `CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID`, if the driver answered (it
    /// reports `-1` when it does not know; drivers before CUDA 12.2 reject
    /// the attribute: pass `None`).
    pub(crate) driver_node: Option<i32>,
    /// The bus id from `cuDeviceGetPCIBusId`, e.g. `"0000:3B:00.0"`.
    pub(crate) pci_bus_id: Option<String>,
}

/// Where a device's node came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The driver's `CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID`.
    Driver,
    /// The PCI function's `numa_node` in sysfs.
    Sysfs,
}

/// A placed device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Placed {
    /// The index of its node in [`Placement::nodes`].
    node: usize,
    /// Where the node came from.
    source: Source,
}

/// Why a device is not placed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fallback {
    /// The pool was configured with `numa=off`.
    Off,
    /// The machine has one online node: there is nothing to choose.
    SingleNode,
    /// The online node list could not be used (a kernel without NUMA
    /// support has none).
    NoTopology(Miss),
    /// The task that builds the pool has a memory policy of its own (or
    /// one that cannot be read): a range's policy would override it.
    TaskPolicy(TaskPolicy),
    /// Neither the driver nor sysfs named an online node for the device
    /// that memory can be bound to.
    NoNode {
        /// Why the driver's answer was not used.
        driver: Miss,
        /// Why the sysfs `numa_node` was not used.
        sysfs: Miss,
    },
}

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fallback::Off => f.write_str("numa=off"),
            Fallback::SingleNode => f.write_str("the machine has one NUMA node"),
            Fallback::NoTopology(miss) => write!(f, "no NUMA topology: {miss}"),
            Fallback::TaskPolicy(policy) => write!(f, "the task's memory policy is kept: {policy}"),
            Fallback::NoNode { driver, sysfs } => {
                write!(f, "driver node: {driver}; sysfs numa_node: {sysfs}")
            }
        }
    }
}

/// The node chosen for each device, if any; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct Placement {
    /// The online nodes (empty when no device is placed).
    nodes: Vec<Node>,
    /// Per device, its node or why it has none.
    devices: Vec<Result<Placed, Fallback>>,
}

impl Placement {
    /// No device placed, without reading the topology: for backends that
    /// do not pin, whose memory placement does not matter.
    pub(crate) fn unplaced(devices: usize) -> Self {
        Self {
            nodes: Vec::new(),
            devices: vec![Err(Fallback::Off); devices],
        }
    }

    /// Chooses a node for each device of `hints` (one per device, in device
    /// order) on `topology` under `mode`. Never fails and never panics: a
    /// device without a usable node gets none, and each fallback is
    /// explained by exactly one trace line (one for the whole machine when
    /// no device can be placed at all, else one per unplaced device). An
    /// info line lists the devices placed.
    pub(crate) fn choose(mode: NumaMode, topology: &Topology, hints: &[DeviceHint]) -> Self {
        Self::choose_under(mode, topology, hints, Task::current)
    }

    /// [`choose`](Self::choose) for the task `task` describes (asked
    /// only once the topology could place something).
    fn choose_under(
        mode: NumaMode,
        topology: &Topology,
        hints: &[DeviceHint],
        task: impl FnOnce() -> Task,
    ) -> Self {
        let usable = usable_nodes(topology, mode).and_then(|nodes| {
            let task = task();
            match task.policy {
                TaskPolicy::Default => Ok((nodes, task.mems)),
                other => Err(Fallback::TaskPolicy(other)),
            }
        });
        let (nodes, mems) = match usable {
            Ok(usable) => usable,
            Err(fallback) => {
                tracing::debug!(
                    devices = hints.len(),
                    reason = %fallback,
                    "pinpool: no NUMA placement; memory goes where the kernel puts it"
                );
                return Self {
                    nodes: Vec::new(),
                    devices: vec![Err(fallback); hints.len()],
                };
            }
        };
        let devices = hints
            .iter()
            .enumerate()
            .map(|(device, hint)| {
                let choice = place(topology, nodes, &mems, hint);
                if let Err(fallback) = &choice {
                    tracing::debug!(
                        device,
                        reason = %fallback,
                        "pinpool: no NUMA node for a device; its memory goes where the kernel puts it"
                    );
                }
                choice
            })
            .collect();
        let placement = Self {
            nodes: nodes.to_vec(),
            devices,
        };
        placement.trace_placed();
        placement
    }

    /// The node `device`'s blocks go on, if any.
    pub(crate) fn node(&self, device: usize) -> Option<&Node> {
        let placed = self.devices.get(device)?.as_ref().ok()?;
        Some(&self.nodes[placed.node])
    }

    /// The node every cleaner worker runs on: the one node holding the
    /// placed devices' blocks. None if no device is placed, or if placed
    /// devices are on several nodes: the cleaner's work queues are shared,
    /// not routed by node, so a worker pinned to one node would pre-fault
    /// and zero the others' blocks across the interconnect; unpinned, the
    /// scheduler may at least run it anywhere.
    pub(crate) fn worker_node(&self) -> Option<&Node> {
        match self.used_nodes()[..] {
            [index] => Some(&self.nodes[index]),
            _ => None,
        }
    }

    /// Indexes of the nodes holding some device's blocks, ascending.
    fn used_nodes(&self) -> Vec<usize> {
        let mut used: Vec<usize> = self
            .devices
            .iter()
            .filter_map(|choice| choice.as_ref().ok().map(|placed| placed.node))
            .collect();
        used.sort_unstable();
        used.dedup();
        used
    }

    /// Says which device went where, and whether cleaner workers run
    /// unpinned (devices on several nodes, or the one node's CPU list was
    /// unusable).
    fn trace_placed(&self) {
        let placed: Vec<String> = self
            .devices
            .iter()
            .enumerate()
            .filter_map(|(device, choice)| {
                let placed = choice.as_ref().ok()?;
                let node = self.nodes[placed.node].id;
                Some(format!("{device}->{node} ({:?})", placed.source))
            })
            .collect();
        if placed.is_empty() {
            return;
        }
        tracing::info!(devices = %placed.join(", "), "pinpool: NUMA placement");
        match self.used_nodes()[..] {
            [index] => {
                let node = &self.nodes[index];
                if let Some(miss) = &node.cpus_unusable {
                    tracing::debug!(
                        node = node.id,
                        reason = %miss,
                        "pinpool: NUMA node CPUs unknown; its cleaner workers run unpinned"
                    );
                }
            }
            ref used => tracing::debug!(
                nodes = used.len(),
                "pinpool: devices on several NUMA nodes; cleaner workers run unpinned"
            ),
        }
    }
}

// === placement decisions ===

/// The online nodes of `topology` for `mode`, or why no device is placed.
fn usable_nodes(topology: &Topology, mode: NumaMode) -> Result<&[Node], Fallback> {
    if mode == NumaMode::Off {
        return Err(Fallback::Off);
    }
    match &topology.nodes {
        Err(miss) => Err(Fallback::NoTopology(miss.clone())),
        Ok(nodes) if nodes.len() == 1 => Err(Fallback::SingleNode),
        Ok(nodes) => Ok(nodes),
    }
}

/// A device's node among `nodes` (those of them in `mems`): the driver's,
/// else the one sysfs gives for its PCI function.
fn place(
    topology: &Topology,
    nodes: &[Node],
    mems: &IdSet,
    hint: &DeviceHint,
) -> Result<Placed, Fallback> {
    let driver = match hint.driver_node {
        None => Miss::Absent,
        Some(id) => match online(nodes, mems, i64::from(id)) {
            Ok(node) => {
                return Ok(Placed {
                    node,
                    source: Source::Driver,
                })
            }
            Err(miss) => miss,
        },
    };
    let sysfs = match &hint.pci_bus_id {
        None => Miss::Absent,
        Some(bus_id) => match topology
            .pci_numa_node(bus_id)
            .and_then(|id| online(nodes, mems, id))
        {
            Ok(node) => {
                return Ok(Placed {
                    node,
                    source: Source::Sysfs,
                })
            }
            Err(miss) => miss,
        },
    };
    Err(Fallback::NoNode { driver, sysfs })
}

/// The index of node `id` among the online `nodes`, or why it is not one
/// that memory can be bound to (it has none, or it is not in the task's
/// `mems`).
fn online(nodes: &[Node], mems: &IdSet, id: i64) -> Result<usize, Miss> {
    let index = match id {
        -1 => return Err(Miss::Unknown),
        id if id < 0 => return Err(Miss::malformed("node id", &id.to_string())),
        id => nodes
            .iter()
            .position(|node| i64::from(node.id) == id)
            .ok_or(Miss::Offline(id))?,
    };
    if !nodes[index].has_memory {
        return Err(Miss::NoMemory(id));
    }
    if !mems.contains(nodes[index].id as usize) {
        return Err(Miss::NotAllowed(id));
    }
    Ok(index)
}

// === acting on a placement ===

/// Gives `[ptr, ptr + len)` the memory policy "prefer `node`" (`mbind(2)`
/// with `MPOL_PREFERRED`): pages faulted in afterwards, by any thread or by
/// the driver pinning them, are allocated on `node` while it has free
/// memory. Call it on a fresh mapping before any of its pages is touched:
/// pages already present stay where they are (no `MPOL_MF_MOVE`). `ptr`
/// must be page-aligned; the kernel rounds `len` up to whole pages.
///
/// `MPOL_PREFERRED`, not `MPOL_BIND`: a bound range whose node runs out of
/// memory (or is not in the cgroup's `cpuset.mems`) fails its page faults,
/// and a pool miss's buffer is faulted in by the caller writing to it, so
/// that would kill the caller (SIGBUS, or the OOM killer) rather than give
/// it slower memory. With a preference, placement degrades to other nodes
/// under memory pressure and allocation always succeeds; [`pages_on_node`]
/// measures how well it held. The policy changes where pages go, never
/// what they hold, so no caller obligation makes this unsafe.
///
/// A no-op returning `Ok` on systems other than Linux. Errors are the
/// kernel's: `EINVAL` for a misaligned range, or a node without memory or
/// outside the cgroup's `cpuset.mems`; `EPERM` or `ENOSYS` where a sandbox
/// forbids the call.
pub(crate) fn bind_range(ptr: *mut u8, len: usize, node: u32) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        linux::bind_range(ptr, len, node)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (ptr, len, node);
        Ok(())
    }
}

/// Restricts the calling thread to those of `cpus` it may already run on
/// (`sched_getaffinity(2)`, then `sched_setaffinity(2)`), for a cleaner
/// worker serving one node. A thread's mask is inherited from the thread
/// that started it, so it carries the binding an operator gave the process
/// (`taskset`, `numactl --physcpubind`, a batch scheduler's), which the
/// kernel does not check a new mask against (it checks only the cgroup's
/// `cpuset.cpus`): pinning only ever narrows the mask. If none of `cpus` is
/// allowed (or `cpus` is empty, a node without CPUs) the mask is left as
/// it is and the error is `InvalidInput`.
///
/// A no-op returning `Ok` on systems other than Linux.
pub(crate) fn pin_current_thread(cpus: &IdSet) -> io::Result<()> {
    if cpus.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no CPUs to run on",
        ));
    }
    #[cfg(target_os = "linux")]
    {
        let allowed = linux::current_affinity()?;
        let cpus = cpus.intersection(&allowed);
        if cpus.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("none of the CPUs is one this thread may use ({allowed:?})"),
            ));
        }
        linux::pin_current_thread(&cpus)
    }
    #[cfg(not(target_os = "linux"))]
    {
        Ok(())
    }
}

/// How many pages of `[ptr, ptr + len)` are resident on `node`, asked of
/// the kernel with `move_pages(2)` (which, given no target nodes, moves
/// nothing and reports each page's node). Pages not yet faulted in count as
/// on no node. For tests and diagnostics (checking that a shard's pages
/// sit on its device's node); one system call per 1024 pages, so never on
/// a hot path.
///
/// `Unsupported` on systems other than Linux.
#[cfg_attr(not(test), allow(dead_code))] // for tests and diagnostics
pub(crate) fn pages_on_node(ptr: *const u8, len: usize, node: u32) -> io::Result<usize> {
    #[cfg(target_os = "linux")]
    {
        linux::pages_on_node(ptr, len, node)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (ptr, len, node);
        Err(io::ErrorKind::Unsupported.into())
    }
}

#[cfg(test)]
mod tests;
