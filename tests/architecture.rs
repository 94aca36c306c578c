//! ARCHITECTURE.md's structural claims, checked as an engineer would check them: by reading the
//! crate manifests and the sources. The crate map's arrows are read from ARCHITECTURE.md itself,
//! so the drawing and the manifests cannot drift apart.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `hearth-*` crates (and other packages) a manifest's `[dependencies]` names, without the
/// `hearth-` prefix; dev-dependencies do not count (tests may use anything).
fn dependencies(manifest: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(manifest).unwrap();
    let doc: toml::Table = toml::from_str(&text).unwrap();
    doc.get("dependencies")
        .and_then(|d| d.as_table())
        .map(|d| {
            d.keys()
                .map(|k| k.strip_prefix("hearth-").unwrap_or(k).to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Every package of the workspace: its short name (`server`, or `hearth` for the binary) and
/// its manifest.
fn packages() -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::from([("hearth".to_string(), root().join("Cargo.toml"))]);
    for entry in std::fs::read_dir(root().join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        let manifest = dir.join("Cargo.toml");
        if manifest.exists() {
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            out.insert(name, manifest);
        }
    }
    out
}

/// The crate map as ARCHITECTURE.md draws it: `a ──> b, c` and `d, e: no Hearth crate`.
fn drawn_map() -> BTreeMap<String, BTreeSet<String>> {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let section = doc
        .split("## Crate map")
        .nth(1)
        .expect("ARCHITECTURE.md has a Crate map section");
    let drawing = section
        .split("```")
        .nth(1)
        .expect("the map is drawn in a fenced block");
    let names = |list: &str| -> BTreeSet<String> {
        list.split(',')
            .map(|n| n.split_whitespace().next().unwrap_or("").to_string())
            .filter(|n| !n.is_empty())
            .collect()
    };
    let mut map = BTreeMap::new();
    for line in drawing.lines().filter(|l| !l.trim().is_empty()) {
        if let Some((from, to)) = line.split_once("──>") {
            let from = from.split_whitespace().next().unwrap().to_string();
            let to = to.split("  ").next().unwrap();
            map.insert(from, names(to));
        } else if let Some(leaves) = line.strip_suffix(": no Hearth crate") {
            for leaf in names(leaves) {
                map.insert(leaf, BTreeSet::new());
            }
        } else if !line.trim().is_empty() {
            panic!("a line of the crate map this test cannot read: {line:?}");
        }
    }
    map
}

#[test]
fn every_crate_depends_on_exactly_the_crates_the_map_draws() {
    let drawn = drawn_map();
    let packages = packages();
    assert_eq!(
        drawn.keys().collect::<Vec<_>>(),
        packages.keys().collect::<Vec<_>>(),
        "the map draws every package of the workspace, and only those"
    );
    for (name, manifest) in &packages {
        let hearth: BTreeSet<String> = dependencies(manifest)
            .into_iter()
            .filter(|d| packages.contains_key(d))
            .collect();
        assert_eq!(&hearth, &drawn[name], "{name}'s Hearth dependencies");
    }
}

#[test]
fn only_the_store_imports_sled_or_sqlx_and_only_the_server_serves_http() {
    for (name, manifest) in packages() {
        let deps = dependencies(&manifest);
        if name != "store" {
            assert!(
                !deps.contains("sled") && !deps.contains("sqlx"),
                "{name} depends on a database crate"
            );
        }
        if name != "server" {
            for http in ["axum", "hyper", "hyper-util", "tower-http"] {
                assert!(!deps.contains(http), "{name} depends on {http}");
            }
        }
    }
}

/// Source files below `dir`, tests (`tests.rs`, `tests/`, and everything after a file's
/// `#[cfg(test)]`) left out.
fn code_below(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "tests" {
                code_below(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            out.push((path, code.to_string()));
        }
    }
}

#[test]
fn the_environment_is_read_only_at_a_process_entry() {
    // The server's CLI, and a conversion worker's main (its limits, which its parent sets).
    let entries = ["crates/server/src/cli.rs", "crates/isolate/src/worker.rs"];
    let mut files = Vec::new();
    code_below(&root().join("src"), &mut files);
    for (_, manifest) in packages() {
        let src = manifest.parent().unwrap().join("src");
        if src != root().join("src") {
            code_below(&src, &mut files);
        }
    }
    let mut readers = Vec::new();
    for (path, code) in files {
        let rel = path
            .strip_prefix(root())
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if (code.contains("env::var(")
            || code.contains("env::vars(")
            || code.contains("env::var_os("))
            && !entries.contains(&rel.as_str())
        {
            readers.push(rel);
        }
    }
    assert!(readers.is_empty(), "the environment is read in {readers:?}");
}
