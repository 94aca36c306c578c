//! Records, at build time, the version of axum this build links (the markdown service's health
//! check reports it): read once from the workspace's resolved dependency graph, so the binary
//! carries a constant and parses nothing at run time.
fn main() {
    let lock = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock.display());
    let text = std::fs::read_to_string(&lock).unwrap_or_default();
    let version = text
        .split("[[package]]")
        .find(|p| p.lines().any(|l| l.trim() == "name = \"axum\""))
        .and_then(|p| {
            p.lines()
                .find_map(|l| l.trim().strip_prefix("version = \""))
                .map(|v| v.trim_end_matches('"').to_string())
        })
        .unwrap_or_else(|| "0.8".into());
    println!("cargo:rustc-env=HEARTH_AXUM_VERSION={version}");
}
