//! The systemd unit a team's box runs Hearth with, `deploy/hearth.service`: `systemd-analyze
//! verify` accepts it without a warning (its `ExecStart` pointed at the binary just built, since
//! verify checks the program exists), and it keeps the settings the README promises.

use std::path::{Path, PathBuf};
use std::process::Command;

fn unit_text() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/hearth.service");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `systemd-analyze verify` on `text` written as `hearth.service` in a fresh folder: whether it
/// passed, and what it said about the unit.
fn verify(text: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let unit: PathBuf = dir.path().join("hearth.service");
    std::fs::write(&unit, text).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .output()
        .expect("systemd-analyze (Debian's systemd, installed by scripts/test.sh)");
    let said: String = String::from_utf8_lossy(&out.stderr)
        .lines()
        .chain(String::from_utf8_lossy(&out.stdout).lines())
        .filter(|l| l.contains("hearth"))
        .map(|l| format!("{l}\n"))
        .collect();
    (out.status.success(), said)
}

/// The unit with its program replaced by the binary cargo built for these tests.
fn with_built_binary(text: &str) -> String {
    let installed = "/usr/local/bin/hearth ";
    assert!(text.contains(installed), "ExecStart runs {installed}");
    text.replace(installed, &format!("{} ", env!("CARGO_BIN_EXE_hearth")))
}

#[test]
fn the_unit_verifies_without_a_warning() {
    let (ok, said) = verify(&with_built_binary(&unit_text()));
    assert!(ok && said.is_empty(), "systemd-analyze verify: {said}");
    // The check can fail: a misspelled key is reported.
    let typo = with_built_binary(&unit_text()).replace("ProtectSystem=", "ProtectSytem=");
    let (_, said) = verify(&typo);
    assert!(said.contains("ProtectSytem"), "{said}");
}

#[test]
fn the_unit_runs_as_its_own_user_with_its_data_in_var_lib_and_the_system_read_only() {
    let text = unit_text();
    let settings: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && l.contains('='))
        .collect();
    for wanted in [
        "User=hearth",
        "StateDirectory=hearth",
        "ExecStart=/usr/local/bin/hearth serve --config /etc/hearth/hearth.toml --data-dir /var/lib/hearth",
        "Restart=on-failure",
        "KillSignal=SIGTERM",
        // `systemctl reload hearth`: models.toml read again (tests/models_runtime.rs, SIGHUP).
        "ExecReload=/bin/kill -HUP $MAINPID",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ReadWritePaths=/var/lib/hearth",
        "PrivateTmp=yes",
        "ProtectHome=yes",
        "CapabilityBoundingSet=",
        "LimitNOFILE=65536",
    ] {
        assert!(settings.contains(&wanted), "{wanted} is missing");
    }
}
