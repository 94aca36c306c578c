//! Character set detection and decoding (chardetng + encoding_rs).

use encoding_rs::{Encoding, UTF_16BE, UTF_16LE, UTF_8};

/// Decodes bytes of unknown encoding: a byte-order mark wins, then valid UTF-8, then the
/// encoding chardetng guesses (so Latin-1 and Windows-1252 files do not turn into mojibake).
pub fn decode(bytes: &[u8]) -> String {
    decode_with_label(bytes).0
}

/// As [`decode`], also naming the encoding used.
pub fn decode_with_label(bytes: &[u8]) -> (String, &'static Encoding) {
    if let Some((enc, bom_len)) = Encoding::for_bom(bytes) {
        let (text, _) = enc.decode_without_bom_handling(&bytes[bom_len..]);
        return (text.into_owned(), enc);
    }
    if let Ok(s) = std::str::from_utf8(bytes) {
        return (s.to_string(), UTF_8);
    }
    // A truncated head may end inside a UTF-8 sequence: accept that too.
    if let Err(e) = std::str::from_utf8(bytes) {
        if e.error_len().is_none() && e.valid_up_to() + 4 > bytes.len() && e.valid_up_to() > 0 {
            return (String::from_utf8_lossy(bytes).into_owned(), UTF_8);
        }
    }
    if let Some(enc) = utf16_without_bom(bytes) {
        let (text, _) = enc.decode_without_bom_handling(bytes);
        return (text.into_owned(), enc);
    }
    let mut detector = chardetng::EncodingDetector::new(chardetng::Iso2022JpDetection::Deny);
    detector.feed(bytes, true);
    let enc = detector.guess(None, chardetng::Utf8Detection::Allow);
    let (text, _) = enc.decode_without_bom_handling(bytes);
    (text.into_owned(), enc)
}

/// UTF-16 without a BOM: every other byte zero in ASCII-heavy text.
fn utf16_without_bom(bytes: &[u8]) -> Option<&'static Encoding> {
    let n = bytes.len().min(512) & !1;
    if n < 4 {
        return None;
    }
    let pairs = bytes[..n].chunks_exact(2);
    let (mut even_zero, mut odd_zero) = (0, 0);
    for p in pairs {
        if p[0] == 0 {
            even_zero += 1;
        }
        if p[1] == 0 {
            odd_zero += 1;
        }
    }
    let half = n / 2;
    if odd_zero * 10 > half * 8 && even_zero == 0 {
        Some(UTF_16LE)
    } else if even_zero * 10 > half * 8 && odd_zero == 0 {
        Some(UTF_16BE)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latin1_bytes_decode_to_accented_letters_not_mojibake() {
        let bytes =
            b"Caf\xe9 cr\xe8me br\xfbl\xe9e, \xe0 la fran\xe7aise, na\xefve et d\xe9j\xe0 vu";
        let text = decode(bytes);
        assert_eq!(text, "Café crème brûlée, à la française, naïve et déjà vu");
    }

    #[test]
    fn utf16_with_bom_decodes() {
        let mut bytes = vec![0xFF, 0xFE];
        for u in "Grüße".encode_utf16() {
            bytes.extend_from_slice(&u.to_le_bytes());
        }
        assert_eq!(decode(&bytes), "Grüße");
    }

    #[test]
    fn utf8_passes_through() {
        assert_eq!(decode("naïve — ok".as_bytes()), "naïve — ok");
    }
}
