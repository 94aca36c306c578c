//! XMP metadata of an image: the title, description, authors, dates and keywords that editors
//! and cameras' software write as an XMP packet (and that EXIF rarely carries). The packet is
//! found where each format keeps it: a JPEG APP1 segment, a PNG `iTXt` chunk (deflated or not),
//! and, for the other formats (WebP, TIFF, GIF), wherever the `<x:xmpmeta>` element sits in the
//! file. Parsed with the converters' bounded XML reader; the first values of each property are
//! kept, each cut to a sensible length.

use std::io::Read;

use crate::detect::Format;
use crate::limits::Ctx;
use crate::xml::{self, Element};

/// JPEG's APP1 namespace for an XMP packet.
const JPEG_XMP: &[u8] = b"http://ns.adobe.com/xap/1.0/\0";
/// PNG's iTXt keyword for an XMP packet.
const PNG_XMP: &[u8] = b"XML:com.adobe.xmp";
/// Most bytes a packet (inflated) may take: XMP written by tools is kilobytes.
const MAX_PACKET: u64 = 4 << 20;
/// Most characters a value, and most entries a list, keeps.
const MAX_VALUE: usize = 500;
const MAX_ITEMS: usize = 20;

/// The properties a document reader wants, as the packet gives them.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Xmp {
    pub title: Option<String>,
    pub description: Option<String>,
    pub authors: Vec<String>,
    pub created: Option<String>,
    pub modified: Option<String>,
    pub keywords: Vec<String>,
}

impl Xmp {
    /// `(property, value)` rows for the image's table, in a fixed order.
    pub fn rows(&self) -> Vec<(&'static str, String)> {
        let lists = [(&self.authors, "Author"), (&self.keywords, "Keywords")];
        let [authors, keywords] =
            lists.map(|(l, name)| (!l.is_empty()).then(|| (name, l.join(", "))));
        [
            self.title.clone().map(|v| ("Title", v)),
            self.description.clone().map(|v| ("Description", v)),
            authors,
            self.created.clone().map(|v| ("Created", v)),
            self.modified.clone().map(|v| ("Modified", v)),
            keywords,
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// The image's XMP properties, or `None` when it has no readable packet (a packet that does not
/// parse is a warning, never an error: the image converts without it).
pub fn read(ctx: &Ctx<'_>, bytes: &[u8]) -> Option<Xmp> {
    let packet = packet(bytes)?;
    match xml::parse(ctx, Format::Image, &packet) {
        Ok(root) => Some(properties(&root)).filter(|x| *x != Xmp::default()),
        Err(e) => {
            ctx.warn(format!("the image's XMP metadata is unreadable: {e}"));
            None
        }
    }
}

/// The XMP packet's bytes, from where the format keeps it.
fn packet(bytes: &[u8]) -> Option<Vec<u8>> {
    if bytes.starts_with(&[0xFF, 0xD8]) {
        return jpeg_packet(bytes).map(<[u8]>::to_vec);
    }
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        return png_packet(bytes);
    }
    embedded_packet(bytes).map(<[u8]>::to_vec)
}

/// The APP1 segment holding XMP, walking the segments before the image data.
fn jpeg_packet(bytes: &[u8]) -> Option<&[u8]> {
    let mut at = 2;
    while at + 4 <= bytes.len() && bytes[at] == 0xFF {
        let marker = bytes[at + 1];
        if marker == 0xD8 || marker == 0x01 || (0xD0..=0xD7).contains(&marker) {
            at += 2; // markers without a length
            continue;
        }
        if marker == 0xDA || marker == 0xD9 {
            return None; // the image data, or the end: no XMP before it
        }
        let len = u16::from_be_bytes([bytes[at + 2], bytes[at + 3]]) as usize;
        let body = bytes.get(at + 4..at + 2 + len.max(2))?;
        if marker == 0xE1 && body.starts_with(JPEG_XMP) {
            return Some(&body[JPEG_XMP.len()..]);
        }
        at += 2 + len.max(2);
    }
    None
}

/// The `iTXt` chunk keyed `XML:com.adobe.xmp`, inflated when its compression flag says so.
fn png_packet(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut at = 8;
    while at + 12 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[at..at + 4].try_into().ok()?) as usize;
        let kind = &bytes[at + 4..at + 8];
        let data = bytes.get(at + 8..(at + 8).checked_add(len)?)?;
        if kind == b"IEND" {
            return None;
        }
        if kind == b"iTXt" && data.starts_with(PNG_XMP) && data.get(PNG_XMP.len()) == Some(&0) {
            // keyword \0, compression flag, method, language \0, translated keyword \0, text
            let rest = &data[PNG_XMP.len() + 1..];
            let (&compressed, rest) = rest.split_first()?;
            let rest = rest.get(1..)?;
            let lang_end = rest.iter().position(|&b| b == 0)?;
            let rest = &rest[lang_end + 1..];
            let key_end = rest.iter().position(|&b| b == 0)?;
            let text = &rest[key_end + 1..];
            if compressed == 0 {
                return Some(text.to_vec());
            }
            let mut out = Vec::new();
            flate2::read::ZlibDecoder::new(text)
                .take(MAX_PACKET)
                .read_to_end(&mut out)
                .ok()?;
            return Some(out);
        }
        at += 12 + len;
    }
    None
}

