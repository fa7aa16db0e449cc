//! What the thread building a pool allows placement to do: its memory
//! policy (`get_mempolicy(2)`) and the nodes its cpuset lets it allocate
//! on. Placement binds memory only under the default policy, and only to
//! allowed nodes.

use std::fmt;
use std::io;

use super::ids::IdSet;
#[cfg(not(target_os = "linux"))]
use super::ids::MAX_NODES;
#[cfg(target_os = "linux")]
use super::linux;

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
