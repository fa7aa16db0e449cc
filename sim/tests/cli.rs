//! The command line: bad values are usage errors (exit status 2, no
//! panic), and a tiny run works.

use std::process::{Command, Output};

/// Runs `pinpool-sim sim` with `args`.
fn sim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pinpool-sim"))
        .arg("sim")
        .args(args)
        .output()
        .expect("run pinpool-sim")
}

/// A workload that finishes in a fraction of a second.
const TINY: &[&str] = &["--segments", "2", "--scale", "0.001", "--host"];

/// Checks that every one of `cases` is refused as a usage error.
fn refused(cases: &[&[&str]]) {
    for args in cases {
        let out = sim(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(stderr.contains("error"), "{args:?}: {stderr}");
    }
}

#[test]
fn counts_out_of_range_are_refused() {
    refused(&[
        &["--devices", "0"],
        &["--devices", "65"],
        &["--provers-per-device", "0"],
        &["--devices", "64", "--provers-per-device", "64"],
        &["--segments", "0"],
        &["--segments", "-3"],
        &["--arenas", "0", "--staging", "0"],
        &["--cleaner-threads", "0"],
        &["--cleaner-threads", "257"],
        &["--devices", "two"],
        &["--repeat", "0"],
        &["--repeat", "1001"],
    ]);
}

#[test]
fn bad_caps_are_refused() {
    refused(&[
        &["--max-pooled-gib", "0"],
        &["--max-pooled-gib", "-1"],
        &["--max-pooled-gib=-1"],
        &["--max-pooled-gib", "NaN"],
        &["--max-pooled-gib", "inf"],
        &["--max-pooled-gib", "1e-9"],
        &["--max-pooled-gib", "1e300"],
    ]);
}

#[test]
fn bad_scales_are_refused() {
    refused(&[
        &["--scale", "0"],
        &["--scale", "-0.5"],
        &["--scale", "NaN"],
        &["--scale", "inf"],
        &["--scale", "-inf"],
        &["--scale", "1e300"],
        &["--scale", "513"],
    ]);
}

#[test]
fn bad_strategy_lists_are_refused() {
    refused(&[
        &["--strategies", "host-alloc", "--host"],
        &["--strategies", "pinpool,pinpool"],
        &["--strategies", "nonesuch"],
        &["--strategies", ""],
    ]);
}

#[test]
fn a_tiny_run_works() {
    let out = sim(&[TINY, &["--strategies", "pinpool"]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("segments/s"), "{stdout}");
}

#[test]
fn the_default_strategies_run_without_a_gpu() {
    let out = sim(TINY);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("skipping host-alloc"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for name in ["pinpool", "ideal", "seed", "pageable"] {
        assert!(stdout.contains(name), "{name}: {stdout}");
    }
    assert!(!stdout.contains("host-alloc"), "{stdout}");
}

#[test]
fn repeated_runs_report_every_run_and_their_spread() {
    let out = sim(&[
        TINY,
        &["--strategies", "pageable", "--repeat", "3", "--json"],
    ]
    .concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    let result = &json["results"][0];
    assert_eq!(result["strategy"], "pageable");
    assert_eq!(result["runs"].as_array().map(Vec::len), Some(3));
    let spread = &result["summary"]["segments_per_s"];
    let (min, median, max) = (
        spread["min"].as_f64().unwrap(),
        spread["median"].as_f64().unwrap(),
        spread["max"].as_f64().unwrap(),
    );
    assert!(min <= median && median <= max, "{spread}");
    assert!(result["summary"]["ready_p50_ms"].is_null());

    let out = sim(&[TINY, &["--strategies", "pageable", "--repeat", "2"]].concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let row = stdout
        .lines()
        .find(|l| l.starts_with("segments/s"))
        .unwrap();
    assert!(row.contains('(') && row.contains(')'), "{row}");
}
