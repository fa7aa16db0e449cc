//! The proving workload: segments of record arenas and staging buffers with
//! sizes drawn from a real block's profile.

use std::collections::HashMap;
use std::time::Duration;

use crate::demand::Demand;

/// The largest buffer in the profile: 2 GiB.
pub const LARGEST_SIZE: f64 = 2048.0 * 1048576.0;

/// The largest `scale` a workload may have: the profile's largest buffer
/// then reaches pinpool's [`MAX_CLASS_SIZE`](pinpool::MAX_CLASS_SIZE)
/// (1 TiB), so no size overflows or exceeds what a pool hands out.
pub const MAX_SCALE: f64 = pinpool::MAX_CLASS_SIZE as f64 / LARGEST_SIZE;

/// Quantiles of buffer sizes from a real block's profile (bytes); sizes
/// between two quantiles are drawn log-uniformly.
const SIZE_QUANTILES: [(f64, f64); 8] = [
    (0.00, 4096.0),
    (0.10, 128.0 * 1024.0),
    (0.25, 2.0 * 1048576.0),
    (0.50, 8.0 * 1048576.0),
    (0.75, 64.0 * 1048576.0),
    (0.90, 512.0 * 1048576.0),
    (0.99, 1024.0 * 1048576.0),
    (1.00, LARGEST_SIZE),
];

/// SplitMix64: small, fast, and reproducible from a seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[lo, hi)`.
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
}

/// The shape of a run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Workload {
    /// Devices (GPUs, or simulated shards on the host).
    pub devices: usize,
    /// Prover threads per device.
    pub provers_per_device: usize,
    /// Segments each prover proves.
    pub segments: usize,
    /// Record arenas per segment.
    pub arenas: usize,
    /// Staging buffers per segment.
    pub staging: usize,
    /// Factor applied to every size and CPU gap, in `(0, MAX_SCALE]`.
    pub scale: f64,
    /// CPU work between segments before scaling, in milliseconds.
    pub gap_ms: (f64, f64),
    /// Seed of the size, fraction and gap draws.
    pub seed: u64,
}

/// One buffer of a segment.
#[derive(Debug, Clone, Copy)]
pub struct BufferPlan {
    /// Bytes asked of `take`.
    pub size: usize,
    /// Bytes written (and copied).
    pub written: usize,
}

/// One segment of one prover.
#[derive(Debug, Clone)]
pub struct SegmentPlan {
    /// The buffers, arenas first.
    pub buffers: Vec<BufferPlan>,
    /// CPU work after the segment.
    pub gap: Duration,
}

impl Workload {
    /// Prover threads in all.
    pub fn provers(&self) -> usize {
        self.devices * self.provers_per_device
    }

    /// The segments of prover `prover`: the same for every strategy.
    pub fn plan(&self, prover: usize) -> Vec<SegmentPlan> {
        let mut rng = Rng::new(self.seed ^ (prover as u64).wrapping_mul(0xA076_1D64_78BD_642F));
        (0..self.segments)
            .map(|_| {
                let buffers = (0..self.arenas + self.staging)
                    .map(|i| {
                        let size = ((sample_size(&mut rng) * self.scale) as usize).max(1);
                        let fraction = if i < self.arenas {
                            rng.range(0.05, 0.60)
                        } else {
                            rng.range(0.50, 1.0)
                        };
                        let written = ((size as f64 * fraction) as usize).clamp(1, size);
                        BufferPlan { size, written }
                    })
                    .collect();
                let gap = rng.range(self.gap_ms.0, self.gap_ms.1) * self.scale;
                SegmentPlan {
                    buffers,
                    gap: Duration::from_secs_f64(gap / 1e3),
                }
            })
            .collect()
    }

    /// The largest size any prover asks for, rounded up to its class.
    pub fn max_size(&self) -> usize {
        (0..self.provers())
            .flat_map(|p| self.plan(p))
            .flat_map(|s| s.buffers)
            .map(|b| b.size.next_power_of_two())
            .max()
            .unwrap_or(1)
    }

    /// The working-set bound of the run's plans: every prover at its
    /// largest segment at once ([`working_set_bound`] of every prover's
    /// plan).
    pub fn working_set_bound(&self) -> u64 {
        let plans: Vec<_> = (0..self.provers()).map(|p| self.plan(p)).collect();
        working_set_bound(&plans)
    }

    /// For each length `length` maps the sizes prover `prover` asks for
    /// to, the most buffers of that length it holds at once. A prover takes
    /// all of a segment's buffers before it gives any back, so that is the
    /// most of any one segment.
    pub fn peak_holdings(
        &self,
        prover: usize,
        length: impl Fn(usize) -> usize,
    ) -> HashMap<usize, usize> {
        let mut peak = HashMap::new();
        for segment in self.plan(prover) {
            let mut held: HashMap<usize, usize> = HashMap::new();
            for buffer in &segment.buffers {
                *held.entry(length(buffer.size)).or_default() += 1;
            }
            for (size, count) in held {
                let most = peak.entry(size).or_default();
                *most = count.max(*most);
            }
        }
        peak
    }
}

impl Demand for Workload {
    fn devices(&self) -> usize {
        self.devices
    }

    fn provers(&self) -> usize {
        Workload::provers(self)
    }

