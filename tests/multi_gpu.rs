//! The CUDA backend on a machine with two or more GPUs. Every test is
//! `#[ignore]`d: run them on such a machine with `--ignored`. Asked to run
//! with fewer than two GPUs (or none), they fail loudly.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaContext;
use pinpool::{BackendKind, Pool};

mod common;
use common::gpu::*;

/// Devices 0 and 1's contexts; panics with fewer than two GPUs.
fn two_gpus() -> (Gpu, Arc<CudaContext>) {
    let ctx0 = gpu();
    let count = CudaContext::device_count().expect("cuDeviceGetCount");
    assert!(
        count >= 2,
        "multi-GPU test asked to run, but this machine has {count} GPU(s); it needs 2"
    );
    let ctx1 = CudaContext::new(1).expect("device 1's primary context");
    ctx0.bind_to_thread().expect("bind device 0");
    (ctx0, ctx1)
}

fn two_device_pool() -> Pool {
    Pool::builder()
        .backend(BackendKind::Cuda)
        .regions(false)
        .devices(2)
        .cleaner_threads(4)
        .build()
        .expect("the CUDA backend builds on a machine with two GPUs")
}

#[test]
#[ignore = "needs two GPUs"]
fn two_devices_share_portable_buffers_and_keep_their_shards() {
    const SIZE: usize = 4 << 20;
    let (_ctx0, ctx1) = two_gpus();
    let stream1 = ctx1.new_stream().unwrap();
    let pool = two_device_pool();
    drop(pool.take_on(0, SIZE).unwrap());
    drop(pool.take_on(1, SIZE).unwrap());
    pool.flush();
    let mut buf = pool.take_on(0, SIZE).unwrap();
    assert!(buf.is_pinned());
    assert_eq!(buf.device(), 0);
    let ptr = buf.as_ptr() as usize;
    buf.fill(7);
    ctx1.bind_to_thread().unwrap();
    let dst = DeviceBytes::new(SIZE);
    let gate = Gate::close(&stream1);
    copy_async(&stream1, &dst, &buf);
    buf.record_last_use(&stream1).unwrap();
    drop(buf);
    let flushed = flush_in_background(&pool);
    assert!(
        flushed.recv_timeout(Duration::from_millis(300)).is_err(),
        "reused before device 1's copy drained"
    );
    gate.open();
    flushed.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(dst.read().iter().all(|&b| b == 7));
    let back = pool.take_on(0, SIZE).unwrap();
    assert_eq!(
        back.as_ptr() as usize,
        ptr,
        "device 0's buffer returns to device 0's shard"
    );
    let other = pool.take_on(1, SIZE).unwrap();
    assert_ne!(other.as_ptr() as usize, ptr);
    assert_eq!(other.device(), 1);
    drop((back, other));
    pool.shutdown();
}

