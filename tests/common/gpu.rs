//! Helpers for the tests that run on GPUs.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cudarc::driver::{result, sys, CudaContext, CudaStream};
use pinpool::{BackendKind, PinnedBuffer, Pool};

/// Device 0's context, bound to this thread, for one test at a time.
///
/// The tests share the process's primary context. A test that holds a
/// stream behind a [`Gate`] and then calls the driver before opening it
/// deadlocks with any other test's context-wide synchronize (`cuCtxSynchronize`,
/// which cudarc's `new_stream` and a pool's device-wide fence call): the
/// synchronize holds a driver lock while it waits for the gated stream, and
/// the gating test's driver call waits for that lock. So the tests of one
/// process take turns, whatever `--test-threads` says.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    _alone: MutexGuard<'static, ()>,
}

impl std::ops::Deref for Gpu {
    type Target = Arc<CudaContext>;

    fn deref(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

/// Device 0's context for this test alone (see [`Gpu`]); panics without a
/// GPU.
pub fn gpu() -> Gpu {
    static ALONE: Mutex<()> = Mutex::new(());
    // A test that panicked while holding it leaves nothing to repair.
    let alone = ALONE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // SAFETY: only tries to load the driver library.
    let present = unsafe { sys::is_culib_present() };
    assert!(
        present,
        "GPU test asked to run, but libcuda cannot be loaded"
    );
    let ctx = CudaContext::new(0).expect("GPU test asked to run, but no CUDA device is usable");
    Gpu { ctx, _alone: alone }
}

/// A pool on the CUDA backend, four workers, buffers pinned one by one
/// (`regions` off): the tests through it count each buffer's registration.
pub fn cuda_pool() -> Pool {
    Pool::builder()
        .backend(BackendKind::Cuda)
        .regions(false)
        .cleaner_threads(4)
        .build()
        .expect("the CUDA backend builds on a GPU machine")
}

/// A pinned buffer of `size` bytes from `pool`: a miss, dropped, flushed
/// (registered by the cleaner), and taken again.
pub fn pinned(pool: &Pool, size: usize) -> PinnedBuffer {
    drop(pool.take(size));
    pool.flush();
    let buf = pool.take(size);
    assert!(
        buf.is_pinned(),
        "second take of {size} bytes should be a pinned hit"
    );
    buf
}

/// Device memory freed on drop.
pub struct DeviceBytes(pub sys::CUdeviceptr, pub usize);

impl DeviceBytes {
    pub fn new(len: usize) -> Self {
        // SAFETY: a context is current (see `gpu`); the result is checked.
        Self(
            unsafe { result::malloc_sync(len) }.expect("cuMemAlloc"),
            len,
        )
    }

    pub fn read(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.1];
        // SAFETY: `self.0` holds `self.1` bytes; `out` is as long.
        unsafe { result::memcpy_dtoh_sync(&mut out, self.0) }.expect("cuMemcpyDtoH");
        out
    }
}

impl Drop for DeviceBytes {
    fn drop(&mut self) {
        // SAFETY: allocated by `malloc_sync`, freed once.
        unsafe { result::free_sync(self.0) }.expect("cuMemFree");
    }
}

/// Enqueues an async H2D copy of `src` into `dst` on `stream`.
pub fn copy_async(stream: &CudaStream, dst: &DeviceBytes, src: &[u8]) {
    assert!(src.len() <= dst.1);
    // SAFETY: `dst` holds at least `src.len()` bytes; the callers keep `src`
    // alive (and unmoved) until the copy is known to have finished.
    unsafe { result::memcpy_htod_async(dst.0, src, stream.cu_stream()) }
        .expect("cuMemcpyHtoDAsync");
}

/// Blocks `stream` until the returned gate is opened.
pub struct Gate(Arc<AtomicBool>);

impl Gate {
    pub fn close(stream: &CudaStream) -> Self {
        unsafe extern "C" fn wait(arg: *mut c_void) {
            // SAFETY: `arg` is the `Arc<AtomicBool>` leaked by `close`; this
            // callback runs once and takes ownership of that reference.
            let open = unsafe { Arc::from_raw(arg as *const AtomicBool) };
            while !open.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let open = Arc::new(AtomicBool::new(false));
        let arg = Arc::into_raw(open.clone()) as *mut c_void;
        // SAFETY: the callback only touches its own `Arc`, and makes no CUDA
        // calls, as host functions must not.
        unsafe { result::stream::launch_host_function(stream.cu_stream(), wait, arg) }
            .expect("cuLaunchHostFunc");
        Self(open)
    }

    pub fn open(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Flushes `pool` on another thread and reports whether that finished
/// within `within`.
pub fn flush_in_background(pool: &Pool) -> std::sync::mpsc::Receiver<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    let pool = pool.clone();
    std::thread::spawn(move || {
        pool.flush();
        let _ = tx.send(());
    });
    rx
}

/// The ids of a kernel list (`0-3,8`), as sysfs and `/proc` write them.
pub fn parse_list(list: &str) -> Vec<usize> {
    let mut ids = Vec::new();
    for item in list.trim().split(',').filter(|item| !item.is_empty()) {
        let (first, last) = item.split_once('-').unwrap_or((item, item));
        ids.extend(first.parse::<usize>().unwrap()..=last.parse::<usize>().unwrap());
    }
    ids
}

/// The CPUs a task may run on, from its `status` file.
fn allowed_in(status: &str) -> Vec<usize> {
    parse_list(
        status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .expect("Cpus_allowed_list"),
    )
}

/// The CPUs the calling thread may run on.
pub fn thread_cpus() -> Vec<usize> {
    allowed_in(&std::fs::read_to_string("/proc/thread-self/status").unwrap())
}

/// The allowed CPUs of every live cleaner worker of the process.
pub fn cleaner_cpus() -> Vec<Vec<usize>> {
    let mut workers = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let path = task.unwrap().path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        // `pinpool-cleaner-N`, cut to the kernel's 15 characters.
        if comm.starts_with("pinpool-clean") {
            let status = std::fs::read_to_string(path.join("status")).unwrap();
            workers.push(allowed_in(&status));
        }
    }
    workers
}

/// Device `ordinal`'s host NUMA node as sysfs gives it (`None` if the
/// firmware does not say).
pub fn device_node(ordinal: usize) -> Option<usize> {
    let device = result::device::get(ordinal as i32).expect("cuDeviceGet");
    let mut id = [0 as std::ffi::c_char; 64];
    // SAFETY: a writable buffer of the length passed; the driver writes a
    // NUL-terminated string into it.
    unsafe { sys::cuDeviceGetPCIBusId(id.as_mut_ptr(), id.len() as i32, device) }
        .result()
        .expect("cuDeviceGetPCIBusId");
    // SAFETY: NUL-terminated by the driver, inside `id`.
    let id = unsafe { std::ffi::CStr::from_ptr(id.as_ptr()) }
        .to_string_lossy()
        .to_lowercase();
    // sysfs spells the domain with four digits where CUDA may use eight.
    let (domain, rest) = id.split_once(':').expect("a PCI bus id");
    let domain = u32::from_str_radix(domain, 16).expect("a hex domain");
    let path = format!("/sys/bus/pci/devices/{domain:04x}:{rest}/numa_node");
    let node: i64 = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim()
        .parse()
        .expect("a node id");
    usize::try_from(node).ok()
}
