use super::*;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn defaults_resolve_to_the_documented_addresses() {
    let c = RawConfig::default().resolve().unwrap();
    assert_eq!(c.auth.addr.to_string(), "127.0.0.1:8081");
    assert_eq!(c.completion.addr.to_string(), "127.0.0.1:8082");
    assert_eq!(c.markdown.addr.to_string(), "127.0.0.1:8083");
    assert_eq!(c.imagine.addr.to_string(), "127.0.0.1:8084");
    assert_eq!(c.auth.token_lifetime_default_secs, 3600);
    assert!(matches!(c.auth.identity_provider, IdpChoice::SharedSecret));
    // The per-user caps and the stalled-client limit README documents.
    assert_eq!(c.completion.max_concurrent_per_user, 4);
    assert_eq!(c.imagine.max_concurrent_per_user, 2);
    assert_eq!(c.completion.client_stall_timeout.as_secs(), 30);
    // The engines' Retry-After figure is the scheduler's own default unless set.
    assert_eq!(
        c.completion.retry_after,
        hearth_scheduler::SchedulerConfig::default().retry_after
    );
}

#[test]
fn the_engines_retry_figure_is_read_from_completion_and_zero_is_refused() {
    let raw: RawConfig = toml::from_str(
        "[completion]
retry_after_secs = 7",
    )
    .unwrap();
    assert_eq!(raw.resolve().unwrap().completion.retry_after.as_secs(), 7);
    let raw: RawConfig = toml::from_str(
        "[completion]
retry_after_secs = 0",
    )
    .unwrap();
    let err = raw.resolve().unwrap_err().to_string();
    assert!(err.contains("completion.retry_after_secs"), "{err}");
}

#[test]
fn later_layers_win_file_then_env_then_flags() {
    let file = "env = \"staging\"\nregion = \"file\"\n[auth]\naddr = \"127.0.0.1:9000\"\npublic_url = \"https://auth.example\"\n";
    let (layers, unknown) = Layers::new()
        .toml("hearth.toml", file)
        .unwrap()
        .env(env(&[
            ("HEARTH_REGION", "eu-1"),
            ("HEARTH_AUTH_ADDR", "127.0.0.1:9001"),
            ("HEARTH_AUTH_OIDC_LEEWAY_SECS", "5"),
            ("HEARTH_MAX_BODY_BYTES", "4096"),
            (
                "HEARTH_ALLOWED_ORIGINS",
                "https://a.example, https://b.example",
            ),
            ("HEARTH_BROWSER_TESTS", "1"),
            ("PATH", "/bin"),
        ]))
        .unwrap();
    let flags = RawConfig {
        auth: RawAuthConfig {
            addr: Some("127.0.0.1:0".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let raw = layers.raw(&flags).build().unwrap();
    assert_eq!(unknown, vec!["HEARTH_BROWSER_TESTS".to_string()]);
    let c = raw.resolve().unwrap();
    assert_eq!(c.env, "staging");
    assert_eq!(c.region, "eu-1");
    assert_eq!(c.auth.addr.to_string(), "127.0.0.1:0");
    assert_eq!(c.auth.public_url.as_deref(), Some("https://auth.example"));
    assert_eq!(c.max_body_bytes, 4096);
    assert_eq!(
        c.allowed_origins,
        vec!["https://a.example", "https://b.example"]
    );
    assert_eq!(raw.auth.oidc.leeway_secs, Some(5));
}

#[test]
fn a_misspelt_key_is_reported_with_its_place() {
    let err = Layers::new()
        .toml("hearth.toml", "[auth]\nadress = \"x\"\n")
        .unwrap_err();
    assert!(err.to_string().contains("hearth.toml"), "{err}");
    assert!(err.to_string().contains("adress"), "{err}");
}

#[test]
fn bad_values_are_refused_naming_the_key() {
    let raw: RawConfig = toml::from_str("[billing]\ndefault_margin_percent = \"100\"").unwrap();
    assert!(raw
        .resolve()
        .unwrap_err()
        .to_string()
        .starts_with("billing.default_margin_percent"));
    let raw: RawConfig = toml::from_str("services = [\"auth\", \"teleport\"]").unwrap();
    assert!(raw
        .resolve()
        .unwrap_err()
        .to_string()
        .starts_with("services"));
    let raw: RawConfig = toml::from_str("[auth]\nidentity_provider = \"oidc\"\n[auth.oidc]\nissuer = \"i\"\naudience = \"a\"\njwks_file = \"k.json\"\nalgorithms = [\"HS256\"]").unwrap();
    assert!(raw.resolve().unwrap_err().to_string().contains("symmetric"));
}

#[test]
fn the_shipped_example_config_parses_and_resolves() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hearth.example.toml");
    let raw = Layers::new().file(&path).unwrap().build().unwrap();
    raw.resolve().unwrap();
}

#[test]
fn an_unknown_variable_is_matched_to_the_closest_key() {
    assert_eq!(
        closest_env_name("HEARTH_AUTH_ADR").as_deref(),
        Some("HEARTH_AUTH_ADDR")
    );
    assert_eq!(
        closest_env_name("HEARTH_BILLING_INITAL_BALANCE").as_deref(),
        Some("HEARTH_BILLING_INITIAL_BALANCE")
    );
    assert_eq!(
        closest_env_name("HEARTH_SERVER_SHUTDOWN_TIMEOUT").as_deref(),
        Some("HEARTH_SERVER_SHUTDOWN_TIMEOUT_SECS")
    );
    // Only a close name is suggested (within a third of the name's length, at least 2 edits).
    assert_eq!(closest("thread", ["device", "threads"]), Some("threads"));
    assert_eq!(closest("txt", ["defaults", "text", "image"]), Some("text"));
    assert_eq!(closest("colour", ["device", "threads"]), None);
}

/// `hearth.example.toml` is the full list of keys README promises: every key the configuration
/// knows appears in it (set, or commented out as `# key = ...`), and everything it sets parses.
#[test]
fn the_example_file_lists_every_key_and_parses() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../hearth.example.toml");
    let text = std::fs::read_to_string(path).unwrap();
    Layers::new().toml("hearth.example.toml", &text).unwrap();
    let mut section = String::new();
    let mut listed = std::collections::HashSet::new();
    for line in text.lines() {
        let line = line.trim_start_matches('#').trim();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.split(']').next()) {
            section = name.to_string();
            continue;
        }
        if let Some((key, _)) = line.split_once('=') {
            let key = key.trim();
            if !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                listed.insert(if section.is_empty() {
                    key.to_string()
                } else {
                    format!("{section}.{key}")
                });
            }
        }
    }
    let missing: Vec<String> = keys().into_iter().filter(|k| !listed.contains(k)).collect();
    assert!(
        missing.is_empty(),
        "hearth.example.toml does not list {missing:?}"
    );
}

