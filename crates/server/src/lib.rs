//! The hearth binary's library: CLI, configuration, axum routers for the four services, web pages.
//! The only crate that knows HTTP and JSON wire shapes.

pub mod cli {
    /// Entry point of the `hearth` binary.
    pub fn main() -> std::process::ExitCode {
        std::process::ExitCode::SUCCESS
    }
}
