fn main() -> std::process::ExitCode {
    hearth_server::cli::main()
}
