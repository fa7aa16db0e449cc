//! The default pinned budget: a share of the memory this process may use.
//!
//! The memory a process may use is the smaller of the host's (`MemTotal`
//! in `/proc/meminfo`) and its control group's limit (cgroup v2
//! `memory.max`, or cgroup v1 `memory.limit_in_bytes`, of its group and
//! every group above it). Where neither can be read (not Linux, no
//! `/proc`), there is no default bound.

/// The share of the memory the process may use that a pool pins at most by
/// default: a quarter (see [`PoolBuilder::max_pinned_bytes`]).
///
/// [`PoolBuilder::max_pinned_bytes`]: crate::PoolBuilder::max_pinned_bytes
pub const DEFAULT_PINNED_SHARE_PERCENT: u32 = 25;

/// The default pinned budget on this machine, in bytes (`usize::MAX`: no
/// bound found).
pub(crate) fn default_budget() -> usize {
    match memory_limit() {
        Some(bytes) => {
            let share = u128::from(bytes) * u128::from(DEFAULT_PINNED_SHARE_PERCENT) / 100;
            usize::try_from(share).unwrap_or(usize::MAX)
        }
        None => usize::MAX,
    }
}

/// The memory this process may use, in bytes, if it can be read.
fn memory_limit() -> Option<u64> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let total = read("/proc/meminfo").as_deref().and_then(mem_total);
    let group = read("/proc/self/cgroup")
        .as_deref()
        .and_then(|groups| cgroup_limit(groups, &|path| read(path)));
    match (total, group) {
        (Some(t), Some(g)) => Some(t.min(g)),
        (t, g) => t.or(g),
    }
}

/// The host's memory (`MemTotal`), in bytes, if it can be read.
pub(crate) fn host_memory_bytes() -> Option<u64> {
    mem_total(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// `MemTotal` of a `/proc/meminfo` text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line.split_whitespace().skip(1);
    let kib: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") | None => kib.checked_mul(1024),
        Some(_) => None,
    }
}

/// The memory limit of the control groups that a `/proc/self/cgroup` text
/// names, reading their files with `read`: the least limit of the cgroup
/// v2 group, or the cgroup v1 memory group, and the groups above it.
/// `None` when no limit is set or none can be read.
fn cgroup_limit(groups: &str, read: &dyn Fn(&str) -> Option<String>) -> Option<u64> {
    let mut least: Option<u64> = None;
    let mut note = |limit: Option<u64>| {
        if let Some(limit) = limit {
            least = Some(least.map_or(limit, |l| l.min(limit)));
        }
    };
    for line in groups.lines() {
        // hierarchy-ID:controllers:path
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if !path.starts_with('/') || path.split('/').any(|part| part == "..") {
            continue;
        }
        // This group and every one above it (a container without a
        // cgroup namespace sees its own group mounted at the root).
        let file = if controllers.is_empty() {
            ("/sys/fs/cgroup", "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
        } else {
            continue;
        };
        let mut at = path.trim_end_matches('/');
        loop {
            note(read(&format!("{}{at}/{}", file.0, file.1)).and_then(|t| limit_value(&t)));
            match at.rfind('/') {
                Some(cut) => at = &at[..cut],
                None => break,
            }
        }
    }
    least
}

/// A limit file's value: bytes, or `None` for `max` (v2), a value too
/// large to be a limit (v1 writes a page-rounded `i64::MAX` for none), or
/// text that is not a number.
fn limit_value(text: &str) -> Option<u64> {
    let bytes: u64 = text.trim().parse().ok()?;
    (bytes < 1 << 62).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_is_read_in_kib() {
        let meminfo = "MemTotal:       24576000 kB\nMemFree:  1000 kB\n";
        assert_eq!(mem_total(meminfo), Some(24_576_000 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(mem_total("MemTotal: lots kB\n"), None);
        assert_eq!(mem_total("MemTotal: 1 MB\n"), None);
        assert_eq!(mem_total("MemTotal: 18446744073709551615 kB\n"), None);
    }

    fn files<'a>(files: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |path| {
            files
                .iter()
                .find(|(p, _)| *p == path)
                .map(|(_, t)| t.to_string())
        }
    }

    #[test]
    fn cgroup_v2_takes_the_least_limit_up_the_tree() {
        let read = files(&[
            ("/sys/fs/cgroup/a/b/memory.max", "max\n"),
            ("/sys/fs/cgroup/a/memory.max", "8589934592\n"),
            ("/sys/fs/cgroup/memory.max", "17179869184\n"),
        ]);
        assert_eq!(cgroup_limit("0::/a/b\n", &read), Some(8 << 30));
        let none = files(&[("/sys/fs/cgroup/memory.max", "max\n")]);
        assert_eq!(cgroup_limit("0::/\n", &none), None);
        assert_eq!(cgroup_limit("0::/a\n", &files(&[])), None);
    }

    #[test]
    fn cgroup_v1_reads_the_memory_controller() {
        let read = files(&[
            (
                "/sys/fs/cgroup/memory/job/memory.limit_in_bytes",
                "4294967296\n",
            ),
            (
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
        ]);
        let groups = "12:cpu,cpuacct:/job\n4:memory:/job\n";
        assert_eq!(cgroup_limit(groups, &read), Some(4 << 30));
        assert_eq!(cgroup_limit("4:memory:/\n", &read), None);
    }

    #[test]
    fn cgroup_v1_takes_the_least_limit_up_the_tree() {
        // A container without a cgroup namespace: its own group is
        // mounted at the root of the hierarchy.
        let read = files(&[(
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "2147483648\n",
        )]);
        assert_eq!(
            cgroup_limit("12:memory:/docker/0123abcd\n", &read),
            Some(2 << 30)
        );
        let read = files(&[
            (
                "/sys/fs/cgroup/memory/a/b/memory.limit_in_bytes",
                "8589934592\n",
            ),
            (
                "/sys/fs/cgroup/memory/a/memory.limit_in_bytes",
                "4294967296\n",
            ),
        ]);
        assert_eq!(cgroup_limit("4:memory:/a/b\n", &read), Some(4 << 30));
    }

    #[test]
    fn odd_cgroup_lines_are_skipped() {
        let read = |_: &str| -> Option<String> { panic!("nothing should be read") };
        assert_eq!(cgroup_limit("", &read), None);
        assert_eq!(
            cgroup_limit("garbage\n0:\n0::relative\n0::/a/../b\n", &read),
            None
        );
    }

    #[test]
    fn the_default_is_a_quarter_of_what_can_be_read() {
        let budget = default_budget();
        match memory_limit() {
            Some(bytes) => assert_eq!(budget as u64, bytes / 4),
            None => assert_eq!(budget, usize::MAX),
        }
    }
}
