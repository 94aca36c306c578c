//! Loading: resolve the weight source (local path or Hugging Face cache/hub), then build the
//! tokenizer and the backend for a GGUF file or a safetensors checkpoint.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{Device, Tensor};

use crate::candle_llama::CandleModel;
use crate::config::{BackendChoice, TextModelConfig, WeightSource};
use crate::gguf::{Arch, GgufFile, Hparams};
use crate::model::{device_for, resolve_backend, Backend, TextModel};
use crate::Error;

const FETCH_HINT: &str = "run scripts/fetch-weights.sh to download the default weights";

pub(crate) fn load(cfg: &TextModelConfig) -> Result<TextModel, Error> {
    let started = Instant::now();
    let device = device_for(cfg.device, cfg.gpu)?;
    let backend_choice = resolve_backend(cfg.backend, &device)?;
    let model = match &cfg.source {
        WeightSource::Local { path } => load_path(path, cfg, &device, backend_choice)?,
        WeightSource::HfHub {
            repo,
            file,
            revision,
        } => {
            let path = crate::hub::fetch(repo, file.as_deref(), revision.as_deref())?;
            load_path(&path, cfg, &device, backend_choice)?
        }
    };
    tracing::info!(
        arch = %model.info().architecture,
        backend = %model.info().backend,
        threads = model.threads(),
        ms = started.elapsed().as_millis() as u64,
        "text model loaded"
    );
    Ok(model)
}

fn load_path(
    path: &Path,
    cfg: &TextModelConfig,
    device: &Device,
    backend: BackendChoice,
) -> Result<TextModel, Error> {
    if !path.exists() {
        return Err(Error::WeightsNotFound {
            path: path.to_path_buf(),
            hint: FETCH_HINT.to_string(),
        });
    }
    if path.is_dir() {
        return load_safetensors(path, cfg, device);
    }
    let file = GgufFile::open(path)?;
    let hp = Hparams::from_gguf(&file.content)?;
    let tokenizer = match &cfg.tokenizer {
        Some(tj) => crate::tokenizer::from_files(tj, cfg.chat_template.as_deref())?,
        None => crate::tokenizer::from_gguf(&file.content, cfg.chat_template.as_deref())?,
    };
    // The hand-written CPU path (src/fast/), llama family and Gemma 3. Under `auto`, a file it
    // cannot run (e.g. a block type it lacks) falls back to candle.
    let fast = match backend {
        BackendChoice::Fast => {
            let kernel = hearth_kernels::KernelPath::chosen(cfg.kernel);
            match crate::fast::from_gguf_on(path, &file.content, hp.clone(), cfg.threads, kernel) {
                Ok(mut m) => {
                    m.set_kv(cfg.kv_precision)?;
                    Some(m)
                }
                Err(e) if cfg.backend == BackendChoice::Auto => {
                    tracing::warn!(error = %e, "the fast CPU backend cannot run this file; using candle");
                    None
                }
                Err(e) => return Err(e),
            }
        }
        _ => None,
    };
    let backend: Box<dyn Backend> = match fast {
        Some(m) => Box::new(m),
        None => {
            let mut m = crate::candle_gguf::from_gguf(&file, hp.clone(), device)?;
            m.configure(
                cfg.kv_precision,
                CandleModel::act_for(device, cfg.dtype),
                cfg.gpu,
            )?;
            Box::new(m)
        }
    };
    let rank = match hp.pooling {
        Some(crate::Pooling::Rank) => Some(crate::rank::RankHead::from_gguf(&file, &hp)?),
        _ => None,
    };
    let weights_bytes = file.file_bytes;
    drop(file); // unmap: the weights now live in the backend
    let mut model = TextModel::assemble(hp, backend, tokenizer, weights_bytes, cfg.threads)?;
    model.rank = rank;
    Ok(model)
}

/// Hyperparameters from a Hugging Face `config.json` (llama family).
pub(crate) fn hparams_from_config(config: &serde_json::Value) -> Result<Hparams, Error> {
    let arch_name = config
        .get("model_type")
        .and_then(|v| v.as_str())
        .ok_or_else(|| Error::metadata("config.json model_type", "missing"))?
        .to_string();
    if !matches!(arch_name.as_str(), "llama" | "mistral") {
        return Err(Error::UnsupportedArchitecture(arch_name));
    }
    let num = |key: &str| -> Result<usize, Error> {
        config
            .get(key)
            .and_then(|v| v.as_u64())
            .map(|v| v as usize)
            .ok_or_else(|| {
                Error::metadata(format!("config.json {key}"), "missing or not an integer")
            })
    };
    let opt_num = |key: &str| config.get(key).and_then(|v| v.as_u64()).map(|v| v as usize);
    let float = |key: &str| config.get(key).and_then(|v| v.as_f64()).map(|v| v as f32);
    let n_embd = num("hidden_size")?;
    let n_head = num("num_attention_heads")?;
    let hp = Hparams {
        arch: Arch::Llama,
        n_layer: num("num_hidden_layers")?,
        n_embd,
        n_ff: num("intermediate_size")?,
        n_head,
        n_head_kv: opt_num("num_key_value_heads").unwrap_or(n_head),
        head_dim: opt_num("head_dim").unwrap_or(n_embd / n_head.max(1)),
        context_length: opt_num("max_position_embeddings").unwrap_or(2048),
        rms_eps: float("rms_norm_eps").unwrap_or(1e-5),
        rope_theta: float("rope_theta").unwrap_or(10_000.0),
        rope_theta_local: 10_000.0,
        sliding_window: None,
        sliding_window_pattern: 1,
        vocab_size: num("vocab_size")?,
        rope_freq_scale: 1.0,
        rope_attn_factor: 1.0,
        pooling: None,
        arch_name,
    };
    hp.validate()?;
    Ok(hp)
}

