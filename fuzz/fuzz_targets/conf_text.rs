//! Any text as `PINPOOL_CONF` pairs: the strict parse is an error or a
//! builder, the lenient one a builder, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = pinpool::Pool::builder().try_conf(text);
    let _ = pinpool::Pool::builder().conf(text);
});
