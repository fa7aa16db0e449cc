//! Any trace the reader accepts made ready to replay: a plan or an error,
//! never a panic, with every drop after its take.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinpool::trace::Trace;
use pinpool_sim::demand::Demand;
use pinpool_sim::replay::{Event, Replay};

fuzz_target!(|data: &[u8]| {
    let Ok((trace, _)) = Trace::from_reader_partial(data) else {
        return;
    };
    for present in [None, Some(1), Some(3)] {
        let Ok((replay, _)) = Replay::new(&trace, present) else {
            continue;
        };
        let _ = replay.peak_in_use_bytes();
        for thread in 0..replay.threads.len() {
            let _ = replay.peak_holdings(thread, &|size| size);
            assert!(replay.device_of(thread) < replay.devices);
            for event in &replay.threads[thread] {
                if let Event::Drop { id, .. } = *event {
                    let taken = replay.buffers[id];
                    assert!(taken.to.is_some_and(|to| to > taken.from));
                }
            }
        }
    }
});
