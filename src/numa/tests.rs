//! Tests of NUMA placement: parsing, fake sysfs trees, trace lines, and
//! the system calls on this machine.

use std::fs;
use std::path::PathBuf;

use super::ids::{parse_cpulist, MAX_ID, MAX_NODES, WORD_BITS};
use super::topology::{sysfs_bus_id, MAX_FILE_BYTES, MAX_QUOTE};
use super::*;
use crate::sync::{thread, Arc, Mutex, OnceLock};

// === a fake sysfs tree ===

/// A sysfs-like tree in a directory of its own under the temporary
/// directory, removed on drop.
struct FakeSysfs {
    root: PathBuf,
}

impl FakeSysfs {
    fn new(name: &str) -> Self {
        let root = std::env::temp_dir().join(format!("pinpool-numa-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).expect("create the fake sysfs root");
        Self { root }
    }

    /// Writes `text` to `path` under the root.
    fn file(&self, path: &str, text: &str) -> &Self {
        let path = self.root.join(path);
        fs::create_dir_all(path.parent().expect("a parent")).expect("create a directory");
        fs::write(path, text).expect("write a fake sysfs file");
        self
    }

    /// The online nodes, every one with memory (until [`memory`] says
    /// otherwise).
    ///
    /// [`memory`]: Self::memory
    fn online(&self, list: &str) -> &Self {
        self.file("devices/system/node/online", list).memory(list)
    }

    /// The nodes with memory.
    fn memory(&self, list: &str) -> &Self {
        self.file("devices/system/node/has_memory", list)
    }

    fn cpus(&self, node: u32, list: &str) -> &Self {
        self.file(&format!("devices/system/node/node{node}/cpulist"), list)
    }

    fn pci(&self, name: &str, numa_node: &str) -> &Self {
        self.file(&format!("bus/pci/devices/{name}/numa_node"), numa_node)
    }

    /// Two nodes of four CPUs each.
    fn two_nodes(name: &str) -> Self {
        let fake = Self::new(name);
        fake.online("0-1\n").cpus(0, "0-3\n").cpus(1, "4-7\n");
        fake
    }

    fn topology(&self) -> Topology {
        Topology::from_root(&self.root)
    }
}

impl Drop for FakeSysfs {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn hint(driver_node: Option<i32>, pci_bus_id: Option<&str>) -> DeviceHint {
    DeviceHint {
        driver_node,
        pci_bus_id: pci_bus_id.map(String::from),
    }
}

/// [`Placement::choose`] for a task with the default memory policy,
/// allowed every node (whatever this test process's own are).
fn choose(mode: NumaMode, topology: &Topology, hints: &[DeviceHint]) -> Placement {
    Placement::choose_under(mode, topology, hints, || Task::with(TaskPolicy::Default))
}

fn node_ids(placement: &Placement, devices: usize) -> Vec<Option<u32>> {
    (0..devices)
        .map(|device| placement.node(device).map(|node| node.id))
        .collect()
}

/// Runs `f` with a subscriber that records every event, and returns
/// the recorded lines.
///
/// Other tests hit the same callsites at the same time on threads
/// without a subscriber. While one scoped dispatcher is the only one
/// registered, tracing-core computes a new callsite's interest from
/// the registering thread's dispatcher alone (its `has_just_one` fast
/// path), so a callsite first hit on such a thread would be disabled
/// for every thread, ours included. A second dispatcher, kept alive for
/// the whole run, makes it ask every registered dispatcher instead.
fn traced(f: impl FnOnce()) -> Vec<String> {
    static SECOND: OnceLock<tracing::Dispatch> = OnceLock::new();
    SECOND.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
    let buffer = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&buffer);
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .without_time()
        .with_writer(move || Capture(Arc::clone(&sink)))
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8(buffer.lock().clone()).expect("utf-8 log");
    text.lines().map(String::from).collect()
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl io::Write for Capture {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

// === parsing ===

#[test]
fn cpulist_parses_the_kernel_format() {
    let cases: &[(&str, &[usize])] = &[
        ("0", &[0]),
        ("0-3", &[0, 1, 2, 3]),
        ("0,2-3", &[0, 2, 3]),
        ("0-1,4,6-7\n", &[0, 1, 4, 6, 7]),
        (" 8-9 , 1 \n", &[1, 8, 9]),
        ("3,0-3,2", &[0, 1, 2, 3]),
        ("5-5", &[5]),
        ("", &[]),
        ("\n", &[]),
        ("  \t\n", &[]),
    ];
    for (text, want) in cases {
        assert_eq!(
            parse_cpulist(text).map(|ids| ids.to_vec()).as_deref(),
            Ok(*want),
            "{text:?}"
        );
    }
}

#[test]
fn cpulist_rejects_garbage() {
    let garbage = "a|0-|-1|1-0|0,,1|0,|,0|0-1-2|0x1|+1|1 2|0:3|65536|0-4294967295|\
        99999999999999999999999|0-3:2";
    for text in garbage.split('|') {
        assert!(parse_cpulist(text).is_err(), "{text:?} parsed");
    }
}

#[test]
fn bus_ids_are_rewritten_as_sysfs_names() {
    let cases = [
        ("0000:3B:00.0", "0000:3b:00.0"),
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("0000:3b:00.0", "0000:3b:00.0"),
        ("3B:00.0", "0000:3b:00.0"),
        ("0001:C1:1F.7", "0001:c1:1f.7"),
        ("10000:01:00.0", "10000:01:00.0"),
        ("0000:3B:00.0\0\0\0", "0000:3b:00.0"),
        (" 0000:3B:00.0\n", "0000:3b:00.0"),
    ];
    for (cuda, sysfs) in cases {
        assert_eq!(sysfs_bus_id(cuda).as_deref(), Some(sysfs), "{cuda:?}");
    }
    for bad in [
        "",
        "garbage",
        "0000:3G:00.0",
        "0000:3b:20.0",
        "0000:3b:00.8",
        "0000:100:00.0",
        "0:0000:3b:00.0",
        "../../../etc:00.0",
        "0000:3b:00",
        "0000:+3b:00.0",
        "123456789:3b:00.0",
    ] {
        assert_eq!(sysfs_bus_id(bad), None, "{bad:?}");
    }
}

#[test]
fn numa_mode_parses_auto_and_off() {
    assert_eq!("auto".parse(), Ok(NumaMode::Auto));
    assert_eq!(" OFF \n".parse(), Ok(NumaMode::Off));
    assert!("on".parse::<NumaMode>().is_err());
    assert!("".parse::<NumaMode>().is_err());
    assert_eq!(NumaMode::default(), NumaMode::Auto);
    for mode in [NumaMode::Auto, NumaMode::Off] {
        assert_eq!(mode.to_string().parse(), Ok(mode));
    }
}

// === topology ===

#[test]
fn topology_reads_nodes_and_cpus() {
    let fake = FakeSysfs::new("read");
    fake.online("0,2-3\n")
        .cpus(0, "0-1,8-9\n")
        .cpus(2, "\n")
        .cpus(3, "junk");
    let nodes = fake.topology().nodes.expect("readable topology");
    let ids: Vec<u32> = nodes.iter().map(|n| n.id).collect();
    assert_eq!(ids, [0, 2, 3]);
    assert_eq!(nodes[0].cpus.to_vec(), [0, 1, 8, 9]);
    assert_eq!((nodes[1].cpus.len(), &nodes[1].cpus_unusable), (0, &None));
    assert!(nodes[2].cpus.is_empty());
    assert!(matches!(
        nodes[2].cpus_unusable,
        Some(Miss::Malformed { .. })
    ));
}

#[test]
fn discovery_on_this_machine_never_panics() {
    let topology = Topology::discover();
    if let Ok(nodes) = &topology.nodes {
        assert!(!nodes.is_empty());
    }
    let placement = Placement::choose(NumaMode::Auto, &topology, &[DeviceHint::default()]);
    assert_eq!(placement.devices.len(), 1);
}

// === placement ===

/// Two nodes, and PCI devices whose `numa_node` files hold good and
/// bad values.
fn devices_tree(name: &str) -> FakeSysfs {
    let fake = FakeSysfs::two_nodes(name);
    fake.pci("0000:3b:00.0", "0\n")
        .pci("0000:86:00.0", "1\n")
        .pci("0000:af:00.0", "-1\n")
        .pci("0000:d8:00.0", "garbage\n")
        .pci("0000:da:00.0", "")
        .pci("0000:db:00.0", "7\n")
        .pci("0000:dc:00.0", "-5\n");
    fake
}

#[test]
fn placement_prefers_the_driver_then_sysfs() {
    let fake = devices_tree("sources");
    let cases = [
        // The driver wins over sysfs.
        (hint(Some(1), Some("0000:3B:00.0")), 1, Source::Driver),
        // No driver answer: sysfs, found from CUDA's spelling.
        (hint(None, Some("0000:3B:00.0")), 0, Source::Sysfs),
        // The driver does not know; nvidia-smi's eight-digit domain.
        (hint(Some(-1), Some("00000000:86:00.0")), 1, Source::Sysfs),
        // The driver names an offline node.
        (hint(Some(9), Some("0000:86:00.0")), 1, Source::Sysfs),
    ];
    let hints: Vec<DeviceHint> = cases.iter().map(|(hint, ..)| hint.clone()).collect();
    let placement = choose(NumaMode::Auto, &fake.topology(), &hints);
    for (device, (hint, node, source)) in cases.iter().enumerate() {
        let placed = placement.devices[device].as_ref().expect("placed");
        assert_eq!(
            (placement.nodes[placed.node].id, placed.source),
            (*node, *source),
            "{hint:?}"
        );
    }
    assert_eq!(
        placement.node(0).map(|n| n.cpus.to_vec()),
        Some(vec![4, 5, 6, 7])
    );
    assert_eq!(
        placement.node(cases.len()),
        None,
        "a device beyond the hints"
    );
}

#[test]
fn bad_device_data_falls_back_to_no_node() {
    let fake = devices_tree("fallbacks");
    let topology = fake.topology();
    let why = |driver_node, pci_bus_id| {
        let placement = choose(NumaMode::Auto, &topology, &[hint(driver_node, pci_bus_id)]);
        assert_eq!(placement.node(0), None);
        match placement.devices[0].clone() {
            Err(Fallback::NoNode { driver, sysfs }) => (driver, sysfs),
            other => panic!("{other:?}"),
        }
    };
    let malformed = |miss: &Miss| match miss {
        Miss::Malformed { what, text } => (what.clone(), text.clone()),
        other => panic!("{other:?}"),
    };
    assert_eq!(why(None, None), (Miss::Absent, Miss::Absent));
    assert_eq!(
        why(None, Some("0000:AF:00.0")),
        (Miss::Absent, Miss::Unknown)
    );
    assert_eq!(
        why(Some(5), Some("0000:DB:00.0")),
        (Miss::Offline(5), Miss::Offline(7))
    );
    let (driver, missing) = why(Some(-1), Some("0000:D9:00.0"));
    assert_eq!(driver, Miss::Unknown);
    assert!(matches!(
        missing,
        Miss::Unreadable {
            kind: io::ErrorKind::NotFound,
            ..
        }
    ));
    assert_eq!(malformed(&why(None, Some("0000:D8:00.0")).1).1, "garbage\n");
    assert_eq!(malformed(&why(None, Some("0000:DA:00.0")).1).1, "");
    assert_eq!(
        malformed(&why(None, Some("not-a-bus-id")).1),
        ("PCI bus id".into(), "not-a-bus-id".into())
    );
    let (driver, sysfs) = why(Some(-3), Some("0000:DC:00.0"));
    assert_eq!(malformed(&driver).1, "-3");
    assert_eq!(malformed(&sysfs).1, "-5");
    let long = "x".repeat(1000);
    assert_eq!(malformed(&why(None, Some(&long)).1).1.len(), MAX_QUOTE);
}

#[test]
fn numa_off_places_nothing() {
    let fake = FakeSysfs::two_nodes("off");
    fake.pci("0000:3b:00.0", "1\n");
    let hints = [hint(Some(1), Some("0000:3B:00.0")), hint(Some(0), None)];
    let placement = choose(NumaMode::Off, &fake.topology(), &hints);
    assert_eq!(node_ids(&placement, 2), [None, None]);
    assert!(placement.devices.iter().all(|d| d == &Err(Fallback::Off)));
    assert!(placement.worker_node().is_none());
}

#[test]
fn one_node_places_nothing() {
    let fake = FakeSysfs::new("single");
    fake.online("0\n")
        .cpus(0, "0-7\n")
        .pci("0000:3b:00.0", "0\n");
    let hints = [
        hint(Some(0), Some("0000:3B:00.0")),
        hint(None, Some("0000:3B:00.0")),
    ];
    let placement = choose(NumaMode::Auto, &fake.topology(), &hints);
    assert_eq!(node_ids(&placement, 2), [None, None]);
    assert!(placement
        .devices
        .iter()
        .all(|d| d == &Err(Fallback::SingleNode)));
}

#[test]
fn unusable_node_lists_place_nothing() {
    let hints = [hint(Some(0), None), hint(Some(1), None)];
    let cases: [(&str, Option<&str>); 4] = [
        ("missing", None),
        ("junk", Some("zero-one\n")),
        ("empty", Some("\n")),
        ("huge", Some("0-99999999\n")),
    ];
    for (name, online) in cases {
        let fake = FakeSysfs::new(&format!("online-{name}"));
        if let Some(text) = online {
            fake.online(text);
        }
        let placement = choose(NumaMode::Auto, &fake.topology(), &hints);
        assert_eq!(node_ids(&placement, 2), [None, None], "{name}");
        assert!(
            matches!(placement.devices[0], Err(Fallback::NoTopology(_))),
            "{name}: {:?}",
            placement.devices[0]
        );
    }
}

#[test]
fn sparse_node_ids_and_cpuless_nodes() {
    let fake = FakeSysfs::new("sparse");
    fake.online("0,2\n")
        .cpus(0, "0-3\n")
        .cpus(2, "")
        .pci("0000:3b:00.0", "2\n")
        .pci("0000:86:00.0", "1\n");
    let hints = [
        hint(None, Some("0000:3b:00.0")),
        hint(None, Some("0000:86:00.0")),
    ];
    let placement = choose(NumaMode::Auto, &fake.topology(), &hints);
    assert_eq!(node_ids(&placement, 2), [Some(2), None]);
    assert!(placement.node(0).is_some_and(|node| node.cpus.is_empty()));
    assert_eq!(
        placement.devices[1],
        Err(Fallback::NoNode {
            driver: Miss::Absent,
            sysfs: Miss::Offline(1)
        })
    );
}

#[test]
fn devices_are_not_placed_on_nodes_without_memory() {
    let fake = FakeSysfs::two_nodes("memoryless");
    // Node 1 has CPUs but no memory: binding a range to it fails (EINVAL)
    // on every allocation.
    fake.memory("0\n")
        .pci("0000:3b:00.0", "1\n")
        .pci("0000:86:00.0", "0\n");
    let hints = [
        hint(Some(1), None),
        hint(Some(1), Some("0000:86:00.0")),
        hint(None, Some("0000:3b:00.0")),
        hint(Some(0), None),
    ];
    let placement = choose(NumaMode::Auto, &fake.topology(), &hints);
    assert_eq!(
        node_ids(&placement, 4),
        [None, Some(0), None, Some(0)],
        "{placement:?}"
    );
    assert_eq!(
        placement.devices[0],
        Err(Fallback::NoNode {
            driver: Miss::NoMemory(1),
            sysfs: Miss::Absent
        })
    );
    assert_eq!(
        placement.devices[2],
        Err(Fallback::NoNode {
            driver: Miss::Absent,
            sysfs: Miss::NoMemory(1)
        })
    );
    // Without the list of nodes with memory, nothing is placed.
    fs::remove_file(fake.root.join("devices/system/node/has_memory")).expect("remove");
    let placement = choose(NumaMode::Auto, &fake.topology(), &hints);
    assert_eq!(node_ids(&placement, 4), [None; 4]);
    assert!(
        matches!(
            &placement.devices[3],
            Err(Fallback::NoTopology(Miss::Unreadable { path, .. })) if path.ends_with("has_memory")
        ),
        "{placement:?}"
    );
}

/// Sets the calling thread's memory policy to `mode` over `nodes`
/// (`set_mempolicy(2)`), as `numactl --membind` or `--interleave` does for
/// a process; `false` if a sandbox forbids it.
#[cfg(target_os = "linux")]
fn set_mempolicy(mode: libc::c_int, nodes: &[usize]) -> bool {
    let nodes: IdSet = nodes.iter().copied().collect();
    let mask = nodes.used_words();
    // SAFETY: the kernel reads `mask.len()` words from a live slice (none
    // for an empty mask, with a null pointer) and writes nothing.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_set_mempolicy,
            mode,
            if mask.is_empty() {
                std::ptr::null()
            } else {
                mask.as_ptr()
            },
            (mask.len() * WORD_BITS + 1) as libc::c_ulong,
        )
    };
    if rc == 0 {
        return true;
    }
    let e = io::Error::last_os_error();
    assert!(forbidden(&e), "set_mempolicy: {e}");
    eprintln!("skipped: set_mempolicy is not permitted here ({e})");
    false
}

#[cfg(target_os = "linux")]
#[test]
fn an_explicit_memory_policy_of_the_task_is_kept() {
    let fake = FakeSysfs::two_nodes("task-policy");
    let topology = fake.topology();
    let hints = [hint(Some(0), None), hint(Some(1), None)];
    thread::spawn(move || {
        for (name, mode) in [
            ("MPOL_BIND", libc::MPOL_BIND),
            ("MPOL_INTERLEAVE", libc::MPOL_INTERLEAVE),
            ("MPOL_PREFERRED", libc::MPOL_PREFERRED),
        ] {
            if !set_mempolicy(mode, &[0]) {
                return;
            }
            let placement = Placement::choose(NumaMode::Auto, &topology, &hints);
            assert_eq!(
                node_ids(&placement, 2),
                [None, None],
                "under a task policy of {name}, mbind would override it"
            );
            assert_eq!(
                placement.devices[1],
                Err(Fallback::TaskPolicy(TaskPolicy::Explicit(mode))),
                "{name}"
            );
        }
        // Mode flags are not part of the mode.
        const MPOL_F_STATIC_NODES: libc::c_int = 1 << 15;
        assert!(set_mempolicy(libc::MPOL_BIND | MPOL_F_STATIC_NODES, &[0]));
        assert_eq!(TaskPolicy::current(), TaskPolicy::Explicit(libc::MPOL_BIND));
        assert!(set_mempolicy(libc::MPOL_DEFAULT, &[]));
        let placement = Placement::choose(NumaMode::Auto, &topology, &hints);
        assert!(
            placement
                .devices
                .iter()
                .all(|d| !matches!(d, Err(Fallback::TaskPolicy(_)))),
            "{placement:?}"
        );
    })
    .join()
    .expect("the thread with its own memory policy");
}

impl Task {
    /// A task with `policy`, allowed every node.
    fn with(policy: TaskPolicy) -> Self {
        Task {
            policy,
            mems: (0..MAX_NODES).collect(),
        }
    }
}

#[test]
fn devices_are_not_placed_on_nodes_the_task_may_not_allocate_on() {
    // A cpuset (a container's `cpuset.mems`) allows node 0 only: binding
    // to node 1 fails on every allocation.
    let fake = FakeSysfs::two_nodes("mems-allowed");
    fake.pci("0000:86:00.0", "0\n");
    let hints = [
        hint(Some(1), None),
        hint(Some(1), Some("0000:86:00.0")),
        hint(Some(0), None),
    ];
    let placement = Placement::choose_under(NumaMode::Auto, &fake.topology(), &hints, || Task {
        policy: TaskPolicy::Default,
        mems: ids(&[0]),
    });
    assert_eq!(
        node_ids(&placement, 3),
        [None, Some(0), Some(0)],
        "{placement:?}"
    );
    assert_eq!(
        placement.devices[0],
        Err(Fallback::NoNode {
            driver: Miss::NotAllowed(1),
            sysfs: Miss::Absent
        })
    );
}

#[cfg(target_os = "linux")]
#[test]
fn the_tasks_allowed_nodes_are_the_kernels() {
    let status = fs::read_to_string("/proc/thread-self/status").expect("status");
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Mems_allowed_list:"))
        .expect("Mems_allowed_list");
    let task = Task::current();
    if let TaskPolicy::Unreadable(errno) = task.policy {
        eprintln!("skipped: get_mempolicy is not permitted here (errno {errno})");
        return;
    }
    assert_eq!(task.mems, parse_cpulist(line).expect("kernel list"));
}

#[test]
fn task_policies_are_fallbacks_once_the_topology_can_place() {
    let hints = [hint(Some(0), None), hint(Some(1), None)];
    let fake = FakeSysfs::two_nodes("policy-fallback");
    let topology = fake.topology();
    for policy in [
        TaskPolicy::Explicit(libc::MPOL_INTERLEAVE),
        TaskPolicy::Unreadable(libc::EPERM),
    ] {
        let lines = traced(|| {
            let placement =
                Placement::choose_under(NumaMode::Auto, &topology, &hints, || Task::with(policy));
            assert!(placement
                .devices
                .iter()
                .all(|d| d == &Err(Fallback::TaskPolicy(policy))));
        });
        assert_eq!(lines.len(), 1, "{lines:#?}");
        assert!(lines[0].contains("memory policy is kept"), "{lines:#?}");
    }
    let lines = traced(|| {
        let placement = Placement::choose_under(NumaMode::Auto, &topology, &hints, || {
            Task::with(TaskPolicy::Default)
        });
        assert_eq!(node_ids(&placement, 2), [Some(0), Some(1)]);
    });
    assert!(
        lines.iter().all(|l| !l.contains("memory policy")),
        "{lines:#?}"
    );
    assert_eq!(
        TaskPolicy::Explicit(libc::MPOL_BIND).to_string(),
        "MPOL_BIND"
    );
    // Off, or one node: the policy is not even read.
    let single = FakeSysfs::new("policy-single");
    single.online("0\n").cpus(0, "0-3\n");
    for (mode, topology) in [
        (NumaMode::Off, &topology),
        (NumaMode::Auto, &single.topology()),
    ] {
        Placement::choose_under(mode, topology, &hints, || {
            panic!("the task's policy read for nothing")
        });
    }
}

#[test]
fn workers_are_pinned_only_when_the_devices_share_one_node() {
    let fake = FakeSysfs::new("workers");
    fake.online("0-3\n");
    for node in 0..4 {
        fake.cpus(node, &format!("{}-{}\n", node * 2, node * 2 + 1));
    }
    let topology = fake.topology();
    // Devices on nodes 1 and 3: cleaner work is not routed by node, so a
    // worker pinned to one node would zero the other's blocks across the
    // interconnect. No worker is pinned.
    let hints = [
        hint(Some(3), None),
        hint(Some(1), None),
        hint(Some(3), None),
    ];
    let placement = choose(NumaMode::Auto, &topology, &hints);
    assert_eq!(placement.worker_node(), None, "devices on two nodes");
    // Every placed device on node 3 (one unplaced): all workers there.
    let hints = [hint(Some(3), None), hint(None, None), hint(Some(3), None)];
    let placement = choose(NumaMode::Auto, &topology, &hints);
    assert_eq!(
        placement.worker_node().map(|n| (n.id, n.cpus.to_vec())),
        Some((3, vec![6, 7])),
        "devices on one node"
    );
}

// === trace lines ===

#[test]
fn each_fallback_is_traced_once() {
    let fake = FakeSysfs::two_nodes("trace");
    fake.pci("0000:3b:00.0", "0\n")
        .pci("0000:af:00.0", "nonsense\n");
    let hints = [
        hint(None, Some("0000:3b:00.0")),
        hint(None, Some("0000:af:00.0")),
        hint(None, None),
    ];
    let topology = fake.topology();
    let lines = traced(|| drop(choose(NumaMode::Auto, &topology, &hints)));
    let about = |device: usize| {
        lines
            .iter()
            .filter(|l| l.contains("no NUMA node") && l.contains(&format!("device={device}")))
            .count()
    };
    assert_eq!((about(0), about(1), about(2)), (0, 1, 1), "{lines:#?}");
    assert!(lines.iter().any(|l| l.contains("nonsense")), "{lines:#?}");
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains("pinpool: NUMA placement"))
            .count(),
        1
    );

