//! `pinpool-sim sim`: runs a proving workload through several staging
//! strategies side by side and reports how each fared; `pinpool-sim
//! replay` does the same with a trace of a real process, and `pinpool-sim
//! trace-dump` prints a trace as text.

mod cli;

use std::io::IsTerminal;
use std::sync::Arc;

use clap::builder::RangedU64ValueParser;
use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, Subcommand};
use cudarc::driver::CudaContext;
use indicatif::{ProgressBar, ProgressStyle};
use pinpool::SizeClasses;
use pinpool_sim::demand::Demand;
use pinpool_sim::ideal::IdealPool;
use pinpool_sim::machine::Machine;
use pinpool_sim::replay::Replay;
use pinpool_sim::report::{Report, FIGURES};
use pinpool_sim::run::{run, RunResult};
use pinpool_sim::strategy::{Kind, Settings};
use pinpool_sim::workload::Workload;

/// Bytes in a GiB.
const GIB: f64 = (1u64 << 30) as f64;

#[derive(Parser)]
#[command(
    name = "pinpool-sim",
    version,
    about = "pinpool's proving-workload simulator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Simulate a proving workload with each strategy on the same draws.
    Sim(SimArgs),
    /// Replay a pinpool trace (written through `PINPOOL_TRACE`,
    /// `PoolBuilder::trace` or `sim --trace`) against each strategy: one
    /// thread per traced thread, each take and drop at its time.
    Replay(ReplayArgs),
    /// Replay a pinpool trace through pinpool under caps from half its
    /// peak in-use bytes up, for each layout (size classes, regions), and
    /// print the smallest settings that reach the target of steady byte
    /// hits: the `PINPOOL_CONF` line to use.
    Suggest(SuggestArgs),
    /// Print a pinpool trace (written through `PINPOOL_TRACE` or
    /// `PoolBuilder::trace`) as text: the header's lines, then one line
    /// per record.
    TraceDump {
        /// The trace file.
        trace: std::path::PathBuf,
    },
}

#[derive(Parser)]
struct SimArgs {
    /// Devices (GPUs, or simulated shards without a GPU), 1 to 64.
    #[arg(long, default_value_t = 1, value_parser = RangedU64ValueParser::<usize>::new().range(1..=cli::MAX_DEVICES))]
    devices: usize,
    /// Prover threads per device, each with its own stream on a GPU, 1 to
    /// 64 (at most 1024 provers in all).
    #[arg(long, default_value_t = 2, value_parser = RangedU64ValueParser::<usize>::new().range(1..=cli::MAX_PROVERS_PER_DEVICE))]
    provers_per_device: usize,
    /// Segments per prover, 1 to 100000.
    #[arg(long, default_value_t = 24, value_parser = RangedU64ValueParser::<usize>::new().range(1..=cli::MAX_SEGMENTS))]
    segments: usize,
    /// Record arenas per segment, 0 to 1024.
    #[arg(long, default_value_t = 16, value_parser = RangedU64ValueParser::<usize>::new().range(0..=cli::MAX_BUFFERS))]
    arenas: usize,
    /// Staging buffers per segment, 0 to 1024 (arenas and staging buffers:
    /// at least one in all).
    #[arg(long, default_value_t = 2, value_parser = RangedU64ValueParser::<usize>::new().range(0..=cli::MAX_BUFFERS))]
    staging: usize,
    /// Factor on every buffer size and CPU gap (1 = the real client's
    /// ~2.1 GiB per segment and 50-300 ms gaps), above 0 and at most 512
    /// (where the profile's largest buffer, 2 GiB, reaches pinpool's
    /// largest size class, 1 TiB).
    #[arg(long, default_value_t = 1.0 / 64.0, value_parser = cli::parse_scale, allow_negative_numbers = true)]
    scale: f64,
    /// Seed of the workload draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// pinpool's cap on pooled bytes, GiB: at least one page, at most
    /// 1 PiB; or `default`, pinpool's own, a cap that follows the working
    /// set (the seed design keeps its 4 GiB); --cap-factor overrides it.
    #[arg(long = "max-pooled-gib", value_name = "GIB", default_value = "default", value_parser = cli::parse_cap_arg, allow_negative_numbers = true)]
    max_pooled_bytes: cli::Cap,
    /// Sets pinpool's cap on pooled bytes to F times the working-set bound
    /// of the run's plans (every prover at its largest segment at once: the
    /// sum over provers of the bytes asked for by each one's largest
    /// segment); overrides --max-pooled-gib. Above 0; the cap it gives
    /// must lie within --max-pooled-gib's bounds.
    #[arg(long, value_name = "F", value_parser = cli::parse_cap_factor, allow_negative_numbers = true)]
    cap_factor: Option<f64>,
    /// pinpool's cleaner workers, 1 to 256 (default: pinpool's own, the
    /// number of cores, at most 8).
    #[arg(long, default_value_t = pinpool::Config::default().cleaner_threads, value_parser = RangedU64ValueParser::<usize>::new().range(1..=cli::MAX_CLEANER_THREADS))]
    cleaner_threads: usize,
    /// pinpool's size classes.
    #[arg(long, value_enum, default_value_t = Classes::Fine)]
    size_classes: Classes,
    /// More pinpool settings, as `key=value` pairs in the format of
    /// `PINPOOL_CONF` (e.g. `borrow=100%,provision=off`), applied after the
    /// options above.
    #[arg(long, value_name = "PAIRS", default_value = "", value_parser = cli::parse_conf)]
    pinpool_conf: String,
    /// Strategies to run, in order; those that need a GPU are skipped
    /// without one, and ideal and limit are skipped when their buffers
    /// would not fit in the memory available. limit is wrong on purpose:
    /// the workload's speed limit, never a real strategy.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Kind::Pinpool, Kind::Ideal, Kind::Limit, Kind::Seed, Kind::Pageable, Kind::HostAlloc])]
    strategies: Vec<Kind>,
    /// Run on the host backend even when a GPU is present.
    #[arg(long)]
    host: bool,
    /// Without a GPU (or with --host), run pinpool on a backend that pins
    /// in name only: it registers as the CUDA backend would (each
    /// registration costs only what mapping and pre-faulting the memory
    /// cost), so pinned bytes, registrations and regions show on a machine
    /// without a GPU. Copies stay memcpys.
    #[arg(long)]
    emulate_pinning: bool,
    /// Runs of each strategy, on the same draws, 1 to 1000; with more
    /// than one the table shows each figure's median (min-max), `-` for
    /// a figure some run lacks, and the JSON every run and the summary.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=cli::MAX_REPEAT))]
    repeat: u32,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Write a trace of pinpool's run to PATH (with --repeat above 1, run
    /// N after the first to PATH.N), for `replay` and `trace-dump`; without
    /// it, `PINPOOL_TRACE` names the path, if set.
    #[arg(long, value_name = "PATH")]
    trace: Option<std::path::PathBuf>,
    /// Draw pinned and in-use bytes over time, and the misses, per
    /// strategy (its first run), to an SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<std::path::PathBuf>,
}

