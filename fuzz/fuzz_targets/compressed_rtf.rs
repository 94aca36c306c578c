//! The MS-OXRTFCP decompressor (`.msg` bodies) must never panic or over-allocate.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = hearth_markdown::fuzzing::compressed_rtf(data);
});
