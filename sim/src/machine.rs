//! What the run's machine is.

/// A figure of `/proc/meminfo` (`MemTotal`, `MemAvailable`, ...), in
/// bytes, if readable.
fn meminfo(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// Memory that can be allocated now without swapping, in bytes, if known.
pub fn available_memory() -> Option<u64> {
    meminfo("MemAvailable")
}

/// The machine a run is on.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Machine {
    /// Its name, from `/etc/hostname`, if readable.
    pub hostname: Option<String>,
    /// CPUs this process may use.
    pub cpus: usize,
    /// Total memory, from `/proc/meminfo`, if readable.
    pub total_memory_bytes: Option<u64>,
}

impl Machine {
    /// The machine this process runs on.
    pub fn this() -> Self {
        let hostname = std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|name| name.trim().to_string())
            .filter(|name| !name.is_empty());
        Self {
            hostname,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            total_memory_bytes: meminfo("MemTotal"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_machine() {
        let machine = Machine::this();
        assert!(machine.cpus >= 1);
        if std::path::Path::new("/proc/meminfo").exists() {
            assert!(machine.total_memory_bytes.unwrap() >= available_memory().unwrap());
        }
    }
}