    fn device_of(&self, prover: usize) -> usize {
        prover % self.devices
    }

    fn peak_holdings(
        &self,
        prover: usize,
        length: &dyn Fn(usize) -> usize,
    ) -> HashMap<usize, usize> {
        Workload::peak_holdings(self, prover, length)
    }
}

/// The working-set bound of `plans` (one per prover): the sum over provers
/// of the bytes asked for by each prover's largest segment, all its buffers
/// together. A prover takes all of a segment's buffers before it gives any
/// back, so this is what the workload holds with every prover at its
/// largest segment at once.
pub fn working_set_bound(plans: &[Vec<SegmentPlan>]) -> u64 {
    plans
        .iter()
        .map(|segments| {
            segments
                .iter()
                .map(|s| s.buffers.iter().map(|b| b.size as u64).sum::<u64>())
                .max()
                .unwrap_or(0)
        })
        .sum()
}

/// A size in bytes from the profile.
fn sample_size(rng: &mut Rng) -> f64 {
    let u = rng.unit();
    let i = SIZE_QUANTILES
        .windows(2)
        .position(|w| u < w[1].0)
        .unwrap_or(SIZE_QUANTILES.len() - 2);
    let ((q0, s0), (q1, s1)) = (SIZE_QUANTILES[i], SIZE_QUANTILES[i + 1]);
    let t = (u - q0) / (q1 - q0);
    (s0.ln() + t * (s1.ln() - s0.ln()))
        .exp()
        .clamp(SIZE_QUANTILES[0].1, LARGEST_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_the_profile() {
        let mut rng = Rng::new(7);
        let mut sizes: Vec<f64> = (0..100_000).map(|_| sample_size(&mut rng)).collect();
        sizes.sort_by(f64::total_cmp);
        let at = |q: f64| sizes[(q * sizes.len() as f64) as usize];
        assert!(
            (at(0.5) / (8.0 * 1048576.0) - 1.0).abs() < 0.1,
            "median {}",
            at(0.5)
        );
        assert!(
            (at(0.9) / (512.0 * 1048576.0) - 1.0).abs() < 0.15,
            "p90 {}",
            at(0.9)
        );
        assert!(sizes.last().copied().unwrap() <= 2048.0 * 1048576.0);
    }

    #[test]
    fn plans_are_reproducible() {
        let w = Workload {
            devices: 1,
            provers_per_device: 2,
            segments: 3,
            arenas: 16,
            staging: 2,
            scale: 1.0 / 64.0,
            gap_ms: (50.0, 300.0),
            seed: 1,
        };
        let a: Vec<usize> = w
            .plan(1)
            .iter()
            .flat_map(|s| s.buffers.iter().map(|b| b.size))
            .collect();
        let b: Vec<usize> = w
            .plan(1)
            .iter()
            .flat_map(|s| s.buffers.iter().map(|b| b.size))
            .collect();
        assert_eq!(a, b);
        assert_eq!(a.len(), 3 * 18);
    }

    #[test]
    fn the_largest_scale_stays_within_the_largest_class() {
        let w = Workload {
            devices: 1,
            provers_per_device: 1,
            segments: 200,
            arenas: 16,
            staging: 2,
            scale: MAX_SCALE,
            gap_ms: (50.0, 300.0),
            seed: 3,
        };
        assert!(w.max_size() <= pinpool::MAX_CLASS_SIZE);
    }

    #[test]
    fn the_working_set_bound_adds_each_provers_largest_segment() {
        let segment = |sizes: &[usize]| SegmentPlan {
            buffers: sizes
                .iter()
                .map(|&size| BufferPlan { size, written: 1 })
                .collect(),
            gap: Duration::ZERO,
        };
        // Prover 0's segments ask for 30 and 5 bytes, prover 1's for 7
        // and 17, prover 2 has none: 30 + 17 + 0.
        let plans = vec![
            vec![segment(&[10, 20]), segment(&[5])],
            vec![segment(&[7]), segment(&[8, 9])],
            vec![],
        ];
        assert_eq!(working_set_bound(&plans), 47);

        // With sizes of one byte, every segment holds its buffer count.
        let w = Workload {
            devices: 2,
            provers_per_device: 3,
            segments: 4,
            arenas: 5,
            staging: 2,
            scale: 1e-12,
            gap_ms: (0.0, 0.0),
            seed: 9,
        };
        assert_eq!(w.working_set_bound(), 2 * 3 * (5 + 2));
    }

    #[test]
    fn peak_holdings_cover_every_segment() {
        let w = Workload {
            devices: 1,
            provers_per_device: 1,
            segments: 5,
            arenas: 16,
            staging: 2,
            // Sizes of one byte: every buffer has the same size.
            scale: 1e-12,
            gap_ms: (50.0, 300.0),
            seed: 1,
        };
        assert_eq!(w.peak_holdings(0, |size| size), HashMap::from([(1, 18)]));
        let w = Workload {
            scale: 1.0 / 64.0,
            ..w
        };
        let peak = w.peak_holdings(0, |size| size);
        for segment in w.plan(0) {
            for buffer in &segment.buffers {
                let held = segment
                    .buffers
                    .iter()
                    .filter(|b| b.size == buffer.size)
                    .count();
                assert!(peak[&buffer.size] >= held);
            }
        }
    }
}
