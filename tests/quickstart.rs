//! README's quick start, run as written, so that it cannot go stale silently: the fenced blocks
//! marked `sh quickstart=<step>` are run in order, in one bash, from the repository root, against
//! a real `hearth serve` with a fresh data dir, and each step's answer is checked. The block
//! marked `sh quickstart-env` (PATH and the four addresses) runs first as written; the test then
//! points the addresses at its own server's ephemeral ports and puts the built `hearth` first on
//! the PATH. Every JSON key README shows in a step's printed answer must be in the real answer.

use std::path::Path;
use std::process::Command;

use rust_decimal::Decimal;
use serde_json::Value;

use crate::common::process::ServerProcess;

/// A fenced block of README: its info string and its text.
struct Block {
    info: String,
    body: String,
}

fn blocks(readme: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for line in readme.lines() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => {
                open = Some(Block {
                    info: info.trim().to_string(),
                    body: String::new(),
                })
            }
            (Some(_), Some(_)) => out.extend(open.take()),
            (Some(block), None) => {
                block.body.push_str(line);
                block.body.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

/// The quick start's steps: (name, commands, the answer README shows after them).
fn steps(readme: &str) -> (String, Vec<(String, String, String)>) {
    let all = blocks(readme);
    let env = all
        .iter()
        .find(|b| b.info == "sh quickstart-env")
        .expect("README has a `sh quickstart-env` block")
        .body
        .clone();
    let mut steps = Vec::new();
    for (i, b) in all.iter().enumerate() {
        if let Some(name) = b.info.strip_prefix("sh quickstart=") {
            let shown = all
                .get(i + 1)
                .filter(|next| next.info == "text")
                .map(|next| next.body.clone())
                .unwrap_or_default();
            steps.push((name.to_string(), b.body.clone(), shown));
        }
    }
    (env, steps)
}

/// The `"key"` names in README's shown answer (`"key":` or `"key": `).
fn shown_keys(shown: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut rest = shown;
    while let Some(start) = rest.find('"') {
        let after = &rest[start + 1..];
        let Some(end) = after.find('"') else { break };
        let (word, tail) = (&after[..end], &after[end + 1..]);
        if tail.starts_with(':') {
            keys.push(word.to_string());
        }
        rest = tail;
    }
    keys
}

/// Every key of a JSON value, at any depth.
fn all_keys(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                out.push(k.clone());
                all_keys(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| all_keys(v, out)),
        _ => {}
    }
}

fn last_json(output: &str) -> Value {
    let line = output
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {output}"))
}

fn dec(v: &Value) -> Decimal {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not a decimal string: {v}"))
}

/// The check of each step README has; a step without one (or one without a step) fails.
fn check(step: &str, output: &str) {
    match step {
        "signin" => {
            let v = last_json(output);
            assert_eq!(v["valid"], true, "{v}");
            assert_eq!(v["userId"], "alice", "{v}");
        }
        "chat" => {
            let v = last_json(output);
            assert_eq!(v["model"], "alpha-3.3", "{v}");
            assert!(!v["output"].as_str().unwrap_or("").trim().is_empty(), "{v}");
            assert_eq!(v["usage"]["type"], "completion", "{v}");
            assert_eq!(dec(&v["balanceBefore"]), Decimal::from(10), "{v}");
            assert!(dec(&v["balanceAfter"]) < dec(&v["balanceBefore"]), "{v}");
        }
        "convert" => {
            let v = last_json(output);
            let md = v["markdown"].as_str().unwrap_or("");
            for want in ["# Plan", "**Friday**", "| docs | ann |"] {
                assert!(md.contains(want), "{want:?} missing from {md:?}");
            }
            assert_eq!(v["original_filename"], "plan.html", "{v}");
        }
        "image" => {
            let v = last_json(output);
            assert_eq!(v["model"], "xl-lightning", "{v}");
            assert_eq!(v["metadata"]["width"], 512, "{v}");
            assert_eq!(v["metadata"]["testModel"], true, "{v}");
            assert_eq!(v["usage"]["type"], "imagine", "{v}");
            let png = std::fs::read("/tmp/hearth.png").expect("the step saved the PNG");
            assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        }
        "credit" => {
            let line = output
                .lines()
                .rev()
                .find(|l| l.contains("->"))
                .unwrap_or("");
            let (before, after) = line
                .strip_prefix("alice: ")
                .and_then(|r| r.split_once(" -> "))
                .unwrap_or_else(|| panic!("not `alice: BEFORE -> AFTER`: {output}"));
            let (before, after): (Decimal, Decimal) =
                (before.parse().unwrap(), after.trim().parse().unwrap());
            assert_eq!(after - before, Decimal::from(25), "{line}");
        }
        other => panic!("README has a quick-start step {other:?} this test does not check"),
    }
}

#[test]
fn the_readme_quick_start_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let (env, steps) = steps(&readme);
    let names: Vec<&str> = steps.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(names, ["signin", "chat", "convert", "image", "credit"]);
    // The addresses README names are the real defaults.
    let defaults = hearth_server::config::RawConfig::default()
        .resolve()
        .unwrap();
    for (var, addr) in [
        ("AUTH", defaults.auth.addr),
        ("CHAT", defaults.completion.addr),
        ("DOCS", defaults.markdown.addr),
        ("IMAGES", defaults.imagine.addr),
    ] {
        assert!(
            env.contains(&format!("{var}=http://{addr}")),
            "README's {var} is not the default {addr}"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let models = crate::markdown_hostile::models(dir.path());
    let server = ServerProcess::start(&["auth", "completion", "markdown", "imagine"], &models, &[]);
    let bin = Path::new(env!("CARGO_BIN_EXE_hearth")).parent().unwrap();
    let mut script = format!("set -euo pipefail\n{env}\n");
    script.push_str(&format!(
        "export PATH=\"{}:$PATH\"\nAUTH={} CHAT={} DOCS={} IMAGES={}\n",
        bin.display(),
        server.url("auth"),
        server.url("completion"),
        server.url("markdown"),
        server.url("imagine"),
    ));
    for (name, commands, _) in &steps {
        script.push_str(&format!("echo '@@step {name}'\n{commands}\necho\n"));
    }
    let auth_addr = server.url("auth").trim_start_matches("http://").to_string();
    let run = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(root)
        .env("HEARTH_DATA_DIR", server.data_dir())
        .env("HEARTH_AUTH_ADDR", &auth_addr)
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "the quick start failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let outputs: Vec<&str> = stdout.split("@@step ").skip(1).collect();
    assert_eq!(outputs.len(), steps.len(), "{stdout}");
    for ((name, _, shown), output) in steps.iter().zip(outputs) {
        let output = output.strip_prefix(name.as_str()).unwrap_or(output);
        check(name, output);
        if let Ok(actual) = serde_json::from_str::<Value>(
            output
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or(""),
        ) {
            let mut keys = Vec::new();
            all_keys(&actual, &mut keys);
            for key in shown_keys(shown) {
                assert!(
                    keys.contains(&key),
                    "README shows `{key}` in the {name} step's answer; the real one has no such key: {actual}"
                );
            }
        }
    }
}