/// `<x:xmpmeta ...>...</x:xmpmeta>` wherever it is in the file (WebP's `XMP ` chunk, TIFF's tag
/// 700, GIF's application extension all keep the packet as plain bytes).
fn embedded_packet(bytes: &[u8]) -> Option<&[u8]> {
    let find = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).position(|w| w == needle);
    let start = find(bytes, b"<x:xmpmeta")?;
    let end = start + find(&bytes[start..], b"</x:xmpmeta>")? + b"</x:xmpmeta>".len();
    (end - start <= MAX_PACKET as usize).then(|| &bytes[start..end])
}

/// The properties from the RDF tree: each as an element (`<dc:title><rdf:Alt><rdf:li>`) or as
/// an attribute of an `rdf:Description` (`xmp:CreateDate="..."`).
fn properties(root: &Element) -> Xmp {
    let mut descriptions = Vec::new();
    root.find_all("Description", &mut descriptions);
    let values = |names: &[&str]| -> Vec<String> {
        let mut out = Vec::new();
        for d in &descriptions {
            for name in names {
                if let Some(v) = d.attr(name) {
                    out.push(v.to_string());
                }
                let mut found = Vec::new();
                d.find_all(name, &mut found);
                for e in found {
                    let mut items = Vec::new();
                    e.find_all("li", &mut items);
                    if items.is_empty() {
                        out.push(e.text());
                    } else {
                        out.extend(items.iter().map(|li| li.text()));
                    }
                }
            }
        }
        let mut clean: Vec<String> = Vec::new();
        for v in out {
            let v: String = v.split_whitespace().collect::<Vec<_>>().join(" ");
            let v: String = v.chars().take(MAX_VALUE).collect();
            if !v.is_empty() && !clean.contains(&v) && clean.len() < MAX_ITEMS {
                clean.push(v);
            }
        }
        clean
    };
    let first = |names: &[&str]| values(names).into_iter().next();
    Xmp {
        title: first(&["title"]),
        description: first(&["description"]),
        authors: values(&["creator", "Author"]),
        created: first(&["CreateDate", "DateCreated", "date"]),
        modified: first(&["ModifyDate", "MetadataDate"]),
        keywords: values(&["subject", "Keywords"]),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::limits::{Budget, Limits};

    pub(crate) const PACKET: &str = r#"<?xpacket begin="" id="W5M0MpCehiHzreSzNTczkc9d"?>
<x:xmpmeta xmlns:x="adobe:ns:meta/">
 <rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">
  <rdf:Description rdf:about="" xmlns:dc="http://purl.org/dc/elements/1.1/"
    xmlns:xmp="http://ns.adobe.com/xap/1.0/" xmlns:pdf="http://ns.adobe.com/pdf/1.3/"
    xmp:CreateDate="2019-05-04T10:20:30Z" pdf:Author="Ada Lovelace">
   <dc:title><rdf:Alt><rdf:li xml:lang="x-default">Harbour at dusk</rdf:li></rdf:Alt></dc:title>
   <dc:description><rdf:Alt><rdf:li xml:lang="x-default">Boats &amp; a lighthouse</rdf:li></rdf:Alt></dc:description>
   <dc:creator><rdf:Seq><rdf:li>Jean Dupré</rdf:li><rdf:li>Ada Lovelace</rdf:li></rdf:Seq></dc:creator>
   <dc:subject><rdf:Bag><rdf:li>harbour</rdf:li><rdf:li>sea</rdf:li></rdf:Bag></dc:subject>
   <xmp:ModifyDate>2020-01-02T03:04:05Z</xmp:ModifyDate>
  </rdf:Description>
 </rdf:RDF>
</x:xmpmeta>
<?xpacket end="w"?>"#;

    fn read_with_budget(bytes: &[u8]) -> Option<Xmp> {
        let budget = Budget::new(Limits::default());
        read(
            &Ctx {
                budget: &budget,
                depth: 0,
            },
            bytes,
        )
    }

    fn expected() -> Xmp {
        Xmp {
            title: Some("Harbour at dusk".into()),
            description: Some("Boats & a lighthouse".into()),
            authors: vec!["Jean Dupré".into(), "Ada Lovelace".into()],
            created: Some("2019-05-04T10:20:30Z".into()),
            modified: Some("2020-01-02T03:04:05Z".into()),
            keywords: vec!["harbour".into(), "sea".into()],
        }
    }

    pub(crate) fn jpeg_with(packet: &[u8]) -> Vec<u8> {
        let mut app1 = JPEG_XMP.to_vec();
        app1.extend_from_slice(packet);
        let mut jpeg = vec![0xFF, 0xD8, 0xFF, 0xE0, 0, 4, 0, 0]; // SOI, a 2-byte APP0
        jpeg.extend_from_slice(&[0xFF, 0xE1]);
        jpeg.extend_from_slice(&((app1.len() + 2) as u16).to_be_bytes());
        jpeg.extend_from_slice(&app1);
        // SOF0: 8 bits, 5 rows, 7 columns, one component.
        jpeg.extend_from_slice(&[0xFF, 0xC0, 0, 11, 8, 0, 5, 0, 7, 1, 1, 0x11, 0]);
        jpeg.extend_from_slice(&[0xFF, 0xDA, 0, 2, 0xFF, 0xD9]);
        jpeg
    }

    pub(crate) fn png_with(packet: &[u8], compressed: bool) -> Vec<u8> {
        let chunk = |kind: &[u8], data: &[u8]| {
            let mut c = (data.len() as u32).to_be_bytes().to_vec();
            c.extend_from_slice(kind);
            c.extend_from_slice(data);
            c.extend_from_slice(&[0; 4]); // CRC: not checked here
            c
        };
        let mut ihdr = 3u32.to_be_bytes().to_vec();
        ihdr.extend_from_slice(&2u32.to_be_bytes());
        ihdr.extend_from_slice(&[8, 6, 0, 0, 0]);
        let mut itxt = PNG_XMP.to_vec();
        itxt.extend_from_slice(&[0, compressed as u8, 0, 0, 0]);
        if compressed {
            use std::io::Write;
            let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            z.write_all(packet).unwrap();
            itxt.extend_from_slice(&z.finish().unwrap());
        } else {
            itxt.extend_from_slice(packet);
        }
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        png.extend(chunk(b"IHDR", &ihdr));
        png.extend(chunk(b"IDAT", &[0; 10]));
        png.extend(chunk(b"iTXt", &itxt)); // after the pixels, as editors often put it
        png.extend(chunk(b"IEND", &[]));
        png
    }

    #[test]
    fn a_jpeg_app1_packet_gives_title_description_authors_dates_and_keywords() {
        assert_eq!(
            read_with_budget(&jpeg_with(PACKET.as_bytes())),
            Some(expected())
        );
    }

    #[test]
    fn a_png_itxt_packet_is_read_plain_and_deflated() {
        for compressed in [false, true] {
            assert_eq!(
                read_with_budget(&png_with(PACKET.as_bytes(), compressed)),
                Some(expected()),
                "compressed: {compressed}"
            );
        }
    }

    #[test]
    fn other_formats_are_searched_for_the_packet() {
        let mut webp = b"RIFF\0\0\0\0WEBPXMP ".to_vec();
        webp.extend_from_slice(&(PACKET.len() as u32).to_le_bytes());
        webp.extend_from_slice(PACKET.as_bytes());
        assert_eq!(read_with_budget(&webp), Some(expected()));
    }

    #[test]
    fn missing_truncated_or_hostile_packets_give_nothing_and_never_panic() {
        assert_eq!(read_with_budget(&jpeg_with(b"")), None);
        assert_eq!(read_with_budget(b"\xFF\xD8\xFF\xE1\xFF\xFF"), None);
        let full = jpeg_with(PACKET.as_bytes());
        for cut in [3, 10, 40, full.len() / 2] {
            let _ = read_with_budget(&full[..cut]);
        }
        let png = png_with(PACKET.as_bytes(), true);
        for cut in [9, 20, 40, png.len() - 20] {
            let _ = read_with_budget(&png[..cut]);
        }
        // A chunk length past the end of the file.
        let mut bad = b"\x89PNG\r\n\x1a\n\xFF\xFF\xFF\xF0iTXt".to_vec();
        bad.extend_from_slice(&[0; 16]);
        assert_eq!(read_with_budget(&bad), None);
        // A deflate bomb in the iTXt chunk stops at the packet cap.
        let zeros = vec![b' '; 64 << 20];
        let bomb = png_with(&zeros, true);
        assert!(bomb.len() < 1 << 20, "the bomb is small on disk");
        assert_eq!(read_with_budget(&bomb), None);
        // An entity expansion attempt stays as text, not a billion laughs.
        let laughs = PACKET.replace(
            "Harbour at dusk",
            "&lol9;<!DOCTYPE x [<!ENTITY lol \"lol\"><!ENTITY lol9 \"&lol;&lol;\">]>",
        );
        if let Some(got) = read_with_budget(&jpeg_with(laughs.as_bytes())) {
            assert!(got.title.unwrap_or_default().len() < 200);
        }
    }
}
