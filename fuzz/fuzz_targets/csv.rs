//! Delimiter sniffing, charset detection and the table writer must never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = hearth_markdown::fuzzing::csv(data);
});
