//! Any bytes read as a trace: an error with its offset or a trace, never a
//! panic; a trace read whole writes back the same bytes, and reading it
//! partially gives the same records.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinpool::trace::{Reader, Trace};

fuzz_target!(|data: &[u8]| {
    let whole = Trace::from_reader(data);
    let partial = Trace::from_reader_partial(data);
    match (&whole, &partial) {
        (Ok(trace), Ok((part, None))) => {
            assert_eq!(trace, part);
            assert_eq!(trace.to_bytes(), data);
        }
        (Err(e), Ok((part, Some(cut)))) => {
            assert_eq!(e.offset, cut.offset);
            assert!(part.records.len() as u64 * 48 <= data.len() as u64);
        }
        (Err(e), Err(header)) => assert_eq!(e.offset, header.offset),
        other => panic!("whole and partial reads disagree: {other:?}"),
    }
    // The streaming reader stops at the first error.
    if let Ok(reader) = Reader::new(data) {
        let mut failed = false;
        for record in reader {
            assert!(!failed, "a record after an error");
            if let Ok(record) = record {
                let _ = record.to_string();
            } else {
                failed = true;
            }
        }
    }
});