/// A buffer of device 1, written and copied on a device-1 stream that is
/// held back, is dropped on a thread whose current device is 0 while other
/// threads take and write buffers of both devices. The copy must deliver
/// exactly the bytes written (no reuse, zeroing or foreign write before it
/// ran), and the buffer must come back to device 1's shard.
#[test]
#[ignore = "needs two GPUs"]
fn a_buffer_dropped_under_another_device_waits_for_its_copy_and_goes_home() {
    const SIZE: usize = 4 << 20;
    let (ctx0, ctx1) = two_gpus();
    let pool = two_device_pool();
    drop(pool.take_on(1, SIZE).unwrap());
    pool.flush();
    let mut buf = pool.take_on(1, SIZE).unwrap();
    assert!(buf.is_pinned() && buf.device() == 1);
    let ptr = buf.as_ptr() as usize;
    let pattern: Vec<u8> = (0..SIZE).map(|i| (i * 31 + 7) as u8).collect();
    buf.copy_from_slice(&pattern);

    ctx1.bind_to_thread().unwrap();
    let stream1 = ctx1.new_stream().unwrap();
    let dst = DeviceBytes::new(SIZE);
    let gate = Gate::close(&stream1);
    copy_async(&stream1, &dst, &buf);
    buf.record_last_use(&stream1).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicBool::new(false));
    let churn: Vec<_> = (0..4u8)
        .map(|t| {
            let (pool, stop, opened) = (pool.clone(), stop.clone(), opened.clone());
            let ctx = [&ctx0, &ctx1][usize::from(t % 2)].clone();
            std::thread::spawn(move || {
                ctx.bind_to_thread().unwrap();
                let mut taken = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for device in 0..2 {
                        let mut other = pool.take_on(device, SIZE).unwrap();
                        assert!(other.iter().all(|&b| b == 0), "a taken buffer is zeroed");
                        // Once the gate may be open the copy may be done and
                        // the buffer legitimately reused; not before.
                        let copied = opened.load(Ordering::SeqCst);
                        assert!(
                            copied || other.as_ptr() as usize != ptr,
                            "reused before its copy ran"
                        );
                        other.fill(0xA0 | t);
                        taken += 1;
                    }
                }
                taken
            })
        })
        .collect();
    let dropper = {
        let ctx0 = ctx0.clone();
        std::thread::spawn(move || {
            ctx0.bind_to_thread().unwrap();
            drop(buf);
        })
    };
    dropper.join().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    opened.store(true, Ordering::SeqCst);
    gate.open();
    stream1.synchronize().unwrap();
    stop.store(true, Ordering::Relaxed);
    let taken: u64 = churn.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(taken > 0);
    assert!(
        dst.read() == pattern,
        "device 1 received other bytes than written"
    );

    pool.flush();
    let zeros: Vec<_> = (0..32).map(|_| pool.take_on(0, SIZE).unwrap()).collect();
    assert!(
        zeros.iter().all(|b| b.as_ptr() as usize != ptr),
        "device 1's buffer in device 0's shard"
    );
    let ones: Vec<_> = (0..32).map(|_| pool.take_on(1, SIZE).unwrap()).collect();
    assert!(ones.iter().all(|b| b.device() == 1));
    assert!(
        ones.iter().any(|b| b.as_ptr() as usize == ptr),
        "device 1's buffer came back to device 1's shard"
    );
    drop((zeros, ones));
    pool.shutdown();
}

/// Cleaner workers are pinned to a NUMA node only when every device the
/// pool serves is on it (among the CPUs they may use); with devices on
/// several nodes they run unpinned, since any worker cleans any device's
/// buffers. The test says which case the machine is.
#[test]
#[ignore = "needs two GPUs"]
fn cleaner_workers_are_pinned_only_when_the_devices_share_a_node() {
    let (_ctx0, _ctx1) = two_gpus();
    let count = CudaContext::device_count().unwrap() as usize;
    let nodes: Vec<Option<usize>> = (0..count).map(device_node).collect();
    let online = parse_list(&std::fs::read_to_string("/sys/devices/system/node/online").unwrap());
    println!("devices' NUMA nodes: {nodes:?}; nodes online: {online:?}");
    let allowed = thread_cpus();
    let pool = Pool::builder()
        .backend(BackendKind::Cuda)
        .regions(false)
        .cleaner_threads(4)
        .build()
        .unwrap();
    drop(pool.take(1 << 20)); // the workers run
    pool.flush();
    let workers = cleaner_cpus();
    assert!(!workers.is_empty(), "no cleaner worker found");
    let mut used: Vec<usize> = nodes.iter().flatten().copied().collect();
    used.sort_unstable();
    used.dedup();
    match used[..] {
        [node] if online.len() > 1 => {
            let path = format!("/sys/devices/system/node/node{node}/cpulist");
            let cpus = parse_list(&std::fs::read_to_string(path).unwrap());
            let mut expected: Vec<usize> = allowed
                .iter()
                .copied()
                .filter(|c| cpus.contains(c))
                .collect();
            if expected.is_empty() {
                // None of the node's CPUs may be used: left unpinned.
                expected = allowed.clone();
            }
            println!("every device on node {node}: workers pinned to {expected:?}");
            for worker in &workers {
                assert_eq!(worker, &expected, "a worker not on node {node}'s CPUs");
            }
        }
        _ => {
            println!(
                "devices on {} node(s) of {}: workers unpinned",
                used.len(),
                online.len()
            );
            for worker in &workers {
                assert_eq!(
                    worker, &allowed,
                    "a worker pinned with devices on several nodes"
                );
            }
        }
    }
    drop(pool);
}
