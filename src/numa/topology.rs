//! The machine's NUMA nodes as sysfs describes them, and the sysfs files
//! read to learn them.
//!
//! [`Topology::from_root`] reads `devices/system/node/online`,
//! `devices/system/node/has_memory` and each node's `cpulist` (in the
//! kernel's list format; see `Documentation/ABI/stable/sysfs-devices-node`
//! in the kernel tree) under a root that tests replace with a fake tree,
//! and [`Topology::pci_numa_node`] a PCI function's `numa_node`
//! (`Documentation/ABI/testing/sysfs-bus-pci`). Nothing here is an error:
//! what cannot be read or parsed is a [`Miss`], which the placement
//! explains in a trace line.

use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use super::ids::{parse_cpulist, IdSet};

/// The most bytes read from one sysfs file (sysfs writes at most a page).
pub(super) const MAX_FILE_BYTES: u64 = 64 << 10;

/// Malformed text is quoted in trace lines up to this many characters.
pub(super) const MAX_QUOTE: usize = 64;

// === impl Miss ===

/// Why one source of a node (the driver, a sysfs file) gave none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Miss {
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
    pub(super) fn malformed(what: impl fmt::Display, text: &str) -> Self {
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
    pub(super) cpus_unusable: Option<Miss>,
    /// Whether the node has memory (`has_memory` in sysfs lists it).
    pub(super) has_memory: bool,
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
    pub(super) nodes: Result<Vec<Node>, Miss>,
}

impl Topology {
    /// The topology of this machine, from `/sys`.
    pub(crate) fn discover() -> Self {
        Self::from_root("/sys")
    }

    /// The topology described under `root`, a directory laid out like
    /// `/sys`. Never fails: what cannot be read is recorded, and
    /// `Placement::choose` falls back on it. Which nodes have memory
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

    /// The node id the PCI function `bus_id` (as CUDA writes it) gives in
    /// its `numa_node` file: `-1` where the firmware does not say.
    pub(super) fn pci_numa_node(&self, bus_id: &str) -> Result<i64, Miss> {
        let name = sysfs_bus_id(bus_id).ok_or_else(|| Miss::malformed("PCI bus id", bus_id))?;
        let path = self
            .root
            .join("bus/pci/devices")
            .join(name)
            .join("numa_node");
        let text = read_value(&path)?;
        text.trim()
            .parse::<i64>()
            .map_err(|_| Miss::malformed(path.display(), &text))
    }
}

// === reading sysfs ===

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

/// The sysfs name of the PCI function CUDA calls `bus_id`, or `None` if
/// `bus_id` is not a bus id.
///
/// CUDA writes `[domain:]bus:device.function` in upper-case hex, with a
/// four- or (as `nvidia-smi` does) eight-digit domain, e.g. `0000:3B:00.0`
/// or `00000000:3B:00.0`; sysfs names the function in lower case with at
/// least four domain digits, `0000:3b:00.0` (five for the `10000` domains
/// of Intel VMD). Rebuilding the name from the parsed numbers also keeps a
/// stray `/` or `..` out of the path.
pub(super) fn sysfs_bus_id(bus_id: &str) -> Option<String> {
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