fn read_json(path: &Path) -> Result<serde_json::Value, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| Error::metadata(path.display().to_string(), e))
}

/// The `*.safetensors` files of a checkpoint folder, sorted (shards in order).
fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let io = |source| Error::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::WeightsNotFound {
            path: dir.join("model.safetensors"),
            hint: FETCH_HINT.to_string(),
        });
    }
    Ok(files)
}

fn load_safetensors(
    dir: &Path,
    cfg: &TextModelConfig,
    device: &Device,
) -> Result<TextModel, Error> {
    let hp = hparams_from_config(&read_json(&dir.join("config.json"))?)?;
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    let mut bytes = 0u64;
    for f in safetensors_files(dir)? {
        bytes += std::fs::metadata(&f).map(|m| m.len()).unwrap_or(0);
        tensors
            .extend(candle_core::safetensors::load(&f, &Device::Cpu).map_err(|e| e.with_path(&f))?);
    }
    let tokenizer_json = cfg
        .tokenizer
        .clone()
        .unwrap_or_else(|| dir.join("tokenizer.json"));
    let tokenizer = crate::tokenizer::from_files(&tokenizer_json, cfg.chat_template.as_deref())?;
    let mut backend = crate::candle_llama::from_hf_tensors(tensors, hp.clone(), device)?;
    backend.configure(
        cfg.kv_precision,
        CandleModel::act_for(device, cfg.dtype),
        cfg.gpu,
    )?;
    TextModel::assemble(hp, Box::new(backend), tokenizer, bytes, cfg.threads)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Step;
    use crate::random::{tiny_hparams, tiny_tensors};

    #[test]
    fn a_missing_weights_file_names_the_file_and_the_fetch_script() {
        let err =
            TextModel::load(&TextModelConfig::local("/nonexistent/weights/x.gguf")).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("/nonexistent/weights/x.gguf") && msg.contains("scripts/fetch-weights.sh"),
            "{msg}"
        );
    }

    #[test]
    fn a_safetensors_checkpoint_loads_and_matches_the_same_weights_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let tiny = TextModel::tiny_random(11);
        let tok = tiny.tokenizer();
        let hp = tiny_hparams(tok.vocab_size());
        let tensors = tiny_tensors(&hp, 11).unwrap();
        candle_core::safetensors::save(&tensors, dir.path().join("model.safetensors")).unwrap();
        let config = serde_json::json!({
            "model_type": "llama", "hidden_size": hp.n_embd, "intermediate_size": hp.n_ff,
            "num_hidden_layers": hp.n_layer, "num_attention_heads": hp.n_head,
            "num_key_value_heads": hp.n_head_kv, "max_position_embeddings": hp.context_length,
            "rms_norm_eps": hp.rms_eps, "rope_theta": hp.rope_theta, "vocab_size": hp.vocab_size,
        });
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        crate::tokenizer::tiny_inner()
            .save(dir.path().join("tokenizer.json"), false)
            .unwrap();
        let config = serde_json::json!({ "eos_token": "<|endoftext|>", "chat_template": crate::template::CHATML_TEMPLATE });
        std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();

        let mut loaded = TextModel::load(&TextModelConfig::local(dir.path())).unwrap();
        let mut tiny = tiny;
        assert_eq!(loaded.info().architecture, "llama");
        let lt = loaded.tokenizer();
        let text = "<|im_start|>user\nhello world 42<|im_end|>";
        assert_eq!(lt.encode(text).unwrap(), tok.encode(text).unwrap());
        assert!(lt.is_stop(0) && lt.is_stop(2));
        let ids = tok.encode(text).unwrap();
        let mut a = tiny.new_sequence(32).unwrap();
        let mut b = loaded.new_sequence(32).unwrap();
        let la = tiny
            .forward(&mut [Step {
                seq: &mut a,
                tokens: &ids,
            }])
            .unwrap()
            .to_vec();
        let lb = loaded
            .forward(&mut [Step {
                seq: &mut b,
                tokens: &ids,
            }])
            .unwrap()
            .to_vec();
        assert_eq!(la, lb);
    }

    #[test]
    fn config_json_without_required_keys_is_a_typed_error() {
        let err = hparams_from_config(&serde_json::json!({"model_type": "llama"})).unwrap_err();
        assert!(matches!(err, Error::Metadata { .. }), "{err}");
        let err = hparams_from_config(&serde_json::json!({"model_type": "bert"})).unwrap_err();
        assert!(matches!(err, Error::UnsupportedArchitecture(_)));
    }
}
