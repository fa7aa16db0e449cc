//! Sets `pinpool_host_numa_attribute` when the CUDA version chosen (a
//! `cuda-XXXXX` feature, forwarded to cudarc) is 12.2 or later, whose
//! bindings have `CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID`. With
//! `cuda-version-from-build-system` the version is not known here, and the
//! attribute is not asked for (sysfs still gives the node).
//!
//! Sets `pinpool_asan` when the crate is built with AddressSanitizer
//! (`-Zsanitizer=address`, as `scripts/test-all` does): tests whose memory
//! or timing bounds the sanitizer breaks say so with it.
//!
//! Sets `pinpool_loom` when the crate is built for the loom models: with
//! `--cfg loom` and the `loom` feature together (one without the other is
//! an ordinary build). The code names that one cfg wherever it picks loom's
//! primitives or sizes.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(pinpool_host_numa_attribute)");
    let at_least_12_2 = std::env::vars().any(|(key, _)| {
        key.strip_prefix("CARGO_FEATURE_CUDA_")
            .and_then(|version| version.parse::<u32>().ok())
            .is_some_and(|version| version >= 12020)
    });
    if at_least_12_2 {
        println!("cargo::rustc-cfg=pinpool_host_numa_attribute");
    }
    println!("cargo::rustc-check-cfg=cfg(pinpool_asan)");
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    if flags
        .split('\x1f')
        .any(|flag| flag.contains("sanitizer=address"))
    {
        println!("cargo::rustc-cfg=pinpool_asan");
    }
    println!("cargo::rustc-check-cfg=cfg(pinpool_loom)");
    let loom_cfg = std::env::var_os("CARGO_CFG_LOOM").is_some();
    let loom_feature = std::env::var_os("CARGO_FEATURE_LOOM").is_some();
    if loom_cfg && loom_feature {
        println!("cargo::rustc-cfg=pinpool_loom");
    }
}
