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

use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// CPU and node ids at or above this are rejected as malformed: kernels
/// support at most 8192 CPUs and 1024 nodes. Lists parse into an
/// [`IdSet`] of this many bits (8 KiB), whatever their length.
const MAX_ID: usize = 1 << 16;

/// Node ids the kernel supports (`MAX_NUMNODES` is at most `1 << 10`).
const MAX_NODES: usize = 1 << 10;

/// The most bytes read from one sysfs file (sysfs writes at most a page).
const MAX_FILE_BYTES: u64 = 64 << 10;

/// Malformed text is quoted in trace lines up to this many characters.
const MAX_QUOTE: usize = 64;

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

// === impl Miss ===

/// Why one source of a node (the driver, a sysfs file) gave none.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Miss {
    /// The source had nothing to say: no driver answer, no PCI bus id.
    Absent,
    /// The source said it does not know (`-1`).
    Unknown,
    /// The source named a node that is not online.
    Offline(i64),
    /// The source named a node without memory (CPUs only): binding memory
    /// to it fails.
    NoMemory(i64),
    /// The source named a node the task's cpuset does not let it allocate
    /// on (`cpuset.mems`): binding memory to it fails.
    NotAllowed(i64),
    /// A sysfs file could not be read.
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The reason (`NotFound` for a missing file).
        kind: io::ErrorKind,
    },
    /// A value is not in the form the kernel or the driver writes.
    Malformed {
        /// What held the value (a path, or a description).
        what: String,
        /// The value, shortened to [`MAX_QUOTE`] characters.
        text: String,
    },
}

impl Miss {
    fn malformed(what: impl fmt::Display, text: &str) -> Self {
        Miss::Malformed {
            what: what.to_string(),
            text: text.chars().take(MAX_QUOTE).collect(),
        }
    }
}

impl fmt::Display for Miss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Miss::Absent => f.write_str("not reported"),
            Miss::Unknown => f.write_str("unknown (-1)"),
            Miss::Offline(id) => write!(f, "node {id} is not online"),
            Miss::NoMemory(id) => write!(f, "node {id} has no memory"),
            Miss::NotAllowed(id) => {
                write!(
                    f,
                    "node {id} is not one the task may allocate on (cpuset.mems)"
                )
            }
            Miss::Unreadable { path, kind } => write!(f, "{}: {kind}", path.display()),
            Miss::Malformed { what, text } => write!(f, "{what}: unexpected {text:?}"),
        }
    }
}

// === impl IdSet ===

/// Bits in one word of an [`IdSet`] (and of a kernel bitmap).
const WORD_BITS: usize = libc::c_ulong::BITS as usize;

/// A set of CPU or node ids below [`MAX_ID`]: a fixed bitset laid out as
/// the kernel's bitmaps are (`unsigned long` words, id `i` in bit
/// `i % WORD_BITS` of word `i / WORD_BITS`), so that it goes to and comes
/// from `sched_setaffinity(2)`, `sched_getaffinity(2)` and `mbind(2)` as
/// it is.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct IdSet {
    words: Box<[libc::c_ulong]>,
}

impl IdSet {
    /// The empty set.
    pub(crate) fn new() -> Self {
        Self {
            words: vec![0; MAX_ID / WORD_BITS].into_boxed_slice(),
        }
    }

    /// Adds the ids `first..=last` (both below [`MAX_ID`]), a word at a
    /// time.
    fn insert_range(&mut self, first: usize, last: usize) {
        debug_assert!(first <= last && last < MAX_ID);
        let (first_word, last_word) = (first / WORD_BITS, last / WORD_BITS);
        for (index, word) in self.words[first_word..=last_word].iter_mut().enumerate() {
            let index = first_word + index;
            let low = if index == first_word {
                first % WORD_BITS
            } else {
                0
            };
            let high = if index == last_word {
                last % WORD_BITS
            } else {
                WORD_BITS - 1
            };
            *word |= (libc::c_ulong::MAX >> (WORD_BITS - 1 - high)) & (libc::c_ulong::MAX << low);
        }
    }

    /// Adds `id`; `false` (and nothing added) if it is [`MAX_ID`] or more.
    pub(crate) fn insert(&mut self, id: usize) -> bool {
        if id >= MAX_ID {
            return false;
        }
        self.insert_range(id, id);
        true
    }

    /// Whether `id` is in the set.
    pub(crate) fn contains(&self, id: usize) -> bool {
        id < MAX_ID && self.words[id / WORD_BITS] & (1 << (id % WORD_BITS)) != 0
    }

