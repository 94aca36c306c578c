//! CLIP's byte-level BPE tokenizer, read from the `vocab.json` + `merges.txt` pair that the
//! diffusers layout ships in `tokenizer/` and `tokenizer_2/` (the SDXL repos carry no
//! `tokenizer.json`).
//!
//! Text is cleaned the way transformers' `CLIPTokenizer` does without `ftfy` (control characters
//! dropped, whitespace collapsed, CJK characters split, lower-cased), split with CLIP's pattern,
//! each piece byte-mapped and BPE-merged with `</w>` marking the end of a word. A sequence is
//! `<|startoftext|>`, at most `max_length - 2` tokens, `<|endoftext|>`, then padding to
//! `max_length` with the configured pad token (`<|endoftext|>` for CLIP ViT-L, `!` for ViT-bigG).

use std::collections::HashMap;
use std::path::Path;

use regex::Regex;
use serde_json::Value;

use crate::config::read_json;
use crate::error::{Error, Result};

const BOS: &str = "<|startoftext|>";
const EOS: &str = "<|endoftext|>";

/// A loaded CLIP tokenizer.
#[derive(Debug)]
pub struct ClipTokenizer {
    encoder: HashMap<String, u32>,
    ranks: HashMap<(String, String), usize>,
    byte_chars: [char; 256],
    pattern: Regex,
    bos: u32,
    eos: u32,
    pad: u32,
    max_length: usize,
}

impl ClipTokenizer {
    /// Loads `vocab.json`, `merges.txt` and (optionally) `tokenizer_config.json` /
    /// `special_tokens_map.json` from `dir`. `max_length` caps the sequence (77 for SDXL).
    pub fn from_dir(dir: &Path, max_length: usize) -> Result<Self> {
        let vocab_path = dir.join("vocab.json");
        let encoder: HashMap<String, u32> = read_json(&vocab_path)?;
        let merges_path = dir.join("merges.txt");
        let merges =
            std::fs::read_to_string(&merges_path).map_err(|e| Error::io(&merges_path, e))?;
        let mut ranks = HashMap::new();
        for (rank, line) in merges
            .lines()
            .filter(|l| !l.starts_with("#version") && !l.trim().is_empty())
            .enumerate()
        {
            let mut parts = line.split(' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(a), Some(b), None) => {
                    ranks.insert((a.to_string(), b.to_string()), rank);
                }
                _ => {
                    return Err(Error::config(
                        &merges_path,
                        format!("bad merge line {line:?}"),
                    ))
                }
            }
        }
        let pad_name = special_token(dir, "pad_token")?.unwrap_or_else(|| EOS.to_string());
        let id = |tok: &str| {
            encoder
                .get(tok)
                .copied()
                .ok_or_else(|| Error::config(&vocab_path, format!("token {tok:?} missing")))
        };
        let (bos, eos, pad) = (id(BOS)?, id(EOS)?, id(&pad_name)?);
        let pattern = Regex::new(
            r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|\p{L}+|\p{N}|[^\s\p{L}\p{N}]+",
        )
        .map_err(|e| Error::config(dir, e.to_string()))?;
        Ok(ClipTokenizer {
            encoder,
            ranks,
            byte_chars: bytes_to_unicode(),
            pattern,
            bos,
            eos,
            pad,
            max_length,
        })
    }

    /// Token ids of `text`, exactly `max_length` long (truncated, then padded).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let cleaned = clean_text(text);
        let mut ids = vec![self.bos];
        'outer: for m in self.pattern.find_iter(&cleaned) {
            let piece: String = m
                .as_str()
                .bytes()
                .map(|b| self.byte_chars[b as usize])
                .collect();
            for tok in self.bpe(&piece) {
                if ids.len() >= self.max_length - 1 {
                    break 'outer;
                }
                // Byte-level BPE covers every byte, so a miss only happens with a broken vocab.
                ids.push(self.encoder.get(&tok).copied().unwrap_or(self.eos));
            }
        }
        ids.push(self.eos);
        ids.resize(self.max_length, self.pad);
        ids
    }

    /// Id of `<|endoftext|>`.
    pub fn eos_id(&self) -> u32 {
        self.eos
    }

    fn bpe(&self, piece: &str) -> Vec<String> {
        let chars: Vec<char> = piece.chars().collect();
        let Some((last, init)) = chars.split_last() else {
            return vec![];
        };
        let mut word: Vec<String> = init.iter().map(|c| c.to_string()).collect();
        word.push(format!("{last}</w>"));
        loop {
            let best = word
                .windows(2)
                .filter_map(|w| {
                    self.ranks
                        .get(&(w[0].clone(), w[1].clone()))
                        .map(|r| (*r, w))
                })
                .min_by_key(|(r, _)| *r)
                .map(|(_, w)| (w[0].clone(), w[1].clone()));
            let Some((a, b)) = best else { break };
            let mut merged = Vec::with_capacity(word.len());
            let mut i = 0;
            while i < word.len() {
                if i + 1 < word.len() && word[i] == a && word[i + 1] == b {
                    merged.push(format!("{a}{b}"));
                    i += 2;
                } else {
                    merged.push(word[i].clone());
                    i += 1;
                }
            }
            word = merged;
            if word.len() == 1 {
                break;
            }
        }
        word
    }
}

