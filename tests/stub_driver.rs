//! The real CUDA backend against a stub driver, on machines without a GPU.
//!
//! `tests/stub_driver/libcuda.c` fakes the driver calls pinpool and cudarc
//! make (see its header): a current context per thread, primary contexts as
//! fixed pointers, registrations that need a current context, calls that
//! fail on request. The test binary carries the source and builds it once
//! with the C compiler (`$CC`, else `cc`) into cargo's temporary directory;
//! each test runs itself again in a child process with the stub first on
//! `LD_LIBRARY_PATH`, which is where cudarc's run-time loading looks for
//! `libcuda.so` (the dynamic loader reads the variable only at start-up,
//! hence the child). The child checks it talks to the stub before anything
//! else, so a real driver on the machine changes nothing. Without a C
//! compiler the tests fail.

use std::ffi::{c_char, c_int, c_long, c_uint, c_void, CString};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys, CudaContext};
use pinpool::{BackendKind, Error, Pool};

// === running a test on the stub ===

/// The environment variable that tells a child which test it runs.
const CHILD: &str = "PINPOOL_STUB_TEST";

/// The name of the test function it is used in.
macro_rules! test_name {
    () => {{
        fn here() {}
        let path = std::any::type_name_of_val(&here);
        let path = path.strip_suffix("::here").expect("a function path");
        path.rsplit("::").next().expect("a test name")
    }};
}

/// In the test process: runs the calling test again in a child process on
/// the stub, with `env` set, and returns `false` (the caller returns). In
/// the child: returns `true`, and the caller runs the test's body.
macro_rules! on_stub {
    ($($key:literal = $value:expr),* $(,)?) => {
        run_on_stub(test_name!(), &[$(($key, $value)),*])
    };
}

fn run_on_stub(name: &str, env: &[(&str, &str)]) -> bool {
    if std::env::var(CHILD).as_deref() == Ok(name) {
        stub::check_loaded();
        return true;
    }
    let dir = stub_dir();
    let log = dir.join(format!("{name}-{}.log", std::process::id()));
    let out = std::fs::File::create(&log).expect("create the child's log");
    let path = match std::env::var_os("LD_LIBRARY_PATH") {
        Some(old) if !old.is_empty() => {
            let mut path = dir.as_os_str().to_owned();
            path.push(":");
            path.push(old);
            path
        }
        _ => dir.as_os_str().to_owned(),
    };
    let mut command = Command::new(std::env::current_exe().expect("the test binary"));
    command
        // Ignored tests too: the parent runs only those it was asked for.
        .args([
            name,
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "--include-ignored",
        ])
        .env(CHILD, name)
        .env("LD_LIBRARY_PATH", path)
        .env_remove("STUB_CUDA_DEVICES")
        .env_remove("STUB_CUDA_NUMA")
        .env_remove("STUB_CUDA_FAIL")
        .env_remove("PINPOOL_CONF")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("the log, twice"))
        .stderr(out);
    let mut child = command.spawn().expect("start the child test");
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{name}: still running on the stub driver after 120 s:\n{}",
                read(&log)
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let text = read(&log);
    let _ = std::fs::remove_file(&log);
    assert!(
        status.success() && text.contains("test result: ok. 1 passed"),
        "{name} failed on the stub driver ({status}):\n{text}"
    );
    false
}

fn read(path: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

/// The stub's source, carried in the test binary.
const STUB_SOURCE: &str = include_str!("stub_driver/libcuda.c");

/// The directory holding the freshly built stub as `libcuda.so`: cargo's
/// temporary directory for this test, or the system's where that is gone
/// (the binary run elsewhere).
fn stub_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let base = if tmp.is_dir() {
            tmp.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join("pinpool-stub-cuda");
        std::fs::create_dir_all(&dir).expect("create the stub's directory");
        let id = std::process::id();
        let source = dir.join(format!("libcuda.{id}.c"));
        std::fs::write(&source, STUB_SOURCE).expect("write the stub's source");
        let partial = dir.join(format!("libcuda.so.{id}"));
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let output = Command::new(&cc)
            .args([
                "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-o",
            ])
            .arg(&partial)
            .arg(&source)
            .arg("-lpthread")
            .output()
            .unwrap_or_else(|e| {
                panic!("the stub-driver tests need a C compiler: could not run `{cc}`: {e}")
            });
        let _ = std::fs::remove_file(&source);
        assert!(
            output.status.success(),
            "`{cc}` could not build the stub driver:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        // Renamed into place whole: a concurrent run never loads half a file.
        std::fs::rename(&partial, dir.join("libcuda.so")).expect("install the stub");
        dir
    })
}

/// What the stub exports for tests, found with `dlsym`.
mod stub {
    use super::*;

    /// A registration the stub saw.
    #[derive(Debug, Clone, Copy)]
    pub struct Registration {
        pub base: usize,
        pub len: usize,
        pub flags: u32,
        pub ctx: sys::CUcontext,
    }