#[test]
fn a_string_key_set_from_the_environment_may_look_like_a_number_and_a_store_url_selects_postgres() {
    let (layers, _) = Layers::new()
        .env(env(&[
            ("HEARTH_BILLING_INITIAL_BALANCE", "100"),
            ("HEARTH_STORE_URL", "postgres://h@db:5432/hearth"),
            ("HEARTH_STORE_MAX_CONNECTIONS", "4"),
        ]))
        .unwrap();
    let c = layers.build().unwrap().resolve().unwrap();
    assert_eq!(c.billing.initial_balance, Decimal::from(100));
    assert_eq!(
        c.store.choice,
        StoreChoice::Postgres("postgres://h@db:5432/hearth".into())
    );
    assert_eq!(c.store.max_connections, 4);
    // No url: the embedded store; anything but postgres:// is refused.
    let plain = RawConfig::default().resolve().unwrap();
    assert_eq!(plain.store.choice, StoreChoice::Embedded);
    let mut bad = RawConfig::default();
    bad.store.url = Some("mysql://db/hearth".into());
    assert!(bad.resolve().is_err());
}

#[test]
fn hearth_kernel_names_the_fast_paths_kernels_and_a_name_no_path_has_is_refused() {
    let resolve = |value: &str| {
        let (layers, unknown) = Layers::new().env(env(&[("HEARTH_KERNEL", value)])).unwrap();
        assert!(unknown.is_empty(), "{unknown:?}");
        layers.build().unwrap().resolve()
    };
    assert_eq!(
        resolve("avx2").unwrap().kernel,
        Some(hearth_infer::KernelPath::Avx2)
    );
    let err = resolve("avx1024").unwrap_err().to_string();
    assert!(
        err.contains("kernel") && err.contains("avx512vnni"),
        "{err}"
    );
    assert_eq!(RawConfig::default().resolve().unwrap().kernel, None);
}

#[test]
fn a_misspelt_key_of_hearth_toml_is_refused_with_the_closest_key_as_in_models_toml() {
    let error = |text: &str| {
        Layers::new()
            .toml("hearth.toml", text)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        error("[auth]\nadr = \"127.0.0.1:1\""),
        "hearth.toml: [auth] adr: unknown key; the closest is addr"
    );
    assert_eq!(
        error("servics = [\"auth\"]"),
        "hearth.toml: servics: unknown key; the closest is services"
    );
    assert_eq!(
        error("[completon]\naddr = \"127.0.0.1:1\""),
        "hearth.toml: completon: unknown key; the closest is completion"
    );
    // Nothing close: serde's message, which lists the keys known there.
    let far = error("[auth]\nzzzzzzzzzz = 1");
    assert!(far.contains("zzzzzzzzzz") && far.contains("addr"), "{far}");
}

#[test]
fn markdown_conversion_options_default_and_parse_and_bad_values_name_their_key() {
    let options = RawConfig::default().resolve().unwrap().markdown.options;
    assert_eq!(options, hearth_markdown::Options::default());
    let raw: RawConfig = toml::from_str(
        "[markdown]
attachments = \"convert\"
ocr = \"off\"
ocr_languages = \"eng+fra\"",
    )
    .unwrap();
    let options = raw.resolve().unwrap().markdown.options;
    assert_eq!(options.attachments, hearth_markdown::Attachments::Convert);
    assert_eq!(options.ocr, hearth_markdown::Ocr::Off);
    assert_eq!(
        options.languages.map(|l| l.to_string()).as_deref(),
        Some("eng+fra")
    );
    for (text, key) in [
        ("ocr = \"always\"", "markdown.ocr"),
        ("ocr_languages = \"../eng\"", "markdown.ocr_languages"),
    ] {
        let raw: RawConfig = toml::from_str(&format!("[markdown]\n{text}")).unwrap();
        let err = raw.resolve().unwrap_err().to_string();
        assert!(err.contains(key), "{err}");
    }
}