/// Reads a special token's text from `tokenizer_config.json` or `special_tokens_map.json`
/// (either a plain string or an object with a `content` field).
fn special_token(dir: &Path, key: &str) -> Result<Option<String>> {
    for file in ["special_tokens_map.json", "tokenizer_config.json"] {
        let path = dir.join(file);
        if !path.exists() {
            continue;
        }
        let v: Value = read_json(&path)?;
        match v.get(key) {
            Some(Value::String(s)) => return Ok(Some(s.clone())),
            Some(Value::Object(o)) => {
                if let Some(Value::String(s)) = o.get("content") {
                    return Ok(Some(s.clone()));
                }
            }
            _ => {}
        }
    }
    Ok(None)
}

/// GPT-2/CLIP's reversible byte -> printable character table.
pub(crate) fn bytes_to_unicode() -> [char; 256] {
    let mut printable: Vec<u32> = ('!' as u32..='~' as u32).collect();
    printable.extend('¡' as u32..='¬' as u32);
    printable.extend('®' as u32..='ÿ' as u32);
    let mut table = ['\0'; 256];
    let mut extra = 0;
    for b in 0..256u32 {
        let c = if printable.contains(&b) {
            b
        } else {
            extra += 1;
            255 + extra
        };
        table[b as usize] = char::from_u32(c).unwrap_or('?');
    }
    table
}

/// The order of byte characters in a CLIP vocabulary: printable bytes first, then the rest.
pub(crate) fn byte_order() -> Vec<u8> {
    let mut printable: Vec<u8> = (b'!'..=b'~').collect();
    printable.extend(0xA1..=0xAC);
    printable.extend(0xAE..=0xFF);
    let rest: Vec<u8> = (0..=255u8).filter(|b| !printable.contains(b)).collect();
    printable.extend(rest);
    printable
}

fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F | 0x2B820..=0x2CEAF | 0xF900..=0xFAFF | 0x2F800..=0x2FA1F)
}

/// transformers' BasicTokenizer cleaning (the path `CLIPTokenizer` takes without ftfy).
fn clean_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\0' || c == '\u{FFFD}' {
            continue;
        }
        if c.is_whitespace() {
            out.push(' ');
        } else if c.is_control() {
            continue;
        } else if is_cjk(c) {
            out.push(' ');
            out.push(c);
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out.split_whitespace()
        .map(|w| w.to_lowercase())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_maps_printable_ascii_to_itself_and_is_a_bijection() {
        let t = bytes_to_unicode();
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[b' ' as usize], 'Ġ');
        let mut seen: Vec<char> = t.to_vec();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 256);
        // byte_order lists bytes in the vocabulary order of their characters.
        let order = byte_order();
        assert_eq!(order[0], b'!');
        assert_eq!(order.len(), 256);
    }

    #[test]
    fn cleaning_collapses_whitespace_and_lowercases() {
        assert_eq!(clean_text("  A  Red\tFox\n"), "a red fox");
        assert_eq!(clean_text("猫cat"), "猫 cat");
    }
}