    fn handle() -> usize {
        static HANDLE: OnceLock<usize> = OnceLock::new();
        *HANDLE.get_or_init(|| {
            // The name cudarc opens first, resolved the same way, so this is
            // the library the driver calls reach.
            let name = CString::new("libcuda.so").unwrap();
            // SAFETY: a NUL-terminated name; loading the stub runs no
            // initializers of its own.
            let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW) };
            assert!(!handle.is_null(), "libcuda.so does not load in the child");
            handle as usize
        })
    }

    fn symbol(name: &str) -> *mut c_void {
        let cname = CString::new(name).unwrap();
        // SAFETY: a live handle and a NUL-terminated name.
        let sym = unsafe { libc::dlsym(handle() as *mut c_void, cname.as_ptr()) };
        assert!(
            !sym.is_null(),
            "{name} is missing: libcuda.so is not the stub driver"
        );
        sym
    }

    /// Makes sure the driver cudarc will load is the stub.
    pub fn check_loaded() {
        symbol("stub_calls");
    }

    macro_rules! import {
        ($name:literal: fn($($arg:ty),*) -> $ret:ty) => {{
            // SAFETY: the stub defines the symbol with this C signature.
            unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(symbol($name)) }
        }};
    }

    /// Calls made to the driver function `name`, failed ones included.
    pub fn calls(name: &str) -> i64 {
        let f = import!("stub_calls": fn(*const c_char) -> c_long);
        let cname = CString::new(name).unwrap();
        // SAFETY: a NUL-terminated name.
        let n = unsafe { f(cname.as_ptr()) };
        assert!(n >= 0, "the stub does not know {name}");
        n as i64
    }

    /// Fails the `nth` call of `name` from now on (0: every call) about
    /// `device` (`None`: any) with `code`.
    pub fn fail(name: &str, nth: i64, device: Option<i32>, code: i32) {
        let f = import!("stub_fail": fn(*const c_char, c_long, c_int, c_int) -> c_int);
        let cname = CString::new(name).unwrap();
        // SAFETY: a NUL-terminated name and plain values.
        let rc = unsafe { f(cname.as_ptr(), nth as c_long, device.unwrap_or(-1), code) };
        assert_eq!(rc, 0, "the stub does not know {name}");
    }

    /// Lifts every failure.
    pub fn heal() {
        let f = import!("stub_heal": fn() -> ());
        // SAFETY: no arguments.
        unsafe { f() }
    }

    /// References held on `device`'s primary context.
    pub fn primary_refs(device: i32) -> i64 {
        let f = import!("stub_primary_refs": fn(c_int) -> c_long);
        // SAFETY: a plain value.
        unsafe { f(device) as i64 }
    }

    /// `device`'s primary context, retained or not.
    pub fn primary(device: i32) -> sys::CUcontext {
        let f = import!("stub_primary": fn(c_int) -> sys::CUcontext);
        // SAFETY: a plain value.
        unsafe { f(device) }
    }

    /// A context of the application's own, always valid.
    pub fn user_context() -> sys::CUcontext {
        let f = import!("stub_user_context": fn() -> sys::CUcontext);
        // SAFETY: no arguments.
        unsafe { f() }
    }

    /// Live registrations.
    pub fn registered() -> i64 {
        let f = import!("stub_registered": fn() -> c_long);
        // SAFETY: no arguments.
        unsafe { f() as i64 }
    }

    /// Every successful registration so far, in order.
    pub fn registrations() -> Vec<Registration> {
        let f = import!("stub_registration": fn(c_long, *mut *mut c_void, *mut usize, *mut c_uint, *mut sys::CUcontext) -> c_int);
        let mut all = Vec::new();
        loop {
            let (mut base, mut len, mut flags) = (std::ptr::null_mut(), 0, 0);
            let mut ctx = std::ptr::null_mut();
            // SAFETY: valid out-pointers.
            if unsafe {
                f(
                    all.len() as c_long,
                    &mut base,
                    &mut len,
                    &mut flags,
                    &mut ctx,
                )
            } == 0
            {
                return all;
            }
            all.push(Registration {
                base: base as usize,
                len,
                flags,
                ctx,
            });
        }
    }

    /// Events created and not destroyed.
    pub fn events_live() -> i64 {
        let f = import!("stub_events_live": fn() -> c_long);
        // SAFETY: no arguments.
        unsafe { f() as i64 }
    }

    /// Calls that needed a current context (or the event's own) and had
    /// none.
    pub fn wrong_context() -> i64 {
        let f = import!("stub_wrong_context": fn() -> c_long);
        // SAFETY: no arguments.
        unsafe { f() as i64 }
    }
}

// === helpers ===

const CUDA_ERROR_OUT_OF_MEMORY: i32 = 2;
const CUDA_ERROR_NO_DEVICE: i32 = 100;
const CUDA_ERROR_NOT_READY: i32 = 600;
const CUDA_ERROR_UNKNOWN: i32 = 999;

/// Initializes the driver, as the pool does when it builds (the stub, like
/// the driver, refuses other calls before).
fn init() {
    result::init().expect("cuInit on the stub");
}

/// The calling thread's current context (null if none).
fn current() -> sys::CUcontext {
    result::ctx::get_current()
        .expect("cuCtxGetCurrent")
        .unwrap_or(std::ptr::null_mut())
}

/// Makes `ctx` current on the calling thread.
fn set_current(ctx: sys::CUcontext) {
    // SAFETY: the stub's contexts are fixed pointers; it rejects dead ones.
    unsafe { result::ctx::set_current(ctx) }.expect("cuCtxSetCurrent");
}

