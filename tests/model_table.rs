//! The model table as the server reads it at start (once, for every service that serves models):
//! a key it does not know, anywhere in the file, stops the start with the file, the key's place
//! and the closest known key.

use hearth_server::Service;

use crate::common::TestApp;

/// Starts `services` on a model table holding `text`; the error it refuses to start with.
async fn start_error(services: &[Service], text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("models.toml");
    std::fs::write(&table, text).unwrap();
    let refused = TestApp::builder()
        .services(services)
        .configure(|raw| raw.models = Some(table.clone()))
        .try_spawn()
        .await;
    let error = refused
        .err()
        .expect("the server refuses to start")
        .to_string();
    assert!(
        error.contains(&table.display().to_string()),
        "names the file: {error}"
    );
    error
}

#[tokio::test]
async fn a_misspelt_section_of_the_model_table_stops_the_start() {
    let error = start_error(
        &[Service::Auth, Service::Completion],
        "[txt.\"my-model\"]\nweights = \"m.gguf\"\ninput_price_per_million = \"1\"\noutput_price_per_million = \"1\"\n",
    )
    .await;
    assert!(
        error
            .ends_with("models.toml: [txt.\"my-model\"]: unknown section txt; the closest is text"),
        "{error}"
    );
}

#[tokio::test]
async fn a_misspelt_default_stops_the_image_service_too() {
    let error = start_error(
        &[Service::Auth, Service::Imagine],
        "[defaults]\ndevise = \"cpu\"\n\n[image.\"xl-lightning\"]\nweights = \"w\"\nprice_per_image = \"0.04\"\n",
    )
    .await;
    assert!(
        error.ends_with("models.toml: [defaults] devise: unknown key; the closest is device"),
        "{error}"
    );
}

#[tokio::test]
async fn an_encoder_row_with_a_bad_precision_or_a_rerank_row_with_shortens_stops_the_start() {
    let error = start_error(
        &[Service::Auth, Service::Completion],
        "[embedding.\"e\"]\nweights = \"w\"\ninput_price_per_million = \"1\"\nprecision = \"f8\"\n",
    )
    .await;
    assert!(
        error.contains("[embedding.\"e\"]")
            && error.contains("precision must be \"f32\" or \"bf16\""),
        "{error}"
    );
    let error = start_error(
        &[Service::Auth, Service::Completion],
        "[rerank.\"r\"]\nweights = \"w\"\ninput_price_per_million = \"1\"\nshortens = true\n",
    )
    .await;
    assert!(
        error.contains("shortens is a key of embedding rows only"),
        "{error}"
    );
}
