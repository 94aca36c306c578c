//! The html converter must return Ok or a typed error for any input, within its limits: no
//! stack overflow, no runaway allocation, no hang.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = hearth_markdown::fuzzing::html(data);
});
