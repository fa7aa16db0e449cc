//! The `pinpool-sim sim` proving-workload simulator: the workload, the
//! strategies it compares (pinpool, an ideal upper bound, the workload's
//! speed limit, wrong on purpose, the seed design, pageable staging,
//! `cuMemHostAlloc`), and the measurements.

pub mod demand;
pub mod gpu;
pub mod ideal;
pub mod limit;
pub mod machine;
pub mod plot;
pub mod replay;
pub mod report;
pub mod run;
pub mod seed;
pub mod strategy;
pub mod suggest;
pub mod workload;
