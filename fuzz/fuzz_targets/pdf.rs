//! The pdf converter must return Ok or a typed error for any input, within its limits: no
//! stack overflow, no runaway allocation, no hang.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The converter catches the panics of the PDF crates it runs (they answer as errors), but
    // libFuzzer's panic hook aborts before any `catch_unwind` sees them: keep the default hook,
    // silenced. A panic that escapes the converter still aborts (libfuzzer-sys's own check).
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| std::panic::set_hook(Box::new(|_| {})));
    let _ = hearth_markdown::fuzzing::pdf(data);
});