    /// How many ids the set holds.
    #[cfg_attr(not(test), allow(dead_code))] // tests and diagnostics
    pub(crate) fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set is empty.
    pub(crate) fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// The ids, ascending.
    pub(crate) fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.words.iter().enumerate().flat_map(|(index, &word)| {
            let mut rest = word;
            std::iter::from_fn(move || {
                if rest == 0 {
                    return None;
                }
                let bit = rest.trailing_zeros() as usize;
                rest &= rest - 1;
                Some(index * WORD_BITS + bit)
            })
        })
    }

    /// The ids, ascending, in a vector.
    #[cfg_attr(not(test), allow(dead_code))] // tests and diagnostics
    pub(crate) fn to_vec(&self) -> Vec<usize> {
        self.iter().collect()
    }

    /// The ids in both sets.
    pub(crate) fn intersection(&self, other: &Self) -> Self {
        Self {
            words: self
                .words
                .iter()
                .zip(other.words.iter())
                .map(|(a, b)| a & b)
                .collect(),
        }
    }

    /// The words up to the last one with an id in it (none for the empty
    /// set): what a system call that takes a bitmap needs to read.
    fn used_words(&self) -> &[libc::c_ulong] {
        let used = self
            .words
            .iter()
            .rposition(|&w| w != 0)
            .map_or(0, |i| i + 1);
        &self.words[..used]
    }
}

impl fmt::Debug for IdSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl FromIterator<usize> for IdSet {
    /// The ids below [`MAX_ID`] among `ids` (others are left out).
    fn from_iter<I: IntoIterator<Item = usize>>(ids: I) -> Self {
        let mut set = Self::new();
        for id in ids {
            set.insert(id);
        }
        set
    }
}

// === impl Node ===

/// An online NUMA node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Node {
    /// The kernel's node id.
    pub(crate) id: u32,
    /// The node's CPUs: empty for a node without CPUs (memory only), or
    /// one whose CPU list could not be used.
    pub(crate) cpus: IdSet,
    /// Why the CPU list could not be used, if it could not.
    cpus_unusable: Option<Miss>,
    /// Whether the node has memory (`has_memory` in sysfs lists it).
    has_memory: bool,
}

impl Node {
    /// Reads node `id`'s CPU list under `root`.
    fn read(root: &Path, id: u32, has_memory: bool) -> Self {
        let path = root.join(format!("devices/system/node/node{id}/cpulist"));
        let (cpus, cpus_unusable) = match read_list(&path) {
            Ok(cpus) => (cpus, None),
            Err(miss) => (IdSet::new(), Some(miss)),
        };
        Self {
            id,
            cpus,
            cpus_unusable,
            has_memory,
        }
    }
}

// === impl Topology ===

/// The machine's NUMA nodes and the way to a PCI device's node, as sysfs
/// describes them under a root directory.
#[derive(Debug, Clone)]
pub(crate) struct Topology {
    /// The sysfs root (`/sys`, or a fake tree in tests).
    root: PathBuf,
    /// The online nodes, ascending by id; never empty when `Ok`.
    nodes: Result<Vec<Node>, Miss>,
}

impl Topology {
    /// The topology of this machine, from `/sys`.
    pub(crate) fn discover() -> Self {
        Self::from_root("/sys")
    }

    /// The topology described under `root`, a directory laid out like
    /// `/sys`. Never fails: what cannot be read is recorded, and
    /// [`Placement::choose`] falls back on it. Which nodes have memory
    /// comes from `has_memory`; without it the topology is unusable (every
    /// kernel with NUMA support writes it).
    pub(crate) fn from_root(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let online = root.join("devices/system/node/online");
        let nodes = read_list(&online).and_then(|ids| {
            if ids.is_empty() {
                return Err(Miss::malformed(online.display(), ""));
            }
            let memory = read_list(&root.join("devices/system/node/has_memory"))?;
            // `read_list` bounds ids by `MAX_ID`, which fits in a u32.
            Ok(ids
                .iter()
                .map(|id| Node::read(&root, id as u32, memory.contains(id)))
                .collect())
        });
        Self { root, nodes }
    }