#[derive(Parser)]
struct ReplayArgs {
    /// The trace file.
    trace: std::path::PathBuf,
    /// Replays the trace this many times faster than it was recorded
    /// (gaps between takes and drops divided by F); above 0.
    #[arg(long, value_name = "F", default_value_t = 1.0, value_parser = cli::parse_speed)]
    speed: f64,
    /// pinpool settings, as `key=value` pairs in the format of
    /// `PINPOOL_CONF`, applied over those the trace records.
    #[arg(long, value_name = "PAIRS", default_value = "", value_parser = cli::parse_conf)]
    pinpool_conf: String,
    /// Strategies to run, in order; those that need a GPU are skipped
    /// without one, and ideal and limit are skipped when their buffers
    /// would not fit in the memory available. limit is wrong on purpose:
    /// the workload's speed limit, never a real strategy.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Kind::Pinpool, Kind::Ideal, Kind::Seed, Kind::Pageable, Kind::HostAlloc])]
    strategies: Vec<Kind>,
    /// Run on the host backend even when a GPU is present.
    #[arg(long)]
    host: bool,
    /// Without a GPU (or with --host), run pinpool on a backend that pins
    /// in name only: it registers as the CUDA backend would (each
    /// registration costs only what mapping and pre-faulting the memory
    /// cost), so pinned bytes, registrations and regions show on a machine
    /// without a GPU. Copies stay memcpys.
    #[arg(long)]
    emulate_pinning: bool,
    /// Runs of each strategy, 1 to 1000; with more than one the table
    /// shows each figure's median (min-max), `-` for a figure some run
    /// lacks, and the JSON every run and the summary.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=cli::MAX_REPEAT))]
    repeat: u32,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Draw pinned and in-use bytes over time, and the misses, per
    /// strategy (its first run), to an SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<std::path::PathBuf>,
}

#[derive(Parser)]
struct SuggestArgs {
    /// The trace file.
    trace: std::path::PathBuf,
    /// Steady byte hits to reach, percent (above 0, at most 100).
    #[arg(long, value_name = "PERCENT", default_value = "99.9", value_parser = cli::parse_target)]
    target: f64,
    /// Replays the trace this many times faster than it was recorded;
    /// above 0.
    #[arg(long, value_name = "F", default_value_t = 1.0, value_parser = cli::parse_speed)]
    speed: f64,
    /// pinpool settings, as `key=value` pairs in the format of
    /// `PINPOOL_CONF`, applied over those the trace records and under
    /// those each step sets (the cap, the size classes, regions).
    #[arg(long, value_name = "PAIRS", default_value = "", value_parser = cli::parse_conf)]
    pinpool_conf: String,
    /// Layouts to sweep, in order: size classes (fine, pow2) and regions
    /// (off, on).
    #[arg(long, value_delimiter = ',', default_value = "fine-off,fine-on,pow2-off,pow2-on", value_parser = pinpool_sim::suggest::Layout::parse)]
    layouts: Vec<pinpool_sim::suggest::Layout>,
    /// Run on the host backend even when a GPU is present.
    #[arg(long)]
    host: bool,
    /// Without a GPU (or with --host), run pinpool on a backend that pins
    /// in name only: it registers as the CUDA backend would (each
    /// registration costs only what mapping and pre-faulting the memory
    /// cost), so pinned bytes, registrations and regions show on a machine
    /// without a GPU. Copies stay memcpys.
    #[arg(long)]
    emulate_pinning: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// How pinpool rounds requested sizes (`--size-classes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Classes {
    /// Eight classes per octave above a page (at most 12.5% over the size
    /// asked).
    Fine,
    /// Powers of two, the seed design's lengths.
    Pow2,
}

