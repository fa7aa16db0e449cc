//! pinpool's benchmarks: `cargo bench -p pinpool-benches --bench <name>`,
//! with `hot_path`, `cleaner`, `first_pin` and `staging`. Each compares
//! pinpool side by side with its baselines in one run; BENCHMARKS.md has the
//! figures, their commands, machines and commits.
