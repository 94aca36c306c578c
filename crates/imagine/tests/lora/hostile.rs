//! Files and requests that do not fit: each refused with a typed error naming what is wrong.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use hearth_imagine::lora::{MAX_ACTIVE_LORAS, MAX_LORA_TENSORS};
use hearth_imagine::pipeline::Noise;
use hearth_imagine::{ActiveLora, Error, Lora, LoraFile, LoraProblem};

use super::{fixtures, setup, write_st};

fn problem(result: Result<Lora, Error>) -> LoraProblem {
    match result {
        Err(Error::Lora { file, problem }) => {
            println!("refused: LoRA {file}: {problem}");
            problem
        }
        Err(other) => panic!("expected a LoRA error, got {other}"),
        Ok(l) => panic!("expected a LoRA error, got {l:?}"),
    }
}

fn t(dims: &[usize]) -> Tensor {
    Tensor::ones(dims, DType::F32, &Device::Cpu).unwrap()
}

#[test]
fn hostile_files_are_refused_with_a_typed_error_naming_the_key() {
    let s = setup();
    let dir = tempfile::tempdir().unwrap();
    let load = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        Lora::load(&path, &s.p)
    };
    let load_st = |name: &str, tensors: Vec<(&str, Tensor)>, meta: Option<serde_json::Value>| {
        let path = dir.path().join(name);
        let owned: Vec<_> = tensors
            .into_iter()
            .map(|(k, t)| (k.to_string(), t))
            .collect();
        write_st(&path, &owned, meta);
        Lora::load(&path, &s.p)
    };
    let q = "unet.down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q";
    let (a, b) = (format!("{q}.lora_A.weight"), format!("{q}.lora_B.weight"));
    let kq = "lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q";

    // Not safetensors at all, empty, truncated, a header longer than the file.
    assert!(matches!(
        problem(load("text.safetensors", b"hello, world")),
        LoraProblem::NotSafetensors(_)
    ));
    assert!(matches!(
        problem(load("empty.safetensors", b"")),
        LoraProblem::NotSafetensors(_)
    ));
    let whole = std::fs::read(fixtures().join("peft.safetensors")).unwrap();
    let cut = problem(load("cut.safetensors", &whole[..whole.len() / 2]));
    assert!(matches!(cut, LoraProblem::NotSafetensors(_)), "{cut:?}");
    let mut liar = (1u64 << 40).to_le_bytes().to_vec();
    liar.extend(b"{}");
    assert!(matches!(
        problem(load("liar.safetensors", &liar)),
        LoraProblem::NotSafetensors(_)
    ));
    // Too large: refused from its size, before reading (a sparse file).
    let huge = dir.path().join("huge.safetensors");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(3 << 30)
        .unwrap();
    assert!(matches!(
        problem(Lora::load(&huge, &s.p)),
        LoraProblem::TooLarge { .. }
    ));
    // Too many tensors.
    let many: Vec<_> = (0..=MAX_LORA_TENSORS)
        .map(|i| (format!("m{i}.alpha"), t(&[])))
        .collect();
    let path = dir.path().join("many.safetensors");
    write_st(&path, &many, None);
    assert!(matches!(
        problem(Lora::load(&path, &s.p)),
        LoraProblem::TooManyTensors { .. }
    ));

    // A module the model has no adapter-capable layer for, named as the file names it.
    let unknown = "unet.down_blocks.9.attentions.0.proj_in.lora_A.weight";
    let p = problem(load_st(
        "unknown.safetensors",
        vec![
            (unknown, t(&[4, 64])),
            (
                "unet.down_blocks.9.attentions.0.proj_in.lora_B.weight",
                t(&[64, 4]),
            ),
        ],
        None,
    ));
    assert_eq!(
        p,
        LoraProblem::UnknownModule {
            key: unknown.into()
        }
    );
    let p = problem(load_st(
        "time-embed.safetensors",
        vec![
            ("lora_unet_time_embed_0.lora_down.weight", t(&[4, 32])),
            ("lora_unet_time_embed_0.lora_up.weight", t(&[128, 4])),
        ],
        None,
    ));
    assert!(matches!(p, LoraProblem::UnknownModule { .. }));
    // Wrong shapes: in features, out features, a conv kernel.
    let p = problem(load_st(
        "wide.safetensors",
        vec![(a.as_str(), t(&[4, 65])), (b.as_str(), t(&[64, 4]))],
        None,
    ));
    assert!(
        matches!(p, LoraProblem::Shape { ref key, .. } if *key == a),
        "{p:?}"
    );
    let p = problem(load_st(
        "tall.safetensors",
        vec![(a.as_str(), t(&[4, 64])), (b.as_str(), t(&[63, 4]))],
        None,
    ));
    assert!(
        matches!(p, LoraProblem::Shape { ref key, .. } if *key == b),
        "{p:?}"
    );
    let conv = "lora_unet_input_blocks_4_0_in_layers_2";
    let p = problem(load_st(
        "kernel.safetensors",
        vec![
            (
                format!("{conv}.lora_down.weight").as_str(),
                t(&[2, 32, 1, 1]),
            ),
            (format!("{conv}.lora_up.weight").as_str(), t(&[64, 2, 1, 1])),
        ],
        None,
    ));
    assert!(matches!(p, LoraProblem::Shape { .. }), "{p:?}");
    // Half a pair, ranks that disagree, rank 0, an absurd rank.
    let p = problem(load_st(
        "half.safetensors",
        vec![(a.as_str(), t(&[4, 64]))],
        None,
    ));
    assert_eq!(
        p,
        LoraProblem::MissingHalf {
            key: b.clone(),
            present: a.clone()
        }
    );
    let p = problem(load_st(
        "ranks.safetensors",
        vec![(a.as_str(), t(&[4, 64])), (b.as_str(), t(&[64, 3]))],
        None,
    ));
    assert!(
        matches!(
            p,
            LoraProblem::RankMismatch {
                rank: 4,
                other_rank: 3,
                ..
            }
        ),
        "{p:?}"
    );
    let p = problem(load_st(
        "rank0.safetensors",
        vec![(a.as_str(), t(&[0, 64])), (b.as_str(), t(&[64, 0]))],
        None,
    ));
    assert!(matches!(p, LoraProblem::Rank { rank: 0, .. }), "{p:?}");
    let p = problem(load_st(
        "rank65.safetensors",
        vec![(a.as_str(), t(&[65, 64])), (b.as_str(), t(&[64, 65]))],
        None,
    ));
    assert!(
        matches!(
            p,
            LoraProblem::Rank {
                rank: 65,
                max: 64,
                ..
            }
        ),
        "{p:?}"
    );
    // A non-finite alpha, non-finite weights, a weight that is not a float.
    let p = problem(load_st(
        "alpha.safetensors",
        vec![
            (format!("{kq}.lora_down.weight").as_str(), t(&[4, 64])),
            (format!("{kq}.lora_up.weight").as_str(), t(&[64, 4])),
            (
                format!("{kq}.alpha").as_str(),
                Tensor::new(f32::NAN, &Device::Cpu).unwrap(),
            ),
        ],
        None,
    ));
    assert!(matches!(p, LoraProblem::Alpha { ref key, .. } if *key == format!("{kq}.alpha")));
    let nan = Tensor::new(&[[f32::INFINITY; 64]; 4], &Device::Cpu).unwrap();
    let p = problem(load_st(
        "inf.safetensors",
        vec![(a.as_str(), nan), (b.as_str(), t(&[64, 4]))],
        None,
    ));
    assert_eq!(p, LoraProblem::NonFinite { key: a.clone() });
    let path = dir.path().join("int.safetensors");
    let ints = HashMap::from([
        (
            a.clone(),
            Tensor::zeros((4, 64), DType::U8, &Device::Cpu).unwrap(),
        ),
        (b.clone(), t(&[64, 4])),
    ]);
    candle_core::safetensors::save(&ints, &path).unwrap();
    assert!(matches!(
        problem(Lora::load(&path, &s.p)),
        LoraProblem::Dtype { .. }
    ));
    // Keys of a format Hearth does not read (LoHa), and DoRA.
    let p = problem(load_st(
        "loha.safetensors",
        vec![(format!("{kq}.hada_w1_a").as_str(), t(&[4, 64]))],
        None,
    ));
    assert!(matches!(p, LoraProblem::UnsupportedKey { .. }), "{p:?}");
    let dora = serde_json::json!({"lora_adapter_metadata": "{\"unet.use_dora\": true}"});
    let p = problem(load_st(
        "dora.safetensors",
        vec![(a.as_str(), t(&[4, 64])), (b.as_str(), t(&[64, 4]))],
        Some(dora),
    ));
    assert!(matches!(p, LoraProblem::Unsupported(_)), "{p:?}");
    // One layer under two names.
    let p = problem(load_st(
        "twice.safetensors",
        vec![
            (a.as_str(), t(&[4, 64])),
            (b.as_str(), t(&[64, 4])),
            (format!("{kq}.lora_down.weight").as_str(), t(&[4, 64])),
            (format!("{kq}.lora_up.weight").as_str(), t(&[64, 4])),
        ],
        None,
    ));
    assert!(matches!(p, LoraProblem::SameLayer { .. }), "{p:?}");
    // The file's own checks stand without a model too.
    let bytes = std::fs::read(dir.path().join("half.safetensors")).unwrap();
    assert!(LoraFile::from_bytes("half", &bytes).is_err());
}

#[test]
fn requests_are_bounded_and_a_lora_serves_only_the_model_it_was_loaded_for() {
    let s = setup();
    let lora = s.lora("kohya.safetensors");
    let too_many = vec![ActiveLora::new(lora.clone(), 0.5); MAX_ACTIVE_LORAS + 1];
    let noise = Noise::from(s.get("noise"));
    let refused = s.p.sample(&s.params(too_many), &noise, &|| false);
    assert!(
        matches!(refused, Err(Error::InvalidParams { field: "loras", .. })),
        "{refused:?}"
    );
    for scale in [f64::NAN, f64::INFINITY, 11.0, -11.0] {
        let refused = s.p.apply_loras(&[ActiveLora::new(lora.clone(), scale)]);
        assert!(
            matches!(refused, Err(Error::InvalidParams { field: "loras", .. })),
            "{scale}"
        );
    }
    let other = setup();
    let refused = other.p.apply_loras(&[ActiveLora::new(lora, 1.0)]);
    assert!(
        matches!(
            refused,
            Err(Error::Lora {
                problem: LoraProblem::OtherModel,
                ..
            })
        ),
        "{refused:?}"
    );
}