    let lines = traced(|| drop(choose(NumaMode::Off, &topology, &hints)));
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("numa=off"), "{lines:#?}");

    let empty = FakeSysfs::new("trace-empty");
    let lines = traced(|| drop(choose(NumaMode::Auto, &empty.topology(), &hints)));
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("no NUMA topology"), "{lines:#?}");
}

#[test]
fn unknown_cpus_of_a_used_node_are_traced_once() {
    let fake = FakeSysfs::new("trace-cpus");
    fake.online("0-1\n").cpus(0, "0-3\n");
    let hints = [hint(Some(1), None), hint(Some(1), None)];
    let topology = fake.topology();
    let lines = traced(|| drop(choose(NumaMode::Auto, &topology, &hints)));
    let cpus = lines.iter().filter(|l| l.contains("CPUs unknown")).count();
    assert_eq!(cpus, 1, "{lines:#?}");
}

// === system calls ===

/// Whether `e` means the sandbox forbids the call (skip the test).
fn forbidden(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EPERM | libc::ENOSYS))
}

/// A fresh anonymous mapping, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(pages: usize) -> Self {
        let len = pages * crate::size_class::page_size();
        // SAFETY: an anonymous private mapping with no address hint
        // touches no existing memory; the result is checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED, "mmap failed");
        Self {
            ptr: ptr.cast(),
            len,
        }
    }

    fn touch(&self) {
        let page = crate::size_class::page_size();
        for offset in (0..self.len).step_by(page) {
            // SAFETY: `offset < len`, inside the live mapping.
            unsafe { self.ptr.add(offset).write_volatile(1) };
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr` is a mapping of `len` bytes made in `new`, used
        // by nothing else.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(target_os = "linux")]
#[test]
fn bind_range_places_touched_pages_on_node_zero() {
    let pages = 16;
    let mapping = Mapping::new(pages);
    match bind_range(mapping.ptr, mapping.len, 0) {
        Err(e) if forbidden(&e) => {
            eprintln!("skipped: mbind is not permitted here ({e})");
            return;
        }
        result => result.expect("mbind to node 0"),
    }
    match pages_on_node(mapping.ptr, mapping.len, 0) {
        Err(e) if forbidden(&e) => {
            eprintln!("skipped: move_pages is not permitted here ({e})");
            return;
        }
        result => assert_eq!(result.expect("move_pages"), 0, "untouched pages"),
    }
    mapping.touch();
    let on_node = pages_on_node(mapping.ptr, mapping.len, 0).expect("move_pages");
    assert_eq!(on_node, pages);
    assert_eq!(bind_range(mapping.ptr, 0, 0).ok(), Some(()), "empty range");
}

#[cfg(target_os = "linux")]
#[test]
fn bad_binds_are_errors_not_panics() {
    let mapping = Mapping::new(2);
    let misaligned = mapping.ptr.wrapping_add(1);
    for (ptr, node) in [
        (mapping.ptr, 1000),
        (misaligned, 0),
        (mapping.ptr, u32::MAX),
    ] {
        assert!(
            bind_range(ptr, mapping.len - 1, node).is_err(),
            "node {node}"
        );
    }
}

/// The CPUs the calling thread may run on, as the kernel reports them.
#[cfg(target_os = "linux")]
fn allowed_cpus() -> Vec<usize> {
    let status = fs::read_to_string("/proc/thread-self/status").expect("status");
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list")
        .to_owned();
    parse_cpulist(&line).expect("kernel cpulist").to_vec()
}

fn ids(ids: &[usize]) -> IdSet {
    ids.iter().copied().collect()
}

#[cfg(target_os = "linux")]
#[test]
fn pinning_restricts_the_thread() {
    let first = allowed_cpus()[0];
    thread::spawn(move || {
        pin_current_thread(&ids(&[first])).expect("pin to an allowed CPU");
        assert_eq!(allowed_cpus(), [first]);
        let e = pin_current_thread(&IdSet::new()).expect_err("no CPUs");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(
            pin_current_thread(&ids(&[MAX_ID - 1])).is_err(),
            "absent CPU"
        );
        assert_eq!(allowed_cpus(), [first], "failures leave the mask alone");
    })
    .join()
    .expect("pinning thread");
}

/// Restricts the calling thread to `cpus` directly, as `taskset` or a
/// batch scheduler's binding would.
#[cfg(target_os = "linux")]
fn set_affinity(cpus: &[usize]) {
    // SAFETY: `cpu_set_t` is plain data, valid when zeroed.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        // SAFETY: `cpu` is below CPU_SETSIZE (it came from the kernel's
        // list of this thread's CPUs); `set` is a live set.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: pid 0 is the calling thread; the kernel reads `size_of` bytes
    // of `set`.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    assert_eq!(rc, 0, "sched_setaffinity: {}", io::Error::last_os_error());
}

#[cfg(target_os = "linux")]
#[test]
fn pinning_never_leaves_the_cpus_the_thread_may_use() {
    let allowed = allowed_cpus();
    let [a, b, ..] = allowed[..] else {
        eprintln!("skipped: needs two CPUs, this thread may use {allowed:?}");
        return;
    };
    thread::spawn(move || {
        // An operator limited the process to CPU `a`; a node's CPUs are
        // `b` only: the worker stays where it was allowed.
        set_affinity(&[a]);
        let pinned = pin_current_thread(&ids(&[b]));
        assert_eq!(
            allowed_cpus(),
            [a],
            "a thread limited to CPU {a} pinned to CPU {b}"
        );
        let e = pinned.expect_err("nothing to pin to");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        // A node with one of the allowed CPUs (and one absent): that one.
        set_affinity(&[a, b]);
        pin_current_thread(&ids(&[b, MAX_ID - 1])).expect("pin to CPU b");
        assert_eq!(allowed_cpus(), [b]);
    })
    .join()
    .expect("pinning thread");
}

#[test]
fn id_sets_hold_ids_below_the_bound() {
    let mut set = IdSet::new();
    assert!(set.is_empty() && set.used_words().is_empty());
    for id in [0, 1, 63, 64, 65, 4095, MAX_ID - 1] {
        assert!(set.insert(id), "{id}");
    }
    assert!(!set.insert(MAX_ID) && !set.contains(MAX_ID));
    assert_eq!(set.to_vec(), [0, 1, 63, 64, 65, 4095, MAX_ID - 1]);
    assert_eq!(set.len(), 7);
    assert!(set.contains(64) && !set.contains(2));
    assert_eq!(set.used_words().len(), MAX_ID / WORD_BITS);
    let mut range = IdSet::new();
    range.insert_range(60, 130);
    assert_eq!(range.to_vec(), (60..=130).collect::<Vec<_>>());
    assert_eq!(range.used_words().len(), 130 / WORD_BITS + 1);
    assert_eq!(format!("{:?}", ids(&[3, 1])), "{1, 3}");
}

#[test]
fn a_long_list_of_overlapping_ranges_parses_quickly_in_little_memory() {
    // The longest list a sysfs file read holds, each item the whole id
    // range: expanded item by item, 4 GiB of ids before deduplication.
    let item = format!("0-{}", MAX_ID - 1);
    let items = MAX_FILE_BYTES as usize / (item.len() + 1);
    let text = vec![item; items].join(",");
    let started = std::time::Instant::now();
    let ids = parse_cpulist(&text).expect("a valid list");
    let took = started.elapsed();
    assert_eq!(ids.len(), MAX_ID);
    assert!(ids.iter().eq(0..MAX_ID));
    // Expanded item by item, this would take minutes; parsed as ranges, a
    // few tenths of a second, under AddressSanitizer too (1.3 s in an
    // unoptimized build while other builds loaded the machine, so the
    // bound is far from both).
    let limit = std::time::Duration::from_secs(20);
    assert!(took < limit, "parsing {} bytes took {took:?}", text.len());
    // The same through a node's cpulist file.
    let fake = FakeSysfs::new("long-list");
    fake.online("0\n").cpus(0, &text);
    let nodes = fake.topology().nodes.expect("readable topology");
    assert_eq!(nodes[0].cpus.len(), MAX_ID);
}
