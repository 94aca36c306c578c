//! Rebuilding a `tokenizers` tokenizer from GGUF metadata (`tokenizer.ggml.*`): byte-level BPE
//! (`gpt2`) and SentencePiece BPE (`llama`).

use super::*;
use candle_core::quantized::gguf_file;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior,
    Tokenizer,
};

pub(super) fn special_added_tokens(tokens: &[String], types: &[i32]) -> Vec<AddedToken> {
    tokens
        .iter()
        .zip(types)
        .filter(|(_, &t)| t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED)
        .filter(|(s, _)| !s.is_empty())
        .map(|(s, &t)| AddedToken::from(s.clone(), t == TOKEN_TYPE_CONTROL).normalized(false))
        .collect()
}

pub(super) fn split_regex(pattern: &str) -> Result<PreTokenizerWrapper, Error> {
    let split = Split::new(
        SplitPattern::Regex(pattern.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(Error::tokenizer)?;
    Ok(split.into())
}

/// The pre-tokenizer llama.cpp uses for a `tokenizer.ggml.pre` value.
pub(super) fn byte_level_pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper, Error> {
    let byte_level_no_regex: PreTokenizerWrapper = ByteLevel::new(false, true, false).into();
    Ok(match pre {
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            PreSequence::new(vec![
                Digits::new(true).into(),
                ByteLevel::new(false, true, true).into(),
            ])
            .into()
        }
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "smaug-bpe" => {
            PreSequence::new(vec![split_regex(LLAMA3_REGEX)?, byte_level_no_regex]).into()
        }
        "qwen2" | "deepseek-r1-qwen" | "qwen35" => {
            PreSequence::new(vec![split_regex(QWEN2_REGEX)?, byte_level_no_regex]).into()
        }
        "default" | "gpt2" | "gpt-2" | "" => {
            PreSequence::new(vec![split_regex(GPT2_REGEX)?, byte_level_no_regex]).into()
        }
        other => {
            tracing::warn!(
                pre = other,
                "unknown tokenizer.ggml.pre, using the GPT-2 split"
            );
            PreSequence::new(vec![split_regex(GPT2_REGEX)?, byte_level_no_regex]).into()
        }
    })
}

/// Byte-level BPE from a vocabulary (in byte-level form, e.g. `Ġthe`) and merges.
pub(crate) fn byte_level_bpe(
    tokens: &[String],
    types: &[i32],
    merges: Vec<(String, String)>,
    pre: &str,
) -> Result<Tokenizer, Error> {
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(Error::tokenizer)?;
    let mut tk = Tokenizer::new(bpe);
    tk.with_pre_tokenizer(Some(byte_level_pre_tokenizer(pre)?));
    tk.with_decoder(Some(ByteLevel::new(false, true, true)));
    tk.add_special_tokens(&special_added_tokens(tokens, types));
    Ok(tk)
}

/// SentencePiece-style BPE (GGUF `llama` model) from tokens and scores.
pub(super) fn sentencepiece_bpe(
    tokens: &[String],
    types: &[i32],
    scores: &[f32],
    unk_id: Option<u32>,
    add_space_prefix: bool,
) -> Result<Tokenizer, Error> {
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    // Every normal token that splits into two vocabulary tokens gives a merge, ranked by the
    // merged token's score (higher first), as SentencePiece's BPE picks the best-scoring pair.
    let mut ranked: Vec<(f32, u32, u32, u32)> = Vec::new();
    for (id, tok) in tokens.iter().enumerate() {
        if types.get(id).copied().unwrap_or(TOKEN_TYPE_NORMAL) != TOKEN_TYPE_NORMAL
            || tok.chars().count() < 2
        {
            continue;
        }
        for (split, _) in tok.char_indices().skip(1) {
            let (l, r) = tok.split_at(split);
            if let (Some(&li), Some(&ri)) = (vocab.get(l), vocab.get(r)) {
                ranked.push((scores.get(id).copied().unwrap_or(0.0), id as u32, li, ri));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let merges: Vec<(String, String)> = ranked
        .iter()
        .map(|&(_, _, l, r)| (tokens[l as usize].clone(), tokens[r as usize].clone()))
        .collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = unk_id.and_then(|u| tokens.get(u as usize)) {
        builder = builder.unk_token(unk.clone());
    }
    let bpe = builder.build().map_err(Error::tokenizer)?;
    let mut tk = Tokenizer::new(bpe);
    let replace: NormalizerWrapper = Replace::new(" ", "▁").map_err(Error::tokenizer)?.into();
    if add_space_prefix {
        tk.with_normalizer(Some(tokenizers::normalizers::Sequence::new(vec![
            Prepend::new("▁".to_string()).into(),
            replace,
        ])));
    } else {
        tk.with_normalizer(Some(replace));
    }
    let mut decoders: Vec<DecoderWrapper> = vec![
        tokenizers::normalizers::Replace::new("▁", " ")
            .map_err(Error::tokenizer)?
            .into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tk.with_decoder(Some(DecoderSequence::new(decoders)));
    tk.add_special_tokens(&special_added_tokens(tokens, types));
    Ok(tk)
}

/// Builds the tokenizer from GGUF metadata. `template_override` wins over the file's template.
pub(crate) fn from_gguf(
    content: &gguf_file::Content,
    template_override: Option<&str>,
) -> Result<TextTokenizer, Error> {
    let meta = Meta(content);
    let model = meta.string("tokenizer.ggml.model")?;
    let tokens = meta.string_array("tokenizer.ggml.tokens")?;
    let types = meta
        .opt_i32_array("tokenizer.ggml.token_type")?
        .unwrap_or_else(|| vec![TOKEN_TYPE_NORMAL; tokens.len()]);
    let bos_id = meta.opt_u32("tokenizer.ggml.bos_token_id")?;
    let eos_id = meta.opt_u32("tokenizer.ggml.eos_token_id")?;
    let eot_id = meta.opt_u32("tokenizer.ggml.eot_token_id")?;
    let unk_id = meta.opt_u32("tokenizer.ggml.unknown_token_id")?;
    let (inner, default_add_bos) = match model.as_str() {
        "gpt2" => {
            let merges = meta
                .string_array("tokenizer.ggml.merges")?
                .into_iter()
                .map(|m| match m.split_once(' ') {
                    Some((a, b)) => Ok((a.to_string(), b.to_string())),
                    None => Err(Error::metadata(
                        "tokenizer.ggml.merges",
                        format!("merge {m:?} has no space"),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?;
            let pre = meta.opt_string("tokenizer.ggml.pre")?.unwrap_or_default();
            (byte_level_bpe(&tokens, &types, merges, &pre)?, false)
        }
        "llama" => {
            let scores = meta
                .opt_f32_array("tokenizer.ggml.scores")?
                .unwrap_or_default();
            let add_space_prefix = meta
                .opt_bool("tokenizer.ggml.add_space_prefix")?
                .unwrap_or(true);
            (
                sentencepiece_bpe(&tokens, &types, &scores, unk_id, add_space_prefix)?,
                true,
            )
        }
        other => {
            return Err(Error::Tokenizer(format!(
                "unsupported GGUF tokenizer model {other:?} (gpt2 and llama are)"
            )))
        }
    };
    let add_bos = meta
        .opt_bool("tokenizer.ggml.add_bos_token")?
        .unwrap_or(default_add_bos);
    let template_source = match template_override {
        Some(t) => t.to_string(),
        None => meta
            .opt_string("tokenizer.chat_template")?
            .unwrap_or_else(|| {
                tracing::warn!("the model has no chat template; using ChatML");
                crate::template::CHATML_TEMPLATE.to_string()
            }),
    };
    TextTokenizer::from_parts(TokenizerParts {
        inner,
        template_source,
        bos_id,
        add_bos,
        eos_id,
        extra_stop_ids: eot_id.into_iter().collect(),
    })
}