    /// The online nodes for `mode`, or why no device is placed.
    fn usable_nodes(&self, mode: NumaMode) -> Result<&[Node], Fallback> {
        if mode == NumaMode::Off {
            return Err(Fallback::Off);
        }
        match &self.nodes {
            Err(miss) => Err(Fallback::NoTopology(miss.clone())),
            Ok(nodes) if nodes.len() == 1 => Err(Fallback::SingleNode),
            Ok(nodes) => Ok(nodes),
        }
    }

    /// A device's node among `nodes` (those of them in `mems`): the
    /// driver's, else sysfs's.
    fn place(&self, nodes: &[Node], mems: &IdSet, hint: &DeviceHint) -> Result<Placed, Fallback> {
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
            Some(bus_id) => match self.pci_node(nodes, mems, bus_id) {
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

    /// The node of the PCI function `bus_id` (as CUDA writes it) among
    /// `nodes` (those of them in `mems`), from its `numa_node` file.
    fn pci_node(&self, nodes: &[Node], mems: &IdSet, bus_id: &str) -> Result<usize, Miss> {
        let name = sysfs_bus_id(bus_id).ok_or_else(|| Miss::malformed("PCI bus id", bus_id))?;
        let path = self
            .root
            .join("bus/pci/devices")
            .join(name)
            .join("numa_node");
        let text = read_value(&path)?;
        let id = text
            .trim()
            .parse::<i64>()
            .map_err(|_| Miss::malformed(path.display(), &text))?;
        online(nodes, mems, id)
    }
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

// === impl Task ===

/// What the thread building a pool allows placement to do with memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Task {
    /// Its memory policy: placement binds memory only under the default.
    pub(crate) policy: TaskPolicy,
    /// The nodes its cpuset lets it allocate on (`Mems_allowed`): binding
    /// to another fails.
    pub(crate) mems: IdSet,
}

impl Task {
    /// The calling thread's (on systems other than Linux, the default
    /// policy and every node).
    pub(crate) fn current() -> Self {
        let policy = TaskPolicy::current();
        #[cfg(target_os = "linux")]
        {
            match linux::allowed_mems() {
                Ok(mems) => Self { policy, mems },
                Err(e) => Self {
                    policy: TaskPolicy::Unreadable(e.raw_os_error().unwrap_or(0)),
                    mems: IdSet::new(),
                },
            }
        }
        #[cfg(not(target_os = "linux"))]
        {
            Self {
                policy,
                mems: (0..MAX_NODES).collect(),
            }
        }
    }
}

// === impl TaskPolicy ===

/// The calling thread's memory policy (`get_mempolicy(2)`). Threads
/// inherit it, so it is the process's when `numactl --membind`,
/// `--interleave`, `--preferred` or `--localalloc` started it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskPolicy {
    /// `MPOL_DEFAULT`: no policy of its own.
    Default,
    /// Another mode (`MPOL_BIND`, `MPOL_INTERLEAVE`, ...), without its
    /// mode flags.
    Explicit(i32),
    /// The policy could not be read: the OS error (a sandbox forbidding
    /// the call, a kernel without NUMA support).
    Unreadable(i32),
}

impl TaskPolicy {
    /// The calling thread's policy (`Default` on systems other than
    /// Linux, where nothing is placed anyway).
    pub(crate) fn current() -> Self {
        #[cfg(target_os = "linux")]
        {
            match linux::task_policy() {
                // The mode flags (`MPOL_F_STATIC_NODES` and the like) sit
                // above the mode's own bits.
                Ok(mode) => match mode & MPOL_MODE_MASK {
                    0 => TaskPolicy::Default,
                    mode => TaskPolicy::Explicit(mode),
                },
                Err(e) => TaskPolicy::Unreadable(e.raw_os_error().unwrap_or(0)),
            }
        }
        #[cfg(not(target_os = "linux"))]
        {
            TaskPolicy::Default
        }
    }
}

/// The bits of a memory policy that hold its mode (the flags start at bit
/// 13, `MPOL_F_NUMA_BALANCING`).
#[cfg(target_os = "linux")]
const MPOL_MODE_MASK: i32 = (1 << 13) - 1;

impl fmt::Display for TaskPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TaskPolicy::Default => f.write_str("MPOL_DEFAULT"),
            TaskPolicy::Explicit(mode) => match mode {
                1 => f.write_str("MPOL_PREFERRED"),
                2 => f.write_str("MPOL_BIND"),
                3 => f.write_str("MPOL_INTERLEAVE"),
                4 => f.write_str("MPOL_LOCAL"),
                5 => f.write_str("MPOL_PREFERRED_MANY"),
                6 => f.write_str("MPOL_WEIGHTED_INTERLEAVE"),
                mode => write!(f, "mode {mode}"),
            },
            TaskPolicy::Unreadable(errno) => write!(
                f,
                "get_mempolicy failed: {}",
                io::Error::from_raw_os_error(errno)
            ),
        }
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
        let usable = topology.usable_nodes(mode).and_then(|nodes| {
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
                let choice = topology.place(nodes, &mems, hint);
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

// === parsing ===

/// Reads a small sysfs file as text.
fn read_value(path: &Path) -> Result<String, Miss> {
    let unreadable = |e: io::Error| Miss::Unreadable {
        path: path.to_path_buf(),
        kind: e.kind(),
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_FILE_BYTES).read_to_string(&mut text))
        .map_err(unreadable)?;
    Ok(text)
}

/// Reads and parses a sysfs list file (`online`, `cpulist`).
fn read_list(path: &Path) -> Result<IdSet, Miss> {
    let text = read_value(path)?;
    parse_cpulist(&text).map_err(|_| Miss::malformed(path.display(), &text))
}

/// Parses the kernel's list format (`cpulist`, a node's `online`):
/// comma-separated ids and inclusive ranges such as `0-3,8,10-11`, with
/// whitespace around items and a trailing newline allowed. An empty list
/// (a node without CPUs) is valid. Any other text (a stray character, an
/// empty item, a reversed or open range, an id of [`MAX_ID`] or more) is an
/// error naming the item. Ranges go into a fixed bitset a word at a time,
/// so time and memory stay small for any list a sysfs read returns,
/// however its ranges overlap.
fn parse_cpulist(text: &str) -> Result<IdSet, String> {
    let text = text.trim();
    let mut ids = IdSet::new();
    if text.is_empty() {
        return Ok(ids);
    }
    for item in text.split(',').map(str::trim) {
        let (first, last) = match item.split_once('-') {
            Some((first, last)) => (parse_id(first, item)?, parse_id(last, item)?),
            None => {
                let id = parse_id(item, item)?;
                (id, id)
            }
        };
        if first > last {
            return Err(format!("reversed range `{item}`"));
        }
        ids.insert_range(first, last);
    }
    Ok(ids)
}

/// One id of a list item: decimal digits only, below [`MAX_ID`].
fn parse_id(digits: &str, item: &str) -> Result<usize, String> {
    let digits = digits.trim();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("bad item `{item}`"));
    }
    digits
        .parse::<usize>()
        .ok()
        .filter(|&id| id < MAX_ID)
        .ok_or_else(|| format!("id out of range in `{item}`"))
}