impl From<Classes> for SizeClasses {
    fn from(classes: Classes) -> Self {
        match classes {
            Classes::Fine => SizeClasses::Fine,
            Classes::Pow2 => SizeClasses::PowersOfTwo,
        }
    }
}

/// Reports a bad combination of `sim` arguments as clap does and exits
/// with its usage status, 2.
fn usage_error(message: impl std::fmt::Display) -> ! {
    subcommand_error("sim", message)
}

/// Reports a bad combination of `subcommand`'s arguments as clap does and
/// exits with its usage status, 2.
fn subcommand_error(subcommand: &str, message: impl std::fmt::Display) -> ! {
    let mut cli = Cli::command();
    cli.build();
    match cli.find_subcommand_mut(subcommand) {
        Some(sim) => sim.error(ErrorKind::ValueValidation, message).exit(),
        None => cli.error(ErrorKind::ValueValidation, message).exit(),
    }
}

/// Checks what the value parsers cannot see alone.
fn validate(args: &SimArgs) {
    if args.devices * args.provers_per_device > cli::MAX_PROVERS {
        usage_error(format_args!(
            "--devices times --provers-per-device must be at most {}, got {} x {}",
            cli::MAX_PROVERS,
            args.devices,
            args.provers_per_device
        ));
    }
    if args.arenas + args.staging == 0 {
        usage_error("--arenas and --staging are both 0: segments would take no buffers");
    }
    if let Some(kind) = twice(&args.strategies) {
        usage_error(format_args!("--strategies names {} twice", kind.name()));
    }
    if args.trace.is_some() && !args.strategies.contains(&Kind::Pinpool) {
        usage_error("--trace records pinpool's runs, and --strategies leaves pinpool out");
    }
}

/// A strategy `strategies` names twice.
fn twice(strategies: &[Kind]) -> Option<Kind> {
    strategies
        .iter()
        .enumerate()
        .find_map(|(i, k)| strategies[..i].contains(k).then_some(*k))
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("PINPOOL_LOG"))
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Sim(args) => {
            validate(&args);
            sim(args)
        }
        Command::Replay(args) => {
            if let Some(kind) = twice(&args.strategies) {
                subcommand_error(
                    "replay",
                    format_args!("--strategies names {} twice", kind.name()),
                );
            }
            replay(args)
        }
        Command::Suggest(args) => suggest(args),
        Command::TraceDump { trace } => trace_dump(&trace),
    }
}

/// `trace-dump`: the header as `# key=value` lines, then the records; a
/// bad file is reported with its byte offset after the records before it
/// (exit status 1).
fn trace_dump(path: &std::path::Path) {
    use std::io::Write;
    let fail = |e: pinpool::trace::ParseError| -> ! {
        eprintln!("pinpool-sim trace-dump: {}: {e}", path.display());
        std::process::exit(1)
    };
    let file = std::fs::File::open(path).unwrap_or_else(|e| {
        eprintln!("pinpool-sim trace-dump: {}: {e}", path.display());
        std::process::exit(1)
    });
    let reader =
        pinpool::trace::Reader::new(std::io::BufReader::new(file)).unwrap_or_else(|e| fail(e));
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    // A closed pipe (`| head`) stops the dump quietly.
    let closed = |_| std::process::exit(0);
    for (key, value) in &reader.header().entries {
        writeln!(out, "# {key}={value}").unwrap_or_else(closed);
    }
    for record in reader {
        match record {
            Ok(record) => writeln!(out, "{record}").unwrap_or_else(closed),
            Err(e) => {
                out.flush().unwrap_or_else(closed);
                fail(e)
            }
        }
    }
    out.flush().unwrap_or_else(closed);
}

