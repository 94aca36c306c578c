//! The whole pipeline (detection, every converter, panic containment) must return Ok or a typed
//! error for any input: a crash here is a crash of the service.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let converter = hearth_markdown::Converter::default();
    let _ = converter.convert(data.to_vec(), None);
});