/// The sysfs name of the PCI function CUDA calls `bus_id`, or `None` if
/// `bus_id` is not a bus id.
///
/// CUDA writes `[domain:]bus:device.function` in upper-case hex, with a
/// four- or (as `nvidia-smi` does) eight-digit domain, e.g. `0000:3B:00.0`
/// or `00000000:3B:00.0`; sysfs names the function in lower case with at
/// least four domain digits, `0000:3b:00.0` (five for the `10000` domains
/// of Intel VMD). Rebuilding the name from the parsed numbers also keeps a
/// stray `/` or `..` out of the path.
fn sysfs_bus_id(bus_id: &str) -> Option<String> {
    let bus_id = bus_id.trim_end_matches('\0').trim();
    let (rest, function) = bus_id.rsplit_once('.')?;
    let mut parts = rest.rsplitn(3, ':');
    let device = parts.next()?;
    let bus = parts.next()?;
    let domain = parts.next().unwrap_or("0");
    let domain = parse_hex(domain, u32::MAX)?;
    let bus = parse_hex(bus, 0xff)?;
    let device = parse_hex(device, 0x1f)?;
    let function = parse_hex(function, 7)?;
    Some(format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"))
}

/// A hex field of a bus id: one to eight hex digits, at most `max`.
fn parse_hex(digits: &str, max: u32) -> Option<u32> {
    let valid = (1..=8).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_hexdigit());
    valid
        .then(|| u32::from_str_radix(digits, 16).ok())
        .flatten()
        .filter(|&value| value <= max)
}

// === system calls ===

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

#[cfg(target_os = "linux")]
mod linux {
    use std::io;

    use libc::{c_int, c_long, c_ulong, c_void};

    use super::{IdSet, MAX_NODES, WORD_BITS};
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
}

#[cfg(test)]
mod tests;
