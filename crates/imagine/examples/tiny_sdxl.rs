//! Writes the tiny SDXL-shaped test model:
//! `cargo run -p hearth-imagine --example tiny_sdxl -- [--inpainting] DIR [SEED]`
//! (`hearth dev tiny-sdxl DIR` does the same from the main binary); `--inpainting` gives it a
//! 9-channel inpainting UNet.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1).peekable();
    let inpainting = args.next_if(|a| a == "--inpainting").is_some();
    let Some(dir) = args.next().map(PathBuf::from) else {
        eprintln!("usage: tiny_sdxl [--inpainting] DIR [SEED]");
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
    let write = if inpainting {
        hearth_imagine::tiny::write_tiny_sdxl_inpainting
    } else {
        hearth_imagine::write_tiny_sdxl
    };
    match write(&dir, seed) {
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
