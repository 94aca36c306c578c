//! The XML tree builder (entity handling, depth flattening) must never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = hearth_markdown::fuzzing::xml(data);
});