fn sim(mut args: SimArgs) {
    // Where the trace path came from, for its errors.
    let trace_from = if args.trace.is_some() {
        "--trace"
    } else {
        "PINPOOL_TRACE"
    };
    if args.trace.is_none() {
        args.trace = std::env::var_os("PINPOOL_TRACE")
            .filter(|path| !path.is_empty())
            .map(Into::into);
        if args.trace.is_some() && !args.strategies.contains(&Kind::Pinpool) {
            usage_error(
                "PINPOOL_TRACE records pinpool's runs, and --strategies leaves pinpool out",
            );
        }
    }
    check_plot("sim", args.plot.as_deref());
    if let Some(path) = &args.trace {
        // Fails early, with the path, rather than when pinpool's run
        // builds its pool.
        if let Err(e) = std::fs::File::create(path) {
            eprintln!("pinpool-sim sim: {trace_from} {}: {e}", path.display());
            std::process::exit(1);
        }
    }
    let gpu = if args.host {
        None
    } else {
        pinpool_sim::gpu::detect()
    };
    if let Some(g) = &gpu {
        if args.devices > g.len() {
            usage_error(format_args!(
                "--devices {} asks for more devices than the {} GPU(s) present",
                args.devices,
                g.len()
            ));
        }
    }
    let workload = Workload {
        devices: args.devices,
        provers_per_device: args.provers_per_device,
        segments: args.segments,
        arenas: args.arenas,
        staging: args.staging,
        scale: args.scale,
        gap_ms: (50.0, 300.0),
        seed: args.seed,
    };
    let working_set = workload.working_set_bound();
    let max_pooled_bytes = match args.cap_factor {
        Some(factor) => {
            Some(cli::cap_from_factor(factor, working_set).unwrap_or_else(|e| usage_error(e)))
        }
        None => args.max_pooled_bytes.0,
    };
    let settings = Settings {
        cleaner_threads: args.cleaner_threads,
        max_pooled_bytes,
        size_classes: args.size_classes.into(),
        conf: args.pinpool_conf.clone(),
        trace: None,
        emulate_pinning: args.emulate_pinning,
    };
    let strategies = fit_prepared(
        "sim",
        usable("sim", &args.strategies, args.host, gpu.is_some()),
        &workload,
    );
    let backend = Backend::new(gpu.as_deref(), &workload, &settings);
    let machine = Machine::this();
    if !args.json {
        print_header(&args, &settings, working_set, &backend, &machine);
    }
    let reports = run_all(&strategies, args.repeat, |kind, round| {
        let bar = progress_bar(&workload, kind, round, args.repeat, args.json);
        let mut settings = settings.clone();
        if kind == Kind::Pinpool {
            settings.trace = args.trace.as_ref().map(|path| match round {
                0 => path.clone(),
                n => {
                    let mut name = path.clone().into_os_string();
                    name.push(format!(".{}", n + 1));
                    name.into()
                }
            });
        }
        let result = run(kind, &workload, &settings, gpu.as_deref(), bar.as_ref());
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        result
    });
    let out = args.json.then(|| {
        serde_json::json!({
            "workload": workload,
            "settings": {
                "cleaner_threads": settings.cleaner_threads,
                "max_pooled_bytes": settings.max_pooled_bytes,
                "cap_factor": args.cap_factor,
                "working_set_bound_bytes": working_set,
                "size_classes": settings.size_classes.to_string(),
                "pinpool_conf": settings.conf,
                "repeat": args.repeat,
                "seed": args.seed,
                "strategies": strategies,
            },
            "machine": machine,
            "backend": backend,
            "results": reports,
        })
    });
    print_reports(out, &reports, &backend, "each prover's segments");
    if let Some(path) = &args.plot {
        let title = format!(
            "pinpool-sim sim: {} device(s) x {} prover(s), {} segments, scale {}, seed {}, pinpool cap {}",
            args.devices,
            args.provers_per_device,
            args.segments,
            args.scale,
            args.seed,
            settings
                .max_pooled_bytes
                .map_or("following the working set".to_string(), |b| human_bytes(b as u64))
        );
        plot(path, &title, &reports);
    }
}

/// The JSON `out` of a run if there is one, else the table of `reports`
/// (`steady` says what the steady figures come after the first quarter
/// of) and the legend.
fn print_reports(
    out: Option<serde_json::Value>,
    reports: &[Report],
    backend: &Backend,
    steady: &str,
) {
    match out {
        Some(out) => println!("{}", serde_json::to_string_pretty(&out).expect("serialize")),
        None => {
            print_table(reports, steady);
            print_legend(reports, backend);
        }
    }
}

/// Fails early (exit status 1) when the `--plot` file cannot be written.
fn check_plot(subcommand: &str, path: Option<&std::path::Path>) {
    if let Some(path) = path {
        if let Err(e) = std::fs::File::create(path) {
            eprintln!("pinpool-sim {subcommand}: --plot {}: {e}", path.display());
            std::process::exit(1);
        }
    }
}

/// Draws the first run of each report to `path`.
fn plot(path: &std::path::Path, title: &str, reports: &[Report]) {
    let runs: Vec<_> = reports
        .iter()
        .map(|r| (r.strategy.name(), &r.runs[0].series))
        .collect();
    if let Err(e) = pinpool_sim::plot::draw(path, title, &runs) {
        eprintln!("pinpool-sim: --plot {e}");
        std::process::exit(1);
    }
}

/// `replay`: the trace against each strategy, with its settings for
/// pinpool (under `--pinpool-conf`'s).
fn replay(args: ReplayArgs) {
    check_plot("replay", args.plot.as_deref());
    let Loaded {
        trace,
        gpu,
        replay,
        warnings,
        mut settings,
    } = load(
        "replay",
        &args.trace,
        args.host,
        args.speed,
        &args.pinpool_conf,
    );
    settings.emulate_pinning = args.emulate_pinning;
    let strategies = fit_prepared(
        "replay",
        usable("replay", &args.strategies, args.host, gpu.is_some()),
        &replay,
    );
    let backend = Backend::new(gpu.as_deref(), &replay, &settings);
    let machine = Machine::this();
    let peak_in_use = replay.peak_in_use_bytes();
    if !args.json {
        print_replay_header(&args, &trace.header, &replay, &settings, &backend, &machine);
    }
    let reports = run_all(&strategies, args.repeat, |kind, _| {
        pinpool_sim::replay::run(kind, &replay, &settings, gpu.as_deref(), args.speed)
    });
    let out = args.json.then(|| {
        serde_json::json!({
            "trace": {
                "path": args.trace,
                "header": trace.header.entries.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
                "threads": replay.threads.len(),
                "takes": replay.takes(),
                "never_dropped": replay.never_dropped(),
                "span_s": replay.span_ns as f64 / 1e9,
                "devices": replay.traced_devices,
                "lost_records": replay.lost,
                "unmatched_drops": replay.unmatched_drops,
                "complete": replay.complete,
                "peak_in_use_bytes": peak_in_use,
            },
            "settings": {
                "speed": args.speed,
                "pinpool_conf": settings.conf,
                "repeat": args.repeat,
                "strategies": strategies,
                "devices": replay.devices,
            },
            "warnings": warnings,
            "machine": machine,
            "backend": backend,
            "results": reports,
        })
    });
    print_reports(out, &reports, &backend, "the trace's time");
    if let Some(path) = &args.plot {
        let title = format!(
            "pinpool-sim replay {} at speed {}",
            args.trace.display(),
            args.speed
        );
        plot(path, &title, &reports);
    }
}

