//! The hand-written RTF reader must never panic, whatever the bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = hearth_markdown::fuzzing::rtf(data);
});