/// The contexts a thread may have when it calls the pool: none, or one of
/// the application's own.
fn starting_contexts() -> [(&'static str, sys::CUcontext); 2] {
    [
        ("no context", std::ptr::null_mut()),
        ("the application's context", stub::user_context()),
    ]
}

fn cuda_pool(devices: usize) -> Pool {
    Pool::builder()
        .backend(BackendKind::Cuda)
        .devices(devices)
        .cleaner_threads(2)
        .build()
        .expect("the CUDA backend builds on the stub")
}

/// As [`cuda_pool`], with buffers pinned one by one (`regions` off): a
/// miss's own registration, and a take that misses rather than carves.
fn cuda_pool_one_by_one(devices: usize) -> Pool {
    Pool::builder()
        .backend(BackendKind::Cuda)
        .devices(devices)
        .cleaner_threads(2)
        .regions(false)
        .build()
        .expect("the CUDA backend builds on the stub")
}

/// A pinned buffer of `size` bytes: a miss, dropped, flushed (registered by
/// the cleaner), taken again.
fn pinned(pool: &Pool, size: usize) -> pinpool::PinnedBuffer {
    drop(pool.take(size));
    pool.flush();
    let buf = pool.take(size);
    assert!(
        buf.is_pinned(),
        "a second take of {size} bytes is a pinned hit"
    );
    buf
}

/// Waits up to 10 s for `done`.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The driver error of a failed build.
fn driver_error(result: Result<Pool, Error>) -> (&'static str, sys::CUresult) {
    match result {
        Err(Error::Cuda { op, source }) => (op, source.0),
        Err(other) => panic!("expected a driver error, got {other}"),
        Ok(pool) => panic!("expected a driver error, got a pool on {}", pool.backend()),
    }
}

// === the tests ===

#[test]
fn dropping_the_last_handle_restores_the_context() {
    if !on_stub!("STUB_CUDA_DEVICES" = "2") {
        return;
    }
    init();
    for (what, start) in starting_contexts() {
        set_current(start);
        let pool = cuda_pool(2);
        drop(pinned(&pool, 4096));
        pool.flush();
        assert_eq!(current(), start, "with {what}: using the pool changed it");
        // No buffer is out: the pool's state goes with this handle.
        drop(pool);
        assert_eq!(
            current(),
            start,
            "with {what}: dropping the pool changed the current context"
        );
        assert_eq!(
            (stub::primary_refs(0), stub::primary_refs(1)),
            (0, 0),
            "with {what}: the pool's contexts are released"
        );
        assert_eq!(
            stub::registered(),
            0,
            "with {what}: everything unregistered"
        );
    }
    // A buffer still out when the pool closes: the reaper lets the state go.
    set_current(std::ptr::null_mut());
    let pool = cuda_pool(2);
    let buf = pinned(&pool, 4096);
    drop(pool);
    assert_eq!(current(), std::ptr::null_mut());
    drop(buf);
    eventually("the closed pool's contexts are released", || {
        stub::primary_refs(0) == 0 && stub::primary_refs(1) == 0
    });
    assert_eq!(current(), std::ptr::null_mut());
    assert_eq!(stub::registered(), 0);
    assert_eq!(stub::wrong_context(), 0);
}

#[test]
fn a_failed_build_restores_the_context() {
    if !on_stub!("STUB_CUDA_DEVICES" = "65") {
        return;
    }
    init();
    for (what, start) in starting_contexts() {
        set_current(start);
        for backend in [BackendKind::Cuda, BackendKind::Auto] {
            match Pool::builder().backend(backend).build() {
                Err(Error::InvalidConfig(why)) => assert!(why.contains("64"), "{why}"),
                other => panic!("{backend} with 65 devices: {other:?}"),
            }
            assert_eq!(
                current(),
                start,
                "with {what}: a failed {backend} build changed the current context"
            );
            assert!(
                (0..65).all(|device| stub::primary_refs(device) == 0),
                "with {what}: a failed {backend} build keeps contexts retained"
            );
        }
    }
    // A device whose context cannot be retained fails the build part-way.
    stub::fail(
        "cuDevicePrimaryCtxRetain",
        0,
        Some(1),
        CUDA_ERROR_OUT_OF_MEMORY,
    );
    for (what, start) in starting_contexts() {
        set_current(start);
        let failed = Pool::builder()
            .backend(BackendKind::Cuda)
            .devices(2)
            .build();
        assert_eq!(
            driver_error(failed),
            (
                "cuDevicePrimaryCtxRetain",
                sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
            )
        );
        assert_eq!(current(), start, "with {what}");
        assert_eq!(
            (stub::primary_refs(0), stub::primary_refs(1)),
            (0, 0),
            "with {what}: device 0's context is released again"
        );
    }
}

#[test]
fn auto_is_an_error_when_a_device_fails() {
    if !on_stub!(
        "STUB_CUDA_DEVICES" = "2",
        "STUB_CUDA_FAIL" = "cuDevicePrimaryCtxRetain#1=46",
    ) {
        return;
    }
    // Device 1 is busy (exclusive mode, another process): a pool on the
    // host backend would run unpinned; the caller must hear of it.
    let failed = Pool::builder().backend(BackendKind::Auto).build();
    assert_eq!(
        driver_error(failed),
        (
            "cuDevicePrimaryCtxRetain",
            sys::CUresult::CUDA_ERROR_DEVICE_UNAVAILABLE
        )
    );
    assert_eq!(current(), std::ptr::null_mut());
    assert_eq!((stub::primary_refs(0), stub::primary_refs(1)), (0, 0));
    // Serving only the device that works is fine.
    let pool = Pool::builder()
        .backend(BackendKind::Auto)
        .devices(1)
        .build()
        .expect("device 0 alone");
    assert_eq!(pool.backend(), BackendKind::Cuda);
    drop(pool);
    assert_eq!(stub::primary_refs(0), 0);
}

#[test]
fn auto_falls_back_when_the_driver_fails_to_initialize() {
    if !on_stub!("STUB_CUDA_DEVICES" = "1") {
        return;
    }
    for code in [CUDA_ERROR_NO_DEVICE, CUDA_ERROR_UNKNOWN] {
        stub::fail("cuInit", 0, None, code);
        let pool = Pool::builder().backend(BackendKind::Auto).build().unwrap();
        assert_eq!(
            pool.backend(),
            BackendKind::Host,
            "cuInit failing with {code}"
        );
        let failed = Pool::builder().backend(BackendKind::Cuda).build();
        assert_eq!(driver_error(failed).0, "cuInit");
        stub::heal();
    }
    let pool = Pool::builder().backend(BackendKind::Auto).build().unwrap();
    assert_eq!(pool.backend(), BackendKind::Cuda);
}

#[test]
fn auto_falls_back_without_a_device() {
    if !on_stub!("STUB_CUDA_DEVICES" = "0") {
        return;
    }
    let pool = Pool::builder().backend(BackendKind::Auto).build().unwrap();
    assert_eq!(pool.backend(), BackendKind::Host);
    match Pool::builder().backend(BackendKind::Cuda).build() {
        Err(Error::BackendUnavailable(why)) => assert!(why.contains("no device"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(stub::calls("cuDevicePrimaryCtxRetain"), 0);
}

#[test]
fn context_creation_errors_name_the_failing_call() {
    if !on_stub!("STUB_CUDA_DEVICES" = "1") {
        return;
    }
    init();
    for call in [
        "cuDeviceGet",
        "cuDevicePrimaryCtxRetain",
        "cuDeviceGetAttribute",
        "cuCtxSetCurrent",
        "cuCtxGetCurrent",
    ] {
        stub::fail(call, 1, None, CUDA_ERROR_OUT_OF_MEMORY);
        let failed = Pool::builder().backend(BackendKind::Cuda).build();
        assert_eq!(
            driver_error(failed),
            (call, sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY),
            "{call} failing"
        );
        stub::heal();
        assert_eq!(current(), std::ptr::null_mut(), "{call} failing");
        assert_eq!(stub::primary_refs(0), 0, "{call} failing");
    }
}

#[test]
fn every_public_call_restores_the_context() {
    if !on_stub!("STUB_CUDA_DEVICES" = "2") {
        return;
    }
    init();
    // A stream of device 0's primary context, made through cudarc (which
    // binds the context: the starting one is set after).
    let ctx = CudaContext::new(0).expect("device 0");
    let stream = ctx.new_stream().expect("a stream");
    for (what, start) in starting_contexts() {
        set_current(start);
        let check = |call: &str| {
            assert_eq!(
                current(),
                start,
                "with {what}: {call} changed the current context"
            );
        };
        let pool = cuda_pool(2);
        check("build");
        let miss = pool.take(4096);
        check("a missing take");
        drop(miss);
        pool.flush();
        check("flush");
        let mut hit = pool.take(4096);
        assert!(hit.is_pinned());
        check("a hit");
        // SAFETY: the legacy stream of device 0's primary context, which
        // the stub accepts; nothing reads the buffer.
        unsafe { hit.record_last_use_raw(std::ptr::null_mut()) }.expect("recorded");
        check("record_last_use_raw");
        hit.record_last_use(&stream).expect("recorded");
        check("record_last_use");
        drop(hit);
        check("dropping a buffer with events");
        let other = pool.take_on(1, 1 << 20).expect("device 1");
        check("take_on");
        drop(other);
        pool.reserve(1, &[(8192, 2), (1000, 3)]).expect("reserved");
        check("reserve");
        pool.flush();
        check("flush");
        let stats = pool.stats();
        // A region on each device; the reserve carves from device 1's (a
        // slab's page included).
        assert!(stats.registrations >= 2, "{stats:?}");
        check("stats");
        pool.trim();
        check("trim");
        pool.set_max_pooled_bytes(8192);
        check("set_max_pooled_bytes");
        pool.clear();
        check("clear");
        let mut region = vec![1u8; 1 << 16];
        // SAFETY: `region` stays alive and unmoved until unregistered.
        assert!(unsafe { pool.register_region(region.as_mut_ptr(), region.len()) });
        check("register_region");
        // SAFETY: registered above; no copy reads it.
        unsafe { pool.unregister_region(region.as_mut_ptr()) };
        check("unregister_region");
        drop(pool.take(4096));
        pool.shutdown();
        check("shutdown");
        let late = pinned(&pool, 4096);
        let clone = pool.clone();
        drop(pool);
        check("dropping a handle");
        drop(clone);
        check("dropping the last handle");
        drop(late);
        check("dropping a buffer of a closed pool");
        assert_eq!(stub::wrong_context(), 0, "with {what}");
    }
    drop(stream);
    drop(ctx);
    set_current(std::ptr::null_mut());
    eventually("every registration is undone", || stub::registered() == 0);
}

#[test]
fn registrations_are_portable_one_call_each_and_undone() {
    if !on_stub!("STUB_CUDA_DEVICES" = "1") {
        return;
    }
    let pool = cuda_pool(1);
    let sizes = [1000, 4096, 1 << 20, 9 << 20];
    let bufs: Vec<_> = sizes.iter().map(|&size| pinned(&pool, size)).collect();
    let registrations = stub::registrations();
    let stats = pool.stats();
    assert_eq!(registrations.len() as u64, stats.registrations);
    assert_eq!(
        stub::calls("cuMemHostRegister_v2") as u64,
        stats.registrations
    );
    for reg in &registrations {
        assert_eq!(reg.flags, sys::CU_MEMHOSTREGISTER_PORTABLE, "{reg:?}");
        assert_eq!(
            reg.ctx,
            stub::primary(0),
            "registered in device 0's context"
        );
    }
    for buf in &bufs {
        let (start, end) = (buf.as_ptr() as usize, buf.as_ptr() as usize + buf.len());
        let inside = registrations
            .iter()
            .filter(|r| r.base <= start && end <= r.base + r.len)
            .count();
        assert_eq!(
            inside,
            1,
            "a buffer of {} bytes lies in one registration",
            buf.len()
        );
        let mut flags = 0;
        // SAFETY: a valid out-pointer; the buffer is live.
        unsafe { sys::cuMemHostGetFlags(&mut flags, buf.as_ptr() as *mut c_void) }
            .result()
            .expect("the driver knows a pooled buffer");
    }
    drop(bufs);
    pool.flush();
    pool.clear();
    assert_eq!(stub::registered(), 0, "clear unregisters every buffer");
    assert_eq!(
        stub::calls("cuMemHostUnregister") as u64,
        stats.registrations,
        "one unregistration per registration"
    );
    assert_eq!(stub::wrong_context(), 0);
}

/// As `driver_failures_are_counted_and_lose_nothing`, with the defaults
/// (regions): a region's registration that fails is counted and retried
/// smaller, nothing left registered for it; a region's unregistration
/// that fails leaks the region, still registered.
#[test]
fn region_failures_are_counted_and_lose_nothing() {
    if !on_stub!("STUB_CUDA_DEVICES" = "1") {
        return;
    }
    let pool = cuda_pool(1);
    assert!(pool.config().regions);
    stub::fail("cuMemHostRegister_v2", 1, None, CUDA_ERROR_OUT_OF_MEMORY);
    drop(pool.take(1 << 20));
    pool.flush();
    let stats = pool.stats();
    assert_eq!(stats.registration_failures, 1, "{stats:?}");
    assert_eq!(stub::registered(), stats.regions as i64, "{stats:?}");
    // The next demand is met by a region, whatever the failure left.
    drop(pool.take(1 << 20));
    pool.flush();
    let buf = pool.take(1 << 20);
    assert!(buf.is_pinned(), "{:?}", pool.stats());
    drop(buf);
    pool.flush();
    let stats = pool.stats();
    assert!(stats.regions >= 1, "{stats:?}");
    let listed = stats.regions as i64;
    stub::fail("cuMemHostUnregister", 1, None, CUDA_ERROR_UNKNOWN);
    pool.clear();
    let stats = pool.stats();
    assert_eq!(stats.unregister_failures, 1, "{stats:?}");
    assert!(stats.leaked_bytes >= 1 << 20, "{stats:?}");
    assert_eq!(stats.regions, 0, "{stats:?}");
    assert_eq!(
        stub::registered(),
        1,
        "the leaked region stays registered ({listed} listed)"
    );
    stub::heal();
    pool.shutdown();
    assert_eq!(stub::wrong_context(), 0);
}

#[test]
fn driver_failures_are_counted_and_lose_nothing() {
    if !on_stub!("STUB_CUDA_DEVICES" = "1") {
        return;
    }
    let pool = cuda_pool_one_by_one(1);
    // A registration fails: the buffer is freed, not pooled pageable.
    stub::fail("cuMemHostRegister_v2", 1, None, CUDA_ERROR_OUT_OF_MEMORY);
    drop(pool.take(1 << 20));
    pool.flush();
    let stats = pool.stats();
    assert_eq!(
        (stats.registration_failures, stats.pooled_buffers),
        (1, 0),
        "{stats:?}"
    );
    assert_eq!(stub::registered(), 0);
    // An unregistration fails: the buffer is leaked, still registered.
    let buf = pinned(&pool, 1 << 20);
    drop(buf);
    pool.flush();
    stub::fail("cuMemHostUnregister", 1, None, CUDA_ERROR_UNKNOWN);
    pool.clear();
    let stats = pool.stats();
    assert_eq!(stats.unregister_failures, 1, "{stats:?}");
    assert!(stats.leaked_bytes >= 1 << 20, "{stats:?}");
    assert_eq!(stub::registered(), 1, "leaked memory stays registered");
    // A device synchronize fails (a pinned buffer dropped without events):
    // the buffer is leaked.
    let buf = pinned(&pool, 4096);
    let leaked = pool.stats().leaked_bytes;
    stub::fail("cuCtxSynchronize", 0, None, CUDA_ERROR_UNKNOWN);
    drop(buf);
    pool.flush();
    stub::heal();
    let stats = pool.stats();
    assert!(stats.leaked_bytes > leaked, "{stats:?}");
    // A failed event query: the buffer is leaked too.
    let mut buf = pinned(&pool, 4096);
    // SAFETY: device 0's legacy stream; the stub accepts it.
    unsafe { buf.record_last_use_raw(std::ptr::null_mut()) }.unwrap();
    let leaked = pool.stats().leaked_bytes;
    stub::fail("cuEventQuery", 0, None, CUDA_ERROR_UNKNOWN);
    drop(buf);
    pool.flush();
    stub::heal();
    let stats = pool.stats();
    assert!(
        stats.leaked_bytes > leaked && stats.fence_failures >= 1,
        "{stats:?}"
    );
    // Recording fails: the error reaches the caller, the buffer is fine.
    let mut buf = pinned(&pool, 4096);
    stub::fail("cuEventRecord", 1, None, CUDA_ERROR_UNKNOWN);
    // SAFETY: as above.
    match unsafe { buf.record_last_use_raw(std::ptr::null_mut()) } {
        Err(Error::Cuda { op, .. }) => assert_eq!(op, "cuEventRecord"),
        other => panic!("{other:?}"),
    }
    drop(buf);
    pool.flush();
    assert_eq!(current(), std::ptr::null_mut());
}

#[test]
fn buffers_wait_for_their_events() {
    if !on_stub!("STUB_CUDA_DEVICES" = "1") {
        return;
    }
    let pool = cuda_pool_one_by_one(1);
    let mut buf = pinned(&pool, 1 << 20);
    let address = buf.as_ptr() as usize;
    buf[..4].copy_from_slice(&[1, 2, 3, 4]);
    let records = stub::calls("cuEventRecord");
    // SAFETY: device 0's legacy stream; the stub accepts it.
    unsafe { buf.record_last_use_raw(std::ptr::null_mut()) }.unwrap();
    assert_eq!(stub::calls("cuEventRecord"), records + 1);
    // The "copy" has not finished: the buffer is not reused.
    stub::fail("cuEventQuery", 0, None, CUDA_ERROR_NOT_READY);
    let syncs = stub::calls("cuCtxSynchronize");
    drop(buf);
    let (tx, rx) = std::sync::mpsc::channel();
    let flusher = {
        let pool = pool.clone();
        std::thread::spawn(move || {
            pool.flush();
            tx.send(()).unwrap();
        })
    };
    assert!(
        rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "flush returned while the buffer's copy runs"
    );
    let again = pool.take(1 << 20);
    assert_ne!(
        again.as_ptr() as usize,
        address,
        "reused under a running copy"
    );
    drop(again);
    stub::heal();
    rx.recv_timeout(Duration::from_secs(10))
        .expect("flush returns once the copy is done");
    flusher.join().unwrap();
    assert_eq!(
        stub::calls("cuCtxSynchronize"),
        syncs,
        "a buffer with an event needs no device synchronize"
    );
    // Without events, a device synchronize covers it.
    let buf = pinned(&pool, 4096);
    let syncs = stub::calls("cuCtxSynchronize");
    drop(buf);
    pool.flush();
    assert!(stub::calls("cuCtxSynchronize") > syncs);
    // Events are reused: none is created or destroyed in the steady state.
    let round = || {
        let mut buf = pool.take(1 << 20);
        // SAFETY: as above.
        unsafe { buf.record_last_use_raw(std::ptr::null_mut()) }.unwrap();
        drop(buf);
        pool.flush();
    };
    (0..4).for_each(|_| round());
    let (live, created) = (stub::events_live(), stub::calls("cuEventCreate"));
    (0..10).for_each(|_| round());
    assert_eq!(
        (stub::events_live(), stub::calls("cuEventCreate")),
        (live, created)
    );
    assert_eq!(stub::wrong_context(), 0);
}

#[test]
fn copies_through_cudarc_record_events_in_the_streams_context() {
    if !on_stub!("STUB_CUDA_DEVICES" = "1") {
        return;
    }
    let pool = cuda_pool(1);
    let ctx = CudaContext::new(0).expect("device 0");
    let stream = ctx.new_stream().expect("a stream");
    let mut dst = stream.alloc_zeros::<u8>(4096).expect("device memory");
    let mut buf = pinned(&pool, 4096);
    buf.fill(7);
    let records = stub::calls("cuEventRecord");
    stream
        .memcpy_htod(&buf, &mut dst)
        .expect("a copy from the buffer");
    assert!(stub::calls("cuEventRecord") > records, "the copy is fenced");
    let back = stream.clone_dtoh(&dst).expect("a copy back");
    assert!(back.iter().all(|&b| b == 7));
    // Into the buffer: host reads wait for it.
    let zeros = stream.alloc_zeros::<u8>(4096).expect("device memory");
    stream
        .memcpy_dtoh(&zeros, &mut buf)
        .expect("a copy into the buffer");
    assert!(buf.iter().all(|&b| b == 0));
    drop(buf);
    pool.flush();
    let again = pool.take(4096);
    assert!(again.is_pinned() && again.iter().all(|&b| b == 0));
    drop(again);
    assert_eq!(stub::wrong_context(), 0);
    drop((dst, zeros, stream, ctx));
}

#[test]
fn takes_go_to_the_device_of_the_current_context() {
    if !on_stub!("STUB_CUDA_DEVICES" = "2") {
        return;
    }
    let pool = cuda_pool(2);
    assert_eq!(pool.take(4096).device(), 0, "no context: device 0");
    let ctx = CudaContext::new(1).expect("device 1"); // binds it
    assert_eq!(current(), stub::primary(1));
    assert_eq!(pool.take(4096).device(), 1);
    assert_eq!(current(), stub::primary(1));
    set_current(stub::user_context());
    assert_eq!(pool.take(4096).device(), 0, "another context of device 0");
    drop(ctx);
}

#[test]
fn closing_synchronizes_on_the_callers_thread_and_keeps_its_context() {
    if !on_stub!("STUB_CUDA_DEVICES" = "2") {
        return;
    }
    init();
    for (what, start) in starting_contexts() {
        set_current(start);
        let pool = cuda_pool(2);
        // Pinned buffers of both devices, without events: the cleaner
        // synchronizes their devices before releasing them.
        let bufs = [pinned(&pool, 4096), {
            drop(pool.take_on(1, 4096).unwrap());
            pool.flush();
            pool.take_on(1, 4096).unwrap()
        }];
        assert!(bufs.iter().all(|b| b.is_pinned()));
        pool.shutdown();
        // Dropped on another thread after the workers stopped: closing
        // the pool finds them queued and finishes them here.
        std::thread::spawn(move || drop(bufs)).join().unwrap();
        let syncs = stub::calls("cuCtxSynchronize");
        drop(pool);
        assert!(
            stub::calls("cuCtxSynchronize") > syncs,
            "with {what}: closing ran no synchronize here"
        );
        assert_eq!(
            current(),
            start,
            "with {what}: closing the pool changed the current context"
        );
        eventually("the closed pool's contexts are released", || {
            stub::primary_refs(0) == 0 && stub::primary_refs(1) == 0
        });
    }
    assert_eq!(stub::wrong_context(), 0);
}

#[test]
fn regions_register_whatever_device_is_current() {
    if !on_stub!("STUB_CUDA_DEVICES" = "2") {
        return;
    }
    // The pool serves device 0 only; the application works on device 1.
    let pool = cuda_pool(1);
    let ctx = CudaContext::new(1).expect("device 1"); // binds it
    let mut region = vec![1u8; 1 << 16];
    // SAFETY: `region` stays alive and unmoved until unregistered.
    let registered = unsafe { pool.register_region(region.as_mut_ptr(), region.len()) };
    assert!(
        registered,
        "a portable registration failed because the current device is not served"
    );
    assert_eq!(
        current(),
        stub::primary(1),
        "register_region kept the context"
    );
    assert_eq!(stub::registered(), 1);
    // SAFETY: registered above; no copy reads it.
    unsafe { pool.unregister_region(region.as_mut_ptr()) };
    assert_eq!(
        stub::registered(),
        0,
        "the region is still registered when its memory goes back"
    );
    drop(region);
    drop(ctx);
}

#[test]
fn a_failed_region_unregistration_is_counted() {
    if !on_stub!("STUB_CUDA_DEVICES" = "1") {
        return;
    }
    let pool = cuda_pool(1);
    let mut region = vec![1u8; 1 << 16];
    // SAFETY: `region` stays alive and unmoved until unregistered.
    assert!(unsafe { pool.register_region(region.as_mut_ptr(), region.len()) });
    stub::fail("cuMemHostUnregister", 1, None, CUDA_ERROR_UNKNOWN);
    // SAFETY: registered above; no copy reads it.
    unsafe { pool.unregister_region(region.as_mut_ptr()) };
    let stats = pool.stats();
    assert_eq!(
        stats.unregister_failures, 1,
        "a failed unregister_region went uncounted: {stats:?}"
    );
    // The region is still registered: the caller must not free it yet.
    assert_eq!(stub::registered(), 1);
    // SAFETY: as above; this time the driver succeeds.
    unsafe { pool.unregister_region(region.as_mut_ptr()) };
    assert_eq!(stub::registered(), 0);
    drop(region);
}

#[test]
fn regions_unregister_under_another_current_device() {
    if !on_stub!("STUB_CUDA_DEVICES" = "2") {
        return;
    }
    let pool = cuda_pool(1);
    let mut region = vec![1u8; 1 << 16];
    // No context current: device 0.
    // SAFETY: `region` stays alive and unmoved until unregistered.
    assert!(unsafe { pool.register_region(region.as_mut_ptr(), region.len()) });
    assert_eq!(stub::registered(), 1);
    // Another thread, working on device 1, gives the region back.
    let address = region.as_mut_ptr() as usize;
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let ctx = CudaContext::new(1).expect("device 1");
            // SAFETY: registered above; no copy reads it.
            unsafe { pool.unregister_region(address as *mut u8) };
            assert_eq!(current(), ctx.cu_ctx());
        });
    });
    assert_eq!(
        stub::registered(),
        0,
        "unregister_region failed silently: the region stays registered"
    );
    drop(region);
}

