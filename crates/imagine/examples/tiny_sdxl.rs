//! Writes the tiny SDXL-shaped test model: `cargo run -p hearth-imagine --example tiny_sdxl -- DIR [SEED]`.
//! (`hearth dev tiny-sdxl DIR` does the same from the main binary.)

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next().map(PathBuf::from) else {
        eprintln!("usage: tiny_sdxl DIR [SEED]");
        return ExitCode::from(2);
    };
    let seed = match args.next().map(|s| s.parse::<u64>()) {
        None => hearth_imagine::tiny::TINY_SEED,
        Some(Ok(s)) => s,
        Some(Err(e)) => {
            eprintln!("bad seed: {e}");
            return ExitCode::from(2);
        }
    };
    match hearth_imagine::write_tiny_sdxl(&dir, seed) {
        Ok(()) => {
            println!("wrote tiny SDXL model (seed {seed}) to {}", dir.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