/// A trace ready to replay.
struct Loaded {
    trace: pinpool::trace::Trace,
    gpu: Option<Vec<Arc<CudaContext>>>,
    replay: Replay,
    warnings: Vec<String>,
    /// pinpool's settings: the trace's, then `--pinpool-conf`'s.
    settings: Settings,
}

/// The longest a replay may take, seconds (a year): a trace whose times
/// run longer at the speed asked is refused.
const MAX_REPLAY_S: f64 = 365.0 * 86400.0;

/// Reads the trace at `path` for `subcommand` and makes it ready to
/// replay on this machine's GPUs (none with `host`) at `speed`, with
/// pinpool's settings from the trace under `conf`; prints the warnings;
/// exits with status 1 and the path on a bad trace, or one that would
/// replay for longer than [`MAX_REPLAY_S`].
fn load(subcommand: &str, path: &std::path::Path, host: bool, speed: f64, conf: &str) -> Loaded {
    let fail = |message: String| -> ! {
        eprintln!("pinpool-sim {subcommand}: {}: {message}", path.display());
        std::process::exit(1)
    };
    // A trace cut short (its pool never closed, or the process died)
    // replays as far as it is good.
    let (trace, cut) =
        pinpool::trace::Trace::read_partial(path).unwrap_or_else(|e| fail(e.to_string()));
    let gpu = if host {
        None
    } else {
        pinpool_sim::gpu::detect()
    };
    let (replay, mut warnings) =
        Replay::new(&trace, gpu.as_ref().map(Vec::len)).unwrap_or_else(|e| fail(e));
    if let Some(e) = cut {
        warnings.insert(
            0,
            format!("{}: {e}: replaying the records before it", path.display()),
        );
    }
    for warning in &warnings {
        eprintln!("warning: {warning}");
    }
    if replay.takes() == 0 {
        fail("the trace has no takes to replay".to_string());
    }
    // Steady hit rates count the takes after the trace's first quarter of
    // time: with none there, they count nothing, and suggestions made by
    // them would be vacuous.
    if replay.steady_takes() == 0 {
        let message = "the trace has no take in its steady part (after its first quarter of \
                       time), which steady hits count";
        if subcommand == "suggest" {
            fail(format!("{message}: nothing to suggest from"));
        }
        eprintln!("warning: {message}: its steady figures count nothing");
    }
    // Every strategy holds at least what the trace's takes held at once
    // (pageable memory, or pinned): a trace recorded on a larger host is
    // refused here, not when a strategy runs out of memory mid-replay.
    if let Some(available) = pinpool_sim::machine::available_memory() {
        let peak = replay.peak_in_use_bytes();
        if peak > available {
            fail(format!(
                "its takes hold {:.1} GiB at once at their peak, and {:.1} GiB of memory are \
                 available here",
                peak as f64 / GIB,
                available as f64 / GIB
            ));
        }
    }
    let span = replay.span_ns as f64 / 1e9 / speed;
    if span > MAX_REPLAY_S {
        fail(format!(
            "its takes and drops span {:.0} s, {span:.3e} s at speed {speed}: more than a \
             replay may take ({MAX_REPLAY_S:.0} s)",
            replay.span_ns as f64 / 1e9
        ));
    }
    let conf = join_conf(&[&replay.conf, conf]);
    if let Err(e) = cli::parse_conf(&conf) {
        fail(format!(
            "its pinpool settings `{conf}` do not build a pool here: {e}"
        ));
    }
    let defaults = pinpool::Config::default();
    let settings = Settings {
        cleaner_threads: defaults.cleaner_threads,
        max_pooled_bytes: defaults.max_pooled_bytes,
        size_classes: defaults.size_classes,
        conf,
        trace: None,
        emulate_pinning: false,
    };
    Loaded {
        trace,
        gpu,
        replay,
        warnings,
        settings,
    }
}

