//! LoRAs over HTTP on the tiny SDXL-shaped model: declared per model in `models.toml`, chosen per
//! request (`loras: [{name, scale}]`) without reloading anything, listed in the health answer;
//! a LoRA file that does not fit the model, an unknown name, too many LoRAs and a bad scale each
//! refused with a 400 naming `loras` before any hold, the other LoRAs still served.

use std::path::Path;

use base64::Engine as _;
use hearth_server::Service;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::assert_error;
use crate::imagine::ImagineApp;

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/imagine/lora")
        .join(name)
        .display()
        .to_string()
}

/// A safetensors file naming a real layer of the tiny UNet (`to_q`, 64 wide) with a `down`
/// weight of the wrong width.
fn misshapen_lora(path: &Path) {
    let key = "lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q";
    let header = json!({
        format!("{key}.lora_down.weight"): {"dtype": "F32", "shape": [4, 7], "data_offsets": [0, 112]},
        format!("{key}.lora_up.weight"): {"dtype": "F32", "shape": [64, 4], "data_offsets": [112, 1136]},
    })
    .to_string();
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend(vec![0u8; 1136]);
    std::fs::write(path, bytes).unwrap();
}

async fn start() -> (ImagineApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.safetensors");
    misshapen_lora(&broken);
    let table = format!(
        "loras = {{ peft = {:?}, kohya = {:?}, broken = {:?} }}",
        fixture("peft.safetensors"),
        fixture("kohya.safetensors"),
        broken.display().to_string()
    );
    (ImagineApp::start("10", &table).await, dir)
}

fn png_of(resp: &Value) -> Vec<u8> {
    let url = resp["imageUrl"].as_str().expect("imageUrl");
    base64::engine::general_purpose::STANDARD
        .decode(url.strip_prefix("data:image/png;base64,").unwrap())
        .unwrap()
}

#[tokio::test]
async fn a_request_chooses_its_loras_and_scales_and_the_health_lists_them() {
    let (img, _dir) = start().await;
    let token = img.app.token("olga").await;
    let body = |loras: Value| {
        json!({"serviceToken": token, "prompt": "a lighthouse", "width": 256, "height": 256,
            "steps": 2, "seed": 4, "loras": loras})
    };
    let (status, plain) = img.imagine(body(Value::Null)).await;
    assert_eq!(status, StatusCode::OK, "{plain}");
    let (status, peft) = img
        .imagine(body(json!([{"name": "peft", "scale": 0.7}])))
        .await;
    assert_eq!(status, StatusCode::OK, "{peft}");
    assert_ne!(png_of(&peft), png_of(&plain), "the LoRA changes the image");
    let (_, again) = img
        .imagine(body(json!([{"name": "peft", "scale": 0.7}])))
        .await;
    assert_eq!(png_of(&peft), png_of(&again), "and does so repeatably");
    // After a LoRA request, a plain one is plain again: nothing stays applied.
    let (_, after) = img.imagine(body(json!([]))).await;
    assert_eq!(png_of(&after), png_of(&plain));
    let (_, zero) = img
        .imagine(body(json!([{"name": "kohya", "scale": 0}])))
        .await;
    assert_eq!(png_of(&zero), png_of(&plain), "scale 0 is no LoRA");
    let (status, both) = img
        .imagine(body(
            json!([{"name": "peft", "scale": 0.7}, {"name": "kohya"}]),
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{both}");
    assert_ne!(png_of(&both), png_of(&peft));
    // The price does not change with LoRAs.
    assert_eq!(both["usage"]["cost"], plain["usage"]["cost"]);

    let (_, health) = img.app.get(Service::Imagine, "/").await;
    let loras = health["model"]["loras"].as_array().expect("loras listed");
    let status_of = |name: &str| {
        loras
            .iter()
            .find(|l| l["name"] == name)
            .map(|l| l["status"].clone())
    };
    assert_eq!(status_of("peft"), Some(json!("ready")), "{health}");
    assert_eq!(status_of("kohya"), Some(json!("ready")), "{health}");
    assert_eq!(status_of("broken"), Some(json!("failed")), "{health}");
    assert_eq!(
        health["status"], "healthy",
        "a bad LoRA does not fail the model"
    );

    // The OpenAI route takes them as an extension.
    let r = img
        .app
        .client
        .post(format!(
            "{}/v1/images/generations",
            img.app.url(Service::Imagine)
        ))
        .bearer_auth(&token)
        .json(
            &json!({"prompt": "a lighthouse", "size": "256x256", "seed": 4, "steps": 2,
            "loras": [{"name": "peft", "scale": 0.7}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    let openai_png = base64::engine::general_purpose::STANDARD
        .decode(body["data"][0]["b64_json"].as_str().unwrap())
        .unwrap();
    assert_eq!(openai_png, png_of(&peft), "the same LoRA image either way");
}

#[tokio::test]
async fn bad_lora_choices_are_400s_naming_loras_before_any_hold() {
    let (img, _dir) = start().await;
    let token = img.app.token("pam").await;
    let hundred: Vec<Value> = (0..100).map(|i| json!({"name": format!("l{i}")})).collect();
    let cases = [
        (
            "a misshapen file",
            json!([{"name": "broken"}]),
            "could not be loaded",
        ),
        (
            "an unknown name",
            json!([{"name": "watercolor"}]),
            "not a LoRA",
        ),
        ("100 LoRAs", Value::Array(hundred), "at most 8"),
        (
            "a huge scale",
            json!([{"name": "peft", "scale": 1e9}]),
            "scale",
        ),
        (
            "twice",
            json!([{"name": "peft"}, {"name": "peft"}]),
            "twice",
        ),
        ("not an array", json!({"name": "peft"}), "array"),
    ];
    for (what, loras, says) in cases {
        let (status, r) = img
            .imagine(json!({"serviceToken": token, "prompt": "x", "width": 256,
                "height": 256, "steps": 1, "loras": loras}))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {r}");
        assert_error(&r, "InvalidRequest");
        assert_eq!(r["error"]["details"]["field"], "loras", "{what}: {r}");
        let message = r["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{what}: {message}");
    }
    let store = &img.app.running().state.store;
    assert!(store.holds("pam").await.unwrap().is_empty());
    assert_eq!(
        store.balance("pam").await.unwrap(),
        rust_decimal::Decimal::from(10)
    );
    // The good LoRAs are still served.
    let (status, r) = img
        .imagine(
            json!({"serviceToken": token, "prompt": "x", "width": 256, "height": 256,
            "steps": 1, "loras": [{"name": "kohya", "scale": -0.5}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
}
