//! The exact bytes of each token, for grammars (a token trie) and log-probabilities.
//!
//! Vocabulary strings are not bytes: byte-level BPE writes each byte as a printable character
//! (GPT-2's map, `Ġ` for a space), SentencePiece writes a space as `▁` and bytes it has no piece
//! for as `<0xNN>` tokens. Added tokens (control tokens, user-defined ones) are plain text.

use tokenizers::{DecoderWrapper, Tokenizer};

/// How the model's vocabulary strings spell bytes, read off the tokenizer's decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenFormat {
    /// GPT-2 byte-level BPE: every character stands for one byte.
    ByteLevel,
    /// SentencePiece: `replacement` (usually `▁`) is a space, `<0xNN>` is the byte 0xNN.
    SentencePiece { replacement: char },
    /// Anything else (WordPiece, plain BPE): the string's UTF-8 bytes.
    Plain,
}

impl TokenFormat {
    pub(crate) fn of(tokenizer: &Tokenizer) -> TokenFormat {
        fn of_decoder(d: &DecoderWrapper) -> Option<TokenFormat> {
            match d {
                DecoderWrapper::ByteLevel(_) => Some(TokenFormat::ByteLevel),
                DecoderWrapper::Metaspace(m) => Some(TokenFormat::SentencePiece {
                    replacement: m.get_replacement(),
                }),
                DecoderWrapper::ByteFallback(_) | DecoderWrapper::Replace(_) => {
                    Some(TokenFormat::SentencePiece { replacement: '▁' })
                }
                DecoderWrapper::Sequence(seq) => {
                    let found: Vec<TokenFormat> =
                        seq.get_decoders().iter().filter_map(of_decoder).collect();
                    // Byte-level wins over a stray Replace; a Metaspace names its replacement.
                    found
                        .iter()
                        .find(|f| **f == TokenFormat::ByteLevel)
                        .or_else(|| {
                            found.iter().find(|f| {
                                matches!(f, TokenFormat::SentencePiece { replacement } if *replacement != '▁')
                            })
                        })
                        .or(found.first())
                        .copied()
                }
                _ => None,
            }
        }
        tokenizer
            .get_decoder()
            .and_then(of_decoder)
            .unwrap_or(TokenFormat::Plain)
    }

    /// The bytes a model vocabulary string stands for.
    pub(crate) fn bytes(self, piece: &str) -> Vec<u8> {
        match self {
            TokenFormat::ByteLevel => {
                let mut out = Vec::with_capacity(piece.len());
                for c in piece.chars() {
                    match char_to_byte(c) {
                        Some(b) => out.push(b),
                        // Not from the byte map (a hand-made vocabulary): keep the character.
                        None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                    }
                }
                out
            }
            TokenFormat::SentencePiece { replacement } => {
                if let Some(b) = byte_token(piece) {
                    return vec![b];
                }
                let mut buf = [0; 4];
                let mut out = Vec::with_capacity(piece.len());
                for c in piece.chars() {
                    let c = if c == replacement { ' ' } else { c };
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                out
            }
            TokenFormat::Plain => piece.as_bytes().to_vec(),
        }
    }
}

/// `<0xNN>` → the byte NN.
fn byte_token(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Whether GPT-2's byte map writes byte `b` as the character with the same number.
const fn printable(b: u8) -> bool {
    (b >= b'!' && b <= b'~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE)
}

/// The inverse of [`super::byte_to_char`]: characters 0..=0xFF that are printable stand for
/// themselves, the others (68 of them) were moved to U+0100.. in byte order.
const CHAR_TO_BYTE: [u8; 324] = {
    let mut table = [0u8; 324];
    let mut moved = 0;
    let mut b = 0;
    while b < 256 {
        if printable(b as u8) {
            table[b] = b as u8;
        } else {
            table[256 + moved] = b as u8;
            moved += 1;
        }
        b += 1;
    }
    table
};

fn char_to_byte(c: char) -> Option<u8> {
    let i = c as usize;
    match i {
        0..=255 if printable(i as u8) => Some(i as u8),
        256..=323 => Some(CHAR_TO_BYTE[i]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{byte_to_char, sentencepiece_bpe, TOKEN_TYPE_CONTROL};
    use crate::tokenizer::{TextTokenizer, TokenizerParts};

    #[test]
    fn the_byte_map_inverts() {
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b), "byte {b}");
        }
        assert_eq!(char_to_byte('é'), Some(0xE9));
        assert_eq!(char_to_byte('\u{7F}'), None);
    }

    #[test]
    fn sentencepiece_pieces_become_spaces_and_bytes() {
        let sp = TokenFormat::SentencePiece { replacement: '▁' };
        assert_eq!(sp.bytes("▁the"), b" the");
        assert_eq!(sp.bytes("<0x0A>"), b"\n");
        assert_eq!(sp.bytes("<0xE2>"), [0xE2]);
        assert_eq!(sp.bytes("<0xZZ>"), b"<0xZZ>");
        assert_eq!(TokenFormat::ByteLevel.bytes("Ġhello"), b" hello");
    }

    const SAMPLES: &[&str] = &[
        "Hello world",
        "  leading and trailing spaces  ",
        "tabs\tand\nnew\n\nlines\r\n",
        "Accents: café, naïve, Ærøskøbing",
        "Emoji: 🦀🔥👩‍👩‍👧 ok",
        "CJK: 你好，世界。こんにちは",
        "{\"key\": [1, 2.5, true, null]}",
    ];

    /// Concatenated token bytes of `encode_plain(text)` are the text's bytes.
    fn assert_round_trips(tok: &TextTokenizer) {
        for s in SAMPLES {
            let ids = tok.encode_plain(s).unwrap();
            let bytes: Vec<u8> = ids.iter().flat_map(|&id| tok.token_bytes(id)).collect();
            assert_eq!(String::from_utf8_lossy(&bytes), *s, "ids {ids:?}");
        }
    }

    #[test]
    fn token_bytes_round_trip_with_byte_level_bpe() {
        let tok = crate::tokenizer::tiny();
        assert_round_trips(&tok);
        assert!(tok.is_special(0) && tok.token_bytes(2) == b"<|im_end|>");
        assert!(!tok.is_special(tok.token_to_id("hello").unwrap()));
    }

    #[test]
    fn token_bytes_round_trip_with_sentencepiece() {
        // Every byte as a <0xNN> token, a few pieces with `▁`, and a control token.
        let mut tokens: Vec<String> = vec!["<unk>".into(), "</s>".into()];
        tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
        for piece in [
            "▁", "e", "l", "o", "H", "▁w", "or", "ld", "▁world", "ll", "▁Hello",
        ] {
            tokens.push(piece.into());
        }
        let mut types = vec![1; tokens.len()];
        types[1] = TOKEN_TYPE_CONTROL;
        let scores: Vec<f32> = (0..tokens.len()).map(|i| i as f32).collect();
        let inner = sentencepiece_bpe(&tokens, &types, &scores, Some(0), false).unwrap();
        let tok = TextTokenizer::from_parts(TokenizerParts {
            inner,
            template_source: crate::template::CHATML_TEMPLATE.to_string(),
            bos_id: None,
            add_bos: false,
            eos_id: Some(1),
            extra_stop_ids: Vec::new(),
        })
        .unwrap();
        assert_round_trips(&tok);
        assert!(tok.is_special(1));
        let world = tok.token_to_id("▁world").unwrap();
        assert_eq!(tok.token_bytes(world), b" world");
    }
}