#[test]
fn a_dropped_pool_and_its_users_leave_no_context_retained() {
    if !on_stub!("STUB_CUDA_DEVICES" = "1") {
        return;
    }
    let pool = cuda_pool(1);
    let ctx = CudaContext::new(0).expect("device 0");
    let stream = ctx.new_stream().expect("a stream");
    let mut buf = pinned(&pool, 4096);
    buf.record_last_use(&stream).expect("recorded");
    // SAFETY: device 0's legacy stream; the stub accepts it.
    unsafe { buf.record_last_use_raw(std::ptr::null_mut()) }.expect("recorded");
    drop(buf);
    pool.flush();
    drop(pool);
    drop(stream);
    drop(ctx);
    set_current(std::ptr::null_mut());
    eventually("device 0's primary context is released", || {
        stub::primary_refs(0) == 0
    });
}

#[test]
fn a_released_context_current_on_the_thread_is_put_back() {
    if !on_stub!("STUB_CUDA_DEVICES" = "2") {
        return;
    }
    init();
    // The application made device 1's primary context current through
    // cudarc and let it go: the thread's current context is a released
    // one, which the driver keeps current (and lets be made current again).
    drop(CudaContext::new(1).expect("device 1"));
    let released = stub::primary(1);
    assert_eq!((current(), stub::primary_refs(1)), (released, 0));
    let check = |call: &str| {
        assert_eq!(current(), released, "{call} changed the current context");
    };
    let pool = cuda_pool(1);
    check("build");
    let buf = pinned(&pool, 4096);
    assert_eq!(buf.device(), 0, "a released context's device is unknown: 0");
    check("take");
    drop(buf);
    let mut region = vec![1u8; 1 << 16];
    // SAFETY: `region` stays alive and unmoved until unregistered.
    assert!(unsafe { pool.register_region(region.as_mut_ptr(), region.len()) });
    check("register_region");
    // SAFETY: registered above; no copy reads it.
    unsafe { pool.unregister_region(region.as_mut_ptr()) };
    check("unregister_region");
    pool.clear();
    check("clear");
    pool.shutdown();
    check("shutdown");
    drop(pool);
    check("dropping the pool");
    assert_eq!(stub::registered(), 0);
    assert_eq!(stub::primary_refs(0), 0);
}

