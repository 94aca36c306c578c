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
    // A model unloaded by its engine thread leaves that thread's freed pages with mimalloc,
    // which keeps them until the thread's segments are reclaimed: collect them at once, so an
    // unload gives its memory back to the system (docs/loading.md).
    hearth_server::models::on_unload_release(release_freed_memory);
    hearth_server::cli::main()
}

/// mimalloc's collection of every freed page, abandoned threads' included.
#[allow(unsafe_code)]
fn release_freed_memory() {
    // SAFETY: `mi_collect` takes no pointer and may be called from any thread at any time.
    unsafe { libmimalloc_sys::mi_collect(true) }
}
