#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // `hearth convert-worker`: a document conversion worker the markdown service starts and
    // talks to over its stdin and stdout (hearth-isolate). Not a user command: it is dispatched
    // before the CLI so that nothing else (no runtime, no logging setup) runs in the worker.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "convert-worker")
    {
        return hearth_isolate::worker_main();
    }
    hearth_server::cli::main()
}