/// `PINPOOL_CONF` pair lists joined, later ones overriding.
fn join_conf(confs: &[&str]) -> String {
    confs
        .iter()
        .filter(|c| !c.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(",")
}

/// `suggest`: the sweep of [`pinpool_sim::suggest`], as a table or JSON.
fn suggest(args: SuggestArgs) {
    let Loaded {
        gpu,
        replay,
        warnings,
        mut settings,
        ..
    } = load(
        "suggest",
        &args.trace,
        args.host,
        args.speed,
        &args.pinpool_conf,
    );
    settings.emulate_pinning = args.emulate_pinning;
    let peak_in_use = replay.peak_in_use_bytes();
    if !args.json {
        println!(
            "trace: {}, {} thread(s), {} takes over {:.2} s, peak in use {}",
            args.trace.display(),
            replay.threads.len(),
            replay.takes(),
            replay.span_ns as f64 / 1e9,
            human_bytes(peak_in_use)
        );
        println!(
            "target: {}% steady byte hits (after the first quarter of the trace's time); speed {}; backend {}",
            args.target * 100.0,
            args.speed,
            if gpu.is_some() { "cuda" } else { "host" }
        );
        println!(
            "\n{:<6} {:<8} {:>11} {:>8} {:>13} {:>13} {:>12} {:>8} {:>6}",
            "sizes",
            "regions",
            "cap",
            "x in use",
            "steady bytes",
            "steady count",
            "peak pinned",
            "pinned/",
            "regs"
        );
    }
    let (steps, best) =
        pinpool_sim::suggest::sweep(peak_in_use, args.target, &args.layouts, |step| {
            let settings = Settings {
                conf: join_conf(&[&settings.conf, step]),
                ..settings.clone()
            };
            let result = pinpool_sim::replay::run(
                Kind::Pinpool,
                &replay,
                &settings,
                gpu.as_deref(),
                args.speed,
            );
            if !args.json {
                let cap: u64 = step_value(step, "max_pooled_bytes").parse().unwrap_or(0);
                println!(
                    "{:<6} {:<8} {:>11} {:>8.2} {:>12.3}% {:>12.3}% {:>12} {:>8.3} {:>6}{}",
                    step_value(step, "size_classes"),
                    step_value(step, "regions"),
                    human_bytes(cap),
                    cap as f64 / peak_in_use.max(1) as f64,
                    result.steady_hit_rate_bytes * 100.0,
                    result.steady_hit_rate * 100.0,
                    human_bytes(result.peak_pinned_bytes),
                    result.pinned_per_in_use,
                    result.registrations,
                    if result.steady_hit_rate_bytes >= args.target {
                        "  reached"
                    } else {
                        ""
                    }
                );
            }
            result
        });
    let suggestion = best.map(|i| &steps[i]);
    if !args.json && gpu.is_none() && !settings.emulate_pinning {
        println!("(host backend: nothing is page-locked, so peak pinned reads 0 and the smallest cap wins; --emulate-pinning counts what pinpool would pin)");
    }
    if args.json {
        let out = serde_json::json!({
            "trace": args.trace,
            "peak_in_use_bytes": peak_in_use,
            "target": args.target,
            "speed": args.speed,
            "base_conf": settings.conf,
            "warnings": warnings,
            "steps": steps,
            "suggestion": suggestion,
        });
        println!("{}", serde_json::to_string_pretty(&out).expect("serialize"));
        return;
    }
    println!();
    match suggestion {
        Some(step) => println!(
            "suggested: PINPOOL_CONF={} (steady byte hits {:.3}%, peak pinned {})",
            with_given(&step.conf, &args.pinpool_conf),
            step.steady_hit_rate_bytes * 100.0,
            human_bytes(step.peak_pinned_bytes)
        ),
        None => {
            let closest = steps
                .iter()
                .max_by(|a, b| a.steady_hit_rate_bytes.total_cmp(&b.steady_hit_rate_bytes))
                .expect("the sweep has steps");
            println!(
                "no setting tried reached {}% steady byte hits; the closest: PINPOOL_CONF={} ({:.3}%)",
                args.target * 100.0,
                with_given(&closest.conf, &args.pinpool_conf),
                closest.steady_hit_rate_bytes * 100.0
            );
        }
    }
}

/// A step's pairs, then those of `given` (`--pinpool-conf`, which the
/// step ran with) whose keys the step does not set: the line to use.
fn with_given(step: &str, given: &str) -> String {
    // Keys as the pool reads them: trimmed.
    let extra: Vec<&str> = given
        .split(',')
        .map(str::trim)
        .filter(|pair| {
            pair.split_once('=')
                .is_some_and(|(key, _)| step_value(step, key.trim()).is_empty())
        })
        .collect();
    join_conf(&[step, &extra.join(",")])
}

/// The value of `key` in the pairs `conf`.
fn step_value<'a>(conf: &'a str, key: &str) -> &'a str {
    conf.split(',')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == key)
        .map_or("", |(_, v)| v)
}

fn print_replay_header(
    args: &ReplayArgs,
    header: &pinpool::trace::Header,
    replay: &Replay,
    settings: &Settings,
    backend: &Backend,
    machine: &Machine,
) {
    print_backend(backend, machine);
    let at = |key| header.get(key).unwrap_or("?");
    println!(
        "trace: {}, from {} ({} cores, {} backend, {} device(s)), {} thread(s), {} takes ({} never dropped) over {:.2} s{}",
        args.trace.display(),
        at("host"),
        at("cores"),
        at("backend"),
        replay.traced_devices,
        replay.threads.len(),
        replay.takes(),
        replay.never_dropped(),
        replay.span_ns as f64 / 1e9,
        if replay.lost > 0 {
            format!(", {} records lost", replay.lost)
        } else {
            String::new()
        }
    );
    println!(
        "replay: speed {}, {} run(s) of each strategy; the trace's peak in use {}",
        args.speed,
        args.repeat,
        human_bytes(replay.peak_in_use_bytes())
    );
    println!("pinpool: {}", settings.conf);
}

