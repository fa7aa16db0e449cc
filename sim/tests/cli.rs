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
fn bad_cap_factors_are_refused() {
    refused(&[
        &["--cap-factor", "0"],
        &["--cap-factor", "-1"],
        &["--cap-factor", "NaN"],
        &["--cap-factor", "inf"],
        &["--cap-factor", "x"],
        // Under a page: a tiny run's working set is a few MiB.
        &[TINY, &["--cap-factor", "1e-6"]].concat(),
        &[TINY, &["--cap-factor", "1e300"]].concat(),
    ]);
}

#[test]
fn the_cap_factor_sets_the_cap_from_the_working_set_bound() {
    // TINY's workload, at the command line's defaults.
    let workload = pinpool_sim::workload::Workload {
        devices: 1,
        provers_per_device: 2,
        segments: 2,
        arenas: 16,
        staging: 2,
        scale: 0.001,
        gap_ms: (50.0, 300.0),
        seed: 1,
    };
    let bound = workload.working_set_bound();
    // Overrides --max-pooled-gib, given before or after it.
    let out = sim(&[
        TINY,
        &["--strategies", "pageable", "--json"],
        &["--max-pooled-gib", "1", "--cap-factor", "1.5"],
    ]
    .concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    let settings = &json["settings"];
    assert_eq!(settings["working_set_bound_bytes"], bound);
    assert_eq!(settings["cap_factor"], 1.5);
    assert_eq!(settings["max_pooled_bytes"], (1.5 * bound as f64) as u64);

    let out = sim(&[TINY, &["--strategies", "pageable", "--cap-factor", "2"]].concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mib = |bytes: u64| format!("{:.1} MiB", bytes as f64 / 1048576.0);
    assert!(
        stdout.contains(&format!("working-set bound: {}", mib(bound))),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("cap {} (--cap-factor 2 x", mib(2 * bound))),
        "{stdout}"
    );

    // Without it, the cap is --max-pooled-gib's (by default pinpool's own,
    // following the working set) and the bound still shown.
    let out = sim(&[TINY, &["--strategies", "pageable", "--json"]].concat());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    assert_eq!(json["settings"]["cap_factor"], serde_json::Value::Null);
    assert_eq!(json["settings"]["working_set_bound_bytes"], bound);
    assert_eq!(
        json["settings"]["max_pooled_bytes"],
        serde_json::Value::Null
    );

    let help = sim(&["--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("overrides --max-pooled-gib"), "{help}");
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
    assert!(stdout.contains("class overhead"), "{stdout}");
    assert!(stdout.contains("pinpool  this crate"), "{stdout}");
    assert!(
        stdout.contains("say nothing about pinned copies"),
        "{stdout}"
    );
}

#[test]
fn the_json_names_the_workload_settings_machine_and_backend() {
    let args = [TINY, &["--strategies", "pinpool,ideal", "--json"]].concat();
    let out = sim(&[
        &args[..],
        &["--size-classes", "pow2", "--cleaner-threads", "3"],
    ]
    .concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    assert_eq!(json["workload"]["segments"], 2);
    assert_eq!(json["workload"]["scale"], 0.001);
    assert_eq!(json["workload"]["arenas"], 16);
    assert_eq!(json["settings"]["cleaner_threads"], 3);
    assert_eq!(json["settings"]["size_classes"], "pow2");
    assert_eq!(json["settings"]["repeat"], 1);
    assert_eq!(json["settings"]["seed"], 1);
    assert_eq!(
        json["settings"]["max_pooled_bytes"],
        serde_json::Value::Null
    );
    assert!(json["machine"]["cpus"].as_u64().unwrap() >= 1);
    assert!(json["machine"].get("hostname").is_some());
    assert!(json["machine"].get("total_memory_bytes").is_some());
    assert_eq!(json["backend"]["kind"], "host");
    assert_eq!(json["backend"]["pinpool"], "host");
    let results = json["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    for result in results {
        assert!(!result["legend"].as_str().unwrap().is_empty());
        let run = &result["runs"][0];
        let (asked, handed) = (
            run["bytes_requested"].as_f64().unwrap(),
            run["bytes_handed_out"].as_f64().unwrap(),
        );
        assert!(handed >= asked && asked > 0.0, "{run}");
        // The two sides divide in different orders (and borrowing, which
        // moves bytes between classes, varies with timing): equal within a
        // relative tolerance, not to the last bit.
        let overhead = run["class_overhead"].as_f64().unwrap();
        assert!(
            (overhead - handed / asked).abs() <= 1e-9 * overhead,
            "class_overhead {overhead} against {handed} / {asked}"
        );
    }
    // The ideal strategy keeps buffers of pinpool's fine classes (at most
    // 12.5% over the size asked, less than powers of two), and never misses.
    let ideal = &results[1]["runs"][0];
    let overhead = |run: &serde_json::Value| run["class_overhead"].as_f64().unwrap();
    assert_eq!(ideal["hit_rate"], 1.0);
    assert!(overhead(ideal) <= 1.125, "{ideal}");
    assert!(
        overhead(ideal) < overhead(&results[0]["runs"][0]),
        "{results:?}"
    );
}

#[test]
fn the_default_strategies_run_without_a_gpu() {
    let out = sim(TINY);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("skipping host-alloc"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for name in ["pinpool", "ideal", "limit", "seed", "pageable"] {
        assert!(stdout.contains(name), "{name}: {stdout}");
    }
    assert!(!stdout.contains("host-alloc"), "{stdout}");
}

#[test]
fn the_table_says_the_limit_is_wrong_on_purpose() {
    let out = sim(&[TINY, &["--strategies", "ideal,limit"]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    // The names, then under limit's alone its warning, then the figures.
    let names = lines
        .iter()
        .position(|l| l.trim_start().starts_with("ideal"))
        .expect("the table's names");
    let (head, warning) = (lines[names], lines[names + 1]);
    assert!(head.trim_end().ends_with("limit"), "{stdout}");
    assert!(
        warning.trim_end().ends_with("(wrong on purpose)"),
        "{stdout}"
    );
    assert_eq!(warning.trim_end().len(), head.trim_end().len(), "{stdout}");
    assert!(lines[names + 2].starts_with("segments/s"), "{stdout}");
    assert!(
        stdout.contains("limit  WRONG ON PURPOSE, never a real strategy"),
        "{stdout}"
    );

    // Without the limit, no such line.
    let out = sim(&[TINY, &["--strategies", "ideal"]].concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("wrong on purpose"), "{stdout}");
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

#[test]
fn trace_dump_prints_every_record_and_reports_a_bad_file_with_its_offset() {
    let dir = std::env::temp_dir();
    let path = dir.join(format!("pinpool-sim-dump-{}.trace", std::process::id()));
    let pool = pinpool::Pool::builder()
        .backend(pinpool::BackendKind::Host)
        .trace(&path)
        .build()
        .unwrap();
    drop(pool.take(4096));
    drop(pool);
    let dump = |path: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_pinpool-sim"))
            .arg("trace-dump")
            .arg(path)
            .output()
            .expect("run pinpool-sim")
    };
    let out = dump(&path);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.lines().any(|l| l == "# backend=host"), "{text}");
    let take = text.lines().find(|l| l.contains(" take ")).expect(&text);
    assert!(
        take.contains("asked=4096") && take.contains("source=miss"),
        "{take}"
    );
    assert!(text.lines().any(|l| l.contains(" drop ")), "{text}");
    assert!(
        text.lines().last().unwrap().contains(" end records="),
        "{text}"
    );
    // Cut inside its last record: the records before it, then the error.
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 7]).unwrap();
    let out = dump(&path);
    let _ = std::fs::remove_file(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let at = bytes.len() - 48;
    assert!(
        stderr.contains(&format!("bad trace at byte {at}: truncated record")),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(" take "));
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Runs `pinpool-sim replay` with `args`.
fn replay(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pinpool-sim"))
        .arg("replay")
        .args(args)
        .output()
        .expect("run pinpool-sim")
}

#[test]
fn sim_traces_pinpool_and_replay_runs_the_trace_against_each_strategy() {
    let path = std::env::temp_dir().join(format!("pinpool-sim-cli-{}.trace", std::process::id()));
    let path_text = path.to_str().unwrap();
    let mut args = TINY.to_vec();
    args.extend([
        "--strategies",
        "pinpool,pageable",
        "--json",
        "--trace",
        path_text,
    ]);
    let out = sim(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let simmed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    let out = replay(&[path.as_os_str(), "--host".as_ref(), "--json".as_ref()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    let replayed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let takes = 2 * 2 * 18;
    assert_eq!(replayed["trace"]["takes"], takes);
    assert_eq!(replayed["trace"]["threads"], 2);
    assert_eq!(replayed["trace"]["lost_records"], 0);
    let conf = replayed["settings"]["pinpool_conf"].as_str().unwrap();
    assert!(conf.contains("max_pooled_bytes=follow"), "{conf}");
    let names: Vec<_> = replayed["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["strategy"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["pinpool", "ideal", "seed", "pageable"]);
    let requested =
        |v: &serde_json::Value, i: usize| v["results"][i]["runs"][0]["bytes_requested"].clone();
    for i in 0..4 {
        assert_eq!(requested(&replayed, i), requested(&simmed, 0));
        assert!(replayed["results"][i]["runs"][0]["late_p99_ms"].is_f64());
        assert!(replayed["results"][i]["runs"][0]["segments_per_s"].is_null());
    }

    // The table: the trace's line, lateness, no segments/s.
    let out = replay(&[
        path.as_os_str(),
        "--host".as_ref(),
        "--strategies".as_ref(),
        "pageable".as_ref(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.lines().any(|l| l.starts_with("trace: ")), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("replay late p99 ms")),
        "{text}"
    );
    assert!(!text.lines().any(|l| l.starts_with("segments/s")), "{text}");

    // A cut file replays the records before the cut, with a warning that
    // names the offset; a bad header is an error (status 1), no panic.
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
    let out = replay(&[
        path.as_os_str(),
        "--host".as_ref(),
        "--strategies".as_ref(),
        "pageable".as_ref(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("bad trace at byte"), "{stderr}");
    assert!(
        stderr.contains("replaying the records before it"),
        "{stderr}"
    );
    let mut bad = bytes.clone();
    bad[0] = b'X';
    std::fs::write(&path, &bad).unwrap();
    let out = replay(&[path.as_os_str(), "--host".as_ref()]);
    let _ = std::fs::remove_file(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("bad trace at byte 0"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    // Bad speeds are usage errors; so is a trace of no pinpool run.
    for bad in ["0", "-1", "NaN", "x"] {
        let out = replay(&[path.as_os_str(), "--speed".as_ref(), bad.as_ref()]);
        assert_eq!(out.status.code(), Some(2), "--speed {bad}");
    }
    refused(&[&["--trace", path_text, "--strategies", "pageable"]]);

    // A trace path that cannot be written fails before the run.
    let out = sim(&[TINY, &["--trace", "/nonexistent-dir/x.trace"]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("/nonexistent-dir/x.trace"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    // Times that would take centuries to replay are refused.
    use pinpool::trace::{Header, Record, Source, Trace};
    let take = |time_ns, id| Record::Take {
        time_ns,
        thread: 1,
        device: 0,
        id,
        asked: 10,
        len: 10,
        source: Source::Miss,
    };
    let long = Trace {
        version: pinpool::trace::VERSION,
        header: Header::default(),
        records: vec![take(0, 1), take(u64::MAX / 2, 2)],
    };
    std::fs::write(&path, long.to_bytes()).unwrap();
    let out = replay(&[path.as_os_str(), "--host".as_ref()]);
    let _ = std::fs::remove_file(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("more than a replay may take"), "{stderr}");
}

/// The polylines of `svg` drawn in `color` (`#RRGGBB`) that are not a
/// legend's mark (a horizontal stroke of two points), as point counts.
fn polylines(svg: &roxmltree::Document<'_>, color: &str) -> Vec<usize> {
    svg.descendants()
        .filter(|n| n.has_tag_name("polyline") && n.attribute("stroke") == Some(color))
        .map(|n| {
            n.attribute("points")
                .unwrap_or("")
                .split_whitespace()
                .map(|p| p.split(',').nth(1).unwrap_or("").to_string())
                .collect::<Vec<_>>()
        })
        .filter(|ys| !(ys.len() == 2 && ys[0] == ys[1]))
        .map(|ys| ys.len())
        .collect()
}

#[test]
fn plots_are_svg_with_pinned_and_in_use_over_time_for_each_strategy() {
    let dir = std::env::temp_dir();
    let path = dir.join(format!("pinpool-sim-plot-{}.svg", std::process::id()));
    // Long enough (tens of milliseconds) for many samples.
    let mut args = vec!["--segments", "6", "--scale", "0.01", "--host"];
    args.extend(["--strategies", "pinpool,pageable"]);
    args.extend(["--plot", path.to_str().unwrap()]);
    let out = sim(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let svg = roxmltree::Document::parse(&text).expect("valid XML");
    assert!(svg.root_element().has_tag_name("svg"));
    let texts: Vec<String> = svg
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(|t| t.trim().to_string())
        .collect();
    for label in ["pinpool", "pageable", "pinned", "in use", "seconds", "GiB"] {
        assert!(texts.iter().any(|t| t == label), "{label}: {texts:?}");
    }
    // Pageable misses every take: 2 provers x 6 segments x 18 buffers.
    assert!(texts.iter().any(|t| t == "misses (216)"), "{texts:?}");
    // Per panel, each series a line over the run (and its legend's mark).
    for color in ["#C82828", "#1E5AC8"] {
        let lines = polylines(&svg, color);
        assert_eq!(lines.len(), 2, "{color}: {lines:?}");
        assert!(lines.iter().all(|&n| n >= 3), "{color}: {lines:?}");
    }

    // A file that cannot be written fails before the run, with its path.
    let out = sim(&[TINY, &["--plot", "/nonexistent-dir/x.svg"]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("/nonexistent-dir/x.svg"), "{stderr}");
}

#[test]
fn suggest_finds_the_smallest_cap_that_keeps_a_buffer_reused() {
    // One thread takes and drops the same 64 KiB buffer, 5 ms apart
    // (time for the cleaner): the takes after the first hit under a cap
    // of at least 64 KiB, none under less.
    let path =
        std::env::temp_dir().join(format!("pinpool-sim-suggest-{}.trace", std::process::id()));
    let pool = pinpool::Pool::builder()
        .backend(pinpool::BackendKind::Host)
        .trace(&path)
        .build()
        .unwrap();
    for _ in 0..40 {
        drop(pool.take(64 << 10));
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    drop(pool);
    let suggest = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_pinpool-sim"))
            .arg("suggest")
            .args(args)
            .arg(&path)
            .output()
            .expect("run pinpool-sim")
    };
    let out = suggest(&["--host", "--json", "--target", "90"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["peak_in_use_bytes"], 64 << 10);
    let suggestion = &json["suggestion"];
    assert_eq!(suggestion["cap_factor"], 1.0, "{json:#}");
    assert_eq!(suggestion["max_pooled_bytes"], 64 << 10);
    let conf = suggestion["conf"].as_str().unwrap();
    assert!(
        conf.starts_with(&format!("max_pooled_bytes={},", 64 << 10)),
        "{conf}"
    );
    assert!(suggestion["steady_hit_rate_bytes"].as_f64().unwrap() >= 0.9);
    // No cap under the buffer's length pools it, and each layout stops at
    // its first cap that reaches the target.
    let steps = json["steps"].as_array().unwrap();
    for step in steps {
        if step["max_pooled_bytes"].as_u64().unwrap() < 64 << 10 {
            assert_eq!(step["steady_hit_rate_bytes"], 0.0, "{step:#}");
        }
    }
    for layout in steps.chunk_by(|a, b| a["layout"] == b["layout"]) {
        let reached: Vec<bool> = layout
            .iter()
            .map(|s| s["reached"].as_bool().unwrap())
            .collect();
        assert!(!reached[..reached.len() - 1].contains(&true), "{layout:#?}");
    }

    // The table says what to set.
    let out = suggest(&["--host", "--target", "90%"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "suggested: PINPOOL_CONF=max_pooled_bytes={},",
            64 << 10
        )),
        "{text}"
    );
    // With settings given, the line carries them too (the sweep ran with
    // them), but not one the step overrode (the pool trims keys, and the
    // last pair of a key wins).
    let out = suggest(&[
        "--host",
        "--target",
        "90%",
        "--pinpool-conf",
        "borrow=0, max_pooled_bytes=1GiB",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("suggested: "))
        .unwrap_or_else(|| panic!("{text}"));
    let conf = line["suggested: PINPOOL_CONF=".len()..]
        .split(" (")
        .next()
        .unwrap();
    let last = |key: &str| {
        conf.split(',')
            .filter_map(|p| p.split_once('='))
            .rfind(|(k, _)| k.trim() == key)
            .map(|(_, v)| v.trim().to_string())
    };
    assert_eq!(last("borrow").as_deref(), Some("0"), "{line}");
    assert_eq!(
        last("max_pooled_bytes"),
        Some((64 << 10).to_string()),
        "{line}"
    );
    let _ = std::fs::remove_file(&path);
    for bad in ["0", "101", "x", "-5%"] {
        let out = suggest(&["--target", bad]);
        assert_eq!(out.status.code(), Some(2), "--target {bad}");
    }
}

#[test]
fn emulated_pinning_counts_what_pinpool_would_pin_without_a_gpu() {
    let run = |extra: &[&str]| {
        let out = sim(&[TINY, &["--strategies", "pinpool", "--json"], extra].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
        let run = json["results"][0]["runs"][0].clone();
        (json["backend"]["pinpool"].clone(), run)
    };
    let (backend, plain) = run(&[]);
    assert_eq!(plain["peak_pinned_bytes"], 0, "{plain}");
    assert_eq!(plain["registrations"], 0, "{plain}");
    assert!(!backend.as_str().unwrap().contains("emulated"), "{backend}");
    let (backend, emulated) = run(&["--emulate-pinning", "--pinpool-conf", "regions=on"]);
    assert!(
        backend.as_str().unwrap().ends_with("pinning emulated"),
        "{backend}"
    );
    assert!(
        emulated["registrations"].as_u64().unwrap() > 0,
        "{emulated}"
    );
    let pinned = emulated["peak_pinned_bytes"].as_u64().unwrap();
    let in_use = emulated["peak_in_use_bytes"].as_u64().unwrap();
    assert!(pinned > 0 && in_use > 0, "{emulated}");
    assert!(
        emulated["pinned_per_in_use"].as_f64().unwrap() > 0.0,
        "{emulated}"
    );
}

/// A tiny run of pinpool traced to `path`, read back.
fn captured(path: &std::path::Path) -> pinpool::trace::Trace {
    let mut args = TINY.to_vec();
    args.extend(["--strategies", "pinpool", "--trace", path.to_str().unwrap()]);
    let out = sim(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    pinpool::trace::Trace::read(path).unwrap()
}

/// The pool settings a trace's header names are replayed, but never where
/// to write a trace: a header naming one (the trace itself, say) is not a
/// way to make `replay` or `suggest` overwrite a file.
#[test]
fn a_trace_setting_in_the_header_is_not_replayed() {
    let dir = std::env::temp_dir();
    let path = dir.join(format!("pinpool-sim-cli-hdr-{}.trace", std::process::id()));
    let victim = dir.join(format!(
        "pinpool-sim-cli-victim-{}.trace",
        std::process::id()
    ));
    let mut trace = captured(&path);
    trace
        .header
        .entries
        .push(("setting.trace".into(), victim.to_str().unwrap().into()));
    let bytes = trace.to_bytes();
    std::fs::write(&path, &bytes).unwrap();
    for command in ["replay", "suggest"] {
        let out = Command::new(env!("CARGO_BIN_EXE_pinpool-sim"))
            .args([command, path.to_str().unwrap(), "--host", "--speed", "4"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{command}: {stderr}");
        assert!(!victim.exists(), "{command} wrote the header's trace path");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "{command} changed the trace"
        );
    }
    let _ = std::fs::remove_file(&path);
}

/// A trace whose takes hold more at once than this machine has (say, one
/// recorded on a larger host) is refused with the figures, before any
/// strategy runs out of memory mid-replay (a panic, or an abort).
#[test]
fn a_trace_holding_more_than_this_machine_has_is_refused() {
    let path =
        std::env::temp_dir().join(format!("pinpool-sim-cli-huge-{}.trace", std::process::id()));
    let mut trace = captured(&path);
    let take = trace
        .records
        .iter_mut()
        .find(|r| matches!(r, pinpool::trace::Record::Take { .. }))
        .unwrap();
    if let pinpool::trace::Record::Take { asked, len, .. } = take {
        (*asked, *len) = (1 << 40, 1 << 40);
    }
    std::fs::write(&path, trace.to_bytes()).unwrap();
    for (command, strategies) in [
        ("replay", "pinpool"),
        ("replay", "pageable"),
        ("replay", "seed"),
        ("suggest", ""),
    ] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pinpool-sim"));
        cmd.args([command, path.to_str().unwrap(), "--host"]);
        if !strategies.is_empty() {
            cmd.args(["--strategies", strategies]);
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{command} {strategies}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(
            stderr.contains("at once") && stderr.contains("available"),
            "{stderr}"
        );
    }
    let _ = std::fs::remove_file(&path);
}

/// `suggest` judges settings by the steady part of a trace (its last three
/// quarters of time): a trace with no take there is refused, not answered
/// with a vacuous 100% for any cap; `replay` warns that its steady figures
/// count nothing.
#[test]
fn a_trace_with_no_steady_take_has_nothing_to_suggest() {
    use pinpool::trace::{Header, Record, Source, Trace};
    let path = std::env::temp_dir().join(format!(
        "pinpool-sim-cli-early-{}.trace",
        std::process::id()
    ));
    let ms = 1_000_000;
    let mut records = Vec::new();
    for i in 0..10u64 {
        records.push(Record::Take {
            time_ns: ms * i,
            thread: 7,
            device: 0,
            id: 0x10_0000 * (i + 1),
            asked: 1 << 20,
            len: 1 << 20,
            source: Source::Miss,
        });
    }
    for i in 0..10u64 {
        records.push(Record::Drop {
            time_ns: 100 * ms,
            thread: 7,
            taker: 7,
            device: 0,
            id: 0x10_0000 * (i + 1),
            dirty: 0,
            copy_recorded: false,
            pinned: false,
            remote: false,
        });
    }
    let n = records.len() as u64;
    records.push(Record::End {
        time_ns: 100 * ms,
        records: n,
        lost: 0,
    });
    let trace = Trace {
        version: pinpool::trace::VERSION,
        header: Header {
            entries: vec![
                ("backend".into(), "host".into()),
                ("setting.backend".into(), "host".into()),
            ],
        },
        records,
    };
    std::fs::write(&path, trace.to_bytes()).unwrap();
    let run = |command: &str| {
        Command::new(env!("CARGO_BIN_EXE_pinpool-sim"))
            .args([command, path.to_str().unwrap(), "--host"])
            .output()
            .unwrap()
    };
    let out = run("suggest");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stderr}{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(stderr.contains("no take in its steady part"), "{stderr}");
    let out = run("replay");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("no take in its steady part"), "{stderr}");
    let _ = std::fs::remove_file(&path);
}

/// Captures a tiny traced run as [`captured`] does, lets `edit` change its
/// trace, and replays it through pinpool on the host backend; the replay's
/// output (the trace file is removed).
fn replay_edited(name: &str, edit: impl FnOnce(&mut pinpool::trace::Trace)) -> Output {
    let path = std::env::temp_dir().join(format!(
        "pinpool-sim-cli-{name}-{}.trace",
        std::process::id()
    ));
    let mut trace = captured(&path);
    edit(&mut trace);
    std::fs::write(&path, trace.to_bytes()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pinpool-sim"))
        .args([
            "replay",
            path.to_str().unwrap(),
            "--host",
            "--strategies",
            "pinpool",
        ])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    out
}

/// A trace setting spelled with a space (pinpool trims keys) is no more a
/// way to make `replay` write a file than `setting.trace` is.
#[test]
fn a_spaced_trace_setting_in_the_header_is_not_replayed() {
    let victim =
        std::env::temp_dir().join(format!("pinpool-sim-cli-spv-{}.trace", std::process::id()));
    let out = replay_edited("sp", |trace| {
        trace
            .header
            .entries
            .push(("setting. trace".into(), victim.to_str().unwrap().into()));
    });
    let written = victim.exists();
    let _ = std::fs::remove_file(&victim);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !written,
        "replay wrote the header's trace path {}",
        victim.display()
    );
}

/// Likewise `backend` and `devices`, which the replay sets: a spaced key
/// must not build a pool that cannot run here, or one with fewer devices
/// than the replay takes on (a panic).
#[test]
fn spaced_backend_and_devices_settings_in_the_header_do_not_panic() {
    let out = replay_edited("spb", |trace| {
        trace
            .header
            .entries
            .push(("setting.backend ".into(), "cuda".into()));
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    // On the host backend, as `--host` asks (it failed for want of a GPU).
    assert!(out.status.success(), "{stderr}");
    let out = replay_edited("spd", |trace| {
        for r in &mut trace.records {
            if let pinpool::trace::Record::Take { device, .. }
            | pinpool::trace::Record::Drop { device, .. } = r
            {
                *device = 1;
            }
        }
        trace
            .header
            .entries
            .push(("setting.devices ".into(), "1".into()));
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
}
