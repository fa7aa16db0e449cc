//! What a run asks of the strategies, whichever drives it: the simulated
//! workload ([`crate::workload::Workload`]) or a recorded trace
//! ([`crate::replay::Replay`]).

use std::collections::HashMap;

/// The shape of a run's demand: its devices and takers, and what each
/// taker holds at most (what the strategies that prepare every buffer
/// before the run, ideal and limit, prepare).
pub trait Demand: Sync {
    /// Devices the run uses.
    fn devices(&self) -> usize;

    /// Taking threads (provers, or a trace's threads).
    fn provers(&self) -> usize;

    /// The device taker `prover` prepares its buffers on.
    fn device_of(&self, prover: usize) -> usize;

    /// For each buffer length (`length` of the sizes asked), the most
    /// buffers of that length taker `prover` holds at once.
    fn peak_holdings(
        &self,
        prover: usize,
        length: &dyn Fn(usize) -> usize,
    ) -> HashMap<usize, usize>;
}