/// What the run stages with.
#[derive(serde::Serialize)]
struct Backend {
    /// `cuda` or `host`.
    kind: &'static str,
    /// The names of the GPUs in use.
    gpus: Vec<String>,
    /// GPUs present, used or not (0 with `--host`).
    gpus_present: usize,
    /// What pinpool's `Pool::backend()` reports with the run's settings.
    pinpool: String,
}

impl Backend {
    /// Describes the backend of `gpu` (host without), building a pinpool
    /// pool with `settings` to ask it; exits if that pool cannot be built.
    fn new(gpu: Option<&[Arc<CudaContext>]>, demand: &dyn Demand, settings: &Settings) -> Self {
        let pool = match pinpool_sim::strategy::pinpool(demand, settings, gpu) {
            Ok(pool) => pool,
            Err(e) => {
                eprintln!("error: cannot build a pinpool pool with these settings: {e}");
                std::process::exit(1);
            }
        };
        let mut pinpool = pool.backend().to_string();
        if settings.emulate_pinning && gpu.is_none() {
            pinpool.push_str(", pinning emulated");
        }
        pool.shutdown();
        let gpus = gpu.map_or_else(Vec::new, |g| {
            g[..demand.devices()]
                .iter()
                .map(|ctx| {
                    ctx.name()
                        .unwrap_or_else(|e| format!("(name unknown: {e})"))
                })
                .collect()
        });
        Self {
            kind: if gpu.is_some() { "cuda" } else { "host" },
            gpus,
            gpus_present: gpu.map_or(0, <[_]>::len),
            pinpool,
        }
    }
}

/// The strategies of `--strategies` that can run, with a note for those
/// left out; a usage error of `subcommand` if none can.
fn usable(subcommand: &str, strategies: &[Kind], host: bool, gpu: bool) -> Vec<Kind> {
    let (strategies, need_gpu): (Vec<Kind>, Vec<Kind>) =
        strategies.iter().partition(|k| gpu || !k.needs_gpu());
    if !need_gpu.is_empty() {
        let names: Vec<_> = need_gpu.iter().map(|k| k.name()).collect();
        let names = names.join(", ");
        let why = if host {
            "--host was given"
        } else {
            "no GPU was found"
        };
        let needs = if need_gpu.len() == 1 { "needs" } else { "need" };
        if strategies.is_empty() {
            subcommand_error(
                subcommand,
                format_args!("--strategies: {names} {needs} a GPU, and {why}"),
            );
        }
        eprintln!("note: skipping {names} ({needs} a GPU; {why})");
    }
    strategies
}

/// Leaves out the strategies that prepare every buffer before the run
/// (ideal and limit), with a note, when those buffers would not fit in the
/// memory available now (each such strategy holds them alone: strategies
/// run one at a time); a usage error if nothing is left.
fn fit_prepared(subcommand: &str, mut strategies: Vec<Kind>, demand: &dyn Demand) -> Vec<Kind> {
    if !strategies.iter().any(|k| k.prepares_everything()) {
        return strategies;
    }
    let (Some(available), needed) = (
        pinpool_sim::machine::available_memory(),
        IdealPool::bytes_needed(demand),
    ) else {
        return strategies;
    };
    if needed <= available {
        return strategies;
    }
    let left_out: Vec<_> = strategies
        .iter()
        .filter(|k| k.prepares_everything())
        .map(|k| k.name())
        .collect();
    let names = left_out.join(", ");
    let (their, need) = if left_out.len() == 1 {
        ("its", "needs")
    } else {
        ("their", "each need")
    };
    let why = format!(
        "{their} buffers {need} {:.1} GiB and {:.1} GiB of memory are available",
        needed as f64 / GIB,
        available as f64 / GIB
    );
    strategies.retain(|k| !k.prepares_everything());
    if strategies.is_empty() {
        subcommand_error(
            subcommand,
            format_args!("--strategies: {names} cannot run: {why}"),
        );
    }
    eprintln!("note: skipping {names} ({why})");
    strategies
}

/// Runs every strategy `repeat` times through `run` (given the strategy
/// and the round), in rounds of every strategy in turn, so that drift over
/// time (page cache, clocks) spreads over all of them alike.
fn run_all(
    strategies: &[Kind],
    repeat: u32,
    mut run: impl FnMut(Kind, u32) -> RunResult,
) -> Vec<Report> {
    let mut runs: Vec<Vec<RunResult>> = vec![Vec::new(); strategies.len()];
    for round in 0..repeat {
        for (kind, runs) in strategies.iter().zip(&mut runs) {
            runs.push(run(*kind, round));
        }
    }
    strategies
        .iter()
        .zip(runs)
        .map(|(kind, runs)| Report::new(*kind, runs))
        .collect()
}