#[test]
fn a_pool_dropped_in_thread_teardown_releases_everything() {
    if !on_stub!("STUB_CUDA_DEVICES" = "2") {
        return;
    }
    use std::cell::RefCell;
    thread_local! {
        static HELD: RefCell<Vec<Box<dyn std::any::Any>>> = const { RefCell::new(Vec::new()) };
    }
    let pool = cuda_pool(2);
    drop(pinned(&pool, 4096));
    pool.flush();
    let buf = pinned(&pool, 1 << 20);
    // A thread that never used CUDA holds the last handle and a buffer
    // until its thread-locals are destroyed.
    std::thread::spawn(move || {
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            held.push(Box::new(pool));
            held.push(Box::new(buf));
        });
    })
    .join()
    .expect("the thread tears down cleanly");
    eventually("the pool's contexts are released", || {
        stub::primary_refs(0) == 0 && stub::primary_refs(1) == 0
    });
    assert_eq!(stub::registered(), 0, "everything unregistered");
    assert_eq!(stub::wrong_context(), 0);
}

/// `record_last_use` and `record_last_use_raw` borrow the context they
/// record in (the stream's, the backend's): on a buffer that outlived its
/// pool's last handle (after `shutdown` too) and was sent to another
/// thread, both record in the right context, and the pool's state, the
/// context it holds included, goes with the buffer's drop on a third
/// thread.
#[test]
fn records_on_a_buffer_that_outlives_its_pool() {
    if !on_stub!("STUB_CUDA_DEVICES" = "1") {
        return;
    }
    init();
    let ctx = CudaContext::new(0).expect("device 0");
    let stream = ctx.new_stream().expect("a stream");
    set_current(std::ptr::null_mut());
    for shutdown in [false, true] {
        let pool = cuda_pool_one_by_one(1);
        let mut buf = pinned(&pool, 1 << 20);
        if shutdown {
            pool.shutdown();
        }
        let records = stub::calls("cuEventRecord");
        drop(pool);
        let stream = stream.clone();
        let buf = std::thread::spawn(move || {
            for _ in 0..3 {
                // SAFETY: device 0's legacy stream; the stub accepts it.
                unsafe { buf.record_last_use_raw(std::ptr::null_mut()) }.expect("raw");
                buf.record_last_use(&stream).expect("stream");
            }
            buf
        })
        .join()
        .unwrap();
        assert_eq!(stub::calls("cuEventRecord"), records + 6);
        // Dropped on yet another thread.
        std::thread::spawn(move || drop(buf)).join().unwrap();
        eventually("the closed pool's state goes", || {
            stub::primary_refs(0) == 1
        });
        assert_eq!(stub::wrong_context(), 0);
        assert_eq!(current(), std::ptr::null_mut());
    }
    drop(stream);
    drop(ctx);
    eventually("every registration is undone", || stub::registered() == 0);
}