fn print_header(
    args: &SimArgs,
    settings: &Settings,
    working_set: u64,
    backend: &Backend,
    machine: &Machine,
) {
    print_backend(backend, machine);
    println!(
        "workload: {} device(s) x {} prover(s), {} segments each, {} arenas + {} staging buffers, scale {}, seed {}",
        args.devices, args.provers_per_device, args.segments, args.arenas, args.staging, args.scale, args.seed
    );
    println!(
        "working-set bound: {} (every prover at its largest segment at once)",
        human_bytes(working_set)
    );
    let cap = match args.cap_factor {
        Some(factor) => format!(
            "cap {} (--cap-factor {factor} x the working-set bound)",
            human_bytes(settings.max_pooled_bytes.unwrap_or(0) as u64)
        ),
        None => match settings.max_pooled_bytes {
            Some(cap) => format!("cap {} GiB", cap as f64 / GIB),
            None => "the cap following the working set (pinpool's default)".to_string(),
        },
    };
    println!(
        "pinpool: {} cleaner threads, {cap}, {} size classes; {} run(s) of each strategy",
        args.cleaner_threads,
        SizeClasses::from(args.size_classes),
        args.repeat
    );
}

/// The backend and machine lines of a table's header.
fn print_backend(backend: &Backend, machine: &Machine) {
    match backend.gpus.first() {
        Some(name) => println!(
            "backend: CUDA, {} of {} GPU(s), {name} (pinpool: {})",
            backend.gpus.len(),
            backend.gpus_present,
            backend.pinpool
        ),
        None => println!(
            "backend: host, no GPU in use (pinpool: {})",
            backend.pinpool
        ),
    }
    let memory = machine
        .total_memory_bytes
        .map_or_else(String::new, |b| format!(", {:.1} GiB", b as f64 / GIB));
    println!(
        "machine: {}, {} CPUs{memory}",
        machine.hostname.as_deref().unwrap_or("(no hostname)"),
        machine.cpus
    );
}

/// `bytes` in GiB from 1 GiB up, else in MiB.
fn human_bytes(bytes: u64) -> String {
    let bytes = bytes as f64;
    if bytes >= GIB {
        format!("{:.2} GiB", bytes / GIB)
    } else {
        format!("{:.1} MiB", bytes / (1u64 << 20) as f64)
    }
}

fn progress_bar(
    workload: &Workload,
    kind: Kind,
    round: u32,
    repeat: u32,
    json: bool,
) -> Option<ProgressBar> {
    if json || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new((workload.provers() * workload.segments) as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg:>16} [{bar:40}] {pos}/{len} segments")
            .expect("template"),
    );
    if repeat > 1 {
        bar.set_message(format!("{} {}/{repeat}", kind.name(), round + 1));
    } else {
        bar.set_message(kind.name());
    }
    Some(bar)
}

/// The table of `reports`; `steady` says what the steady figures come
/// after the first quarter of.
fn print_table(reports: &[Report], steady: &str) {
    let label_width = FIGURES.iter().map(|f| f.label.len()).max().unwrap_or(0) + 2;
    let cells: Vec<Vec<String>> = reports
        .iter()
        .map(|r| FIGURES.iter().map(|f| r.cell(f)).collect())
        .collect();
    let warning = |r: &Report| r.strategy.warning().map(|w| format!("({w})"));
    let widths: Vec<usize> = reports
        .iter()
        .zip(&cells)
        .map(|(r, cells)| {
            cells
                .iter()
                .map(String::len)
                .chain([r.strategy.name().len()])
                .chain(warning(r).map(|w| w.len()))
                .max()
                .unwrap_or(0)
                + 2
        })
        .collect();
    print!("\n{:<label_width$}", "");
    for (r, width) in reports.iter().zip(&widths) {
        print!("{:>width$}", r.strategy.name());
    }
    println!();
    // Under a strategy's name, what it must not be taken for.
    if reports.iter().any(|r| r.strategy.warning().is_some()) {
        print!("{:<label_width$}", "");
        for (r, width) in reports.iter().zip(&widths) {
            print!("{:>width$}", warning(r).unwrap_or_default());
        }
        println!();
    }
    for (row, figure) in FIGURES.iter().enumerate() {
        // A figure no strategy has here (segments/s in a replay, lateness
        // outside one) is left out.
        if cells.iter().all(|cells| cells[row] == "-") {
            continue;
        }
        print!("{:<label_width$}", figure.label);
        for (cells, width) in cells.iter().zip(&widths) {
            print!("{:>width$}", cells[row]);
        }
        println!();
    }
    println!();
    if let Some(runs) = reports.first().map(|r| r.runs.len()).filter(|&n| n > 1) {
        println!("(each figure: median (min-max) of {runs} runs on the same draws)");
    }
    println!("(steady = after the first quarter of {steady}; pinpool's drop-to-ready figures are power-of-two bucket edges)");
}

fn print_legend(reports: &[Report], backend: &Backend) {
    println!();
    let width = reports
        .iter()
        .map(|r| r.strategy.name().len())
        .max()
        .unwrap_or(0);
    for r in reports {
        println!("{:<width$}  {}", r.strategy.name(), r.legend);
    }
    if backend.kind == "host" {
        let pinned = if backend.pinpool.ends_with("pinning emulated") {
            "nothing is page-locked (pinpool's pinned bytes and registrations are what it would \
             pin: its backend pins in name only)"
        } else {
            "nothing is page-locked"
        };
        println!(
            "\nhost backend: the staging figures say nothing about pinned copies: copies are \
             memcpys into a host buffer standing in for the device, and {pinned}"
        );
    }
}
