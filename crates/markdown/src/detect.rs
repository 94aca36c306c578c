//! The registry: which converter a file goes to, by content first and file name second.

use std::fmt;
use std::io::Cursor;

/// A format this library converts (or recognises well enough to refuse clearly).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    Pdf,
    Docx,
    Pptx,
    Xlsx,
    Xls,
    Ods,
    Odt,
    Epub,
    Zip,
    Msg,
    Eml,
    Rtf,
    Html,
    Xml,
    Json,
    Ipynb,
    Csv,
    Tsv,
    Markdown,
    Text,
    Image,
}

impl Format {
    /// Short lower-case name, as used in messages and benchmark tables.
    pub fn name(self) -> &'static str {
        match self {
            Format::Pdf => "pdf",
            Format::Docx => "docx",
            Format::Pptx => "pptx",
            Format::Xlsx => "xlsx",
            Format::Xls => "xls",
            Format::Ods => "ods",
            Format::Odt => "odt",
            Format::Epub => "epub",
            Format::Zip => "zip",
            Format::Msg => "msg",
            Format::Eml => "eml",
            Format::Rtf => "rtf",
            Format::Html => "html",
            Format::Xml => "xml",
            Format::Json => "json",
            Format::Ipynb => "ipynb",
            Format::Csv => "csv",
            Format::Tsv => "tsv",
            Format::Markdown => "markdown",
            Format::Text => "text",
            Format::Image => "image",
        }
    }

    /// The format a file extension (without the dot, any case) names.
    pub fn from_extension(ext: &str) -> Option<Format> {
        Some(match ext.to_ascii_lowercase().as_str() {
            "pdf" => Format::Pdf,
            "docx" | "docm" | "dotx" => Format::Docx,
            "pptx" | "pptm" | "potx" => Format::Pptx,
            "xlsx" | "xlsm" | "xlsb" | "xltx" => Format::Xlsx,
            "xls" | "xla" => Format::Xls,
            "ods" => Format::Ods,
            "odt" => Format::Odt,
            "epub" => Format::Epub,
            "zip" => Format::Zip,
            "msg" => Format::Msg,
            "eml" | "mht" | "mhtml" => Format::Eml,
            "rtf" => Format::Rtf,
            "html" | "htm" | "xhtml" => Format::Html,
            "xml" | "rss" | "atom" | "svg" => Format::Xml,
            "json" | "geojson" => Format::Json,
            "ipynb" => Format::Ipynb,
            "csv" => Format::Csv,
            "tsv" | "tab" => Format::Tsv,
            "md" | "markdown" => Format::Markdown,
            "txt" | "text" | "log" | "rst" => Format::Text,
            "png" | "jpg" | "jpeg" | "gif" | "bmp" | "webp" | "tif" | "tiff" | "heic" => {
                Format::Image
            }
            _ => return None,
        })
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the sniffing concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Detected {
    Known(Format),
    /// A container we recognise but do not convert (legacy `.doc`, `.ppt`, an executable ...).
    Refused(&'static str),
    Unknown,
}

fn extension(filename: Option<&str>) -> Option<Format> {
    let name = filename?;
    let (_, ext) = name.rsplit_once('.')?;
    Format::from_extension(ext)
}

/// Picks the format of `bytes`: magic numbers, then the members of zip and OLE containers,
/// then text sniffing; the file name's extension decides only where the content is ambiguous.
pub fn detect(bytes: &[u8], filename: Option<&str>) -> Detected {
    let by_ext = extension(filename);
    if bytes.starts_with(b"%PDF-") || (bytes.len() < 1024 && find(bytes, b"%PDF-").is_some()) {
        return Detected::Known(Format::Pdf);
    }
    if find(&bytes[..bytes.len().min(1024)], b"%PDF-").is_some() && by_ext == Some(Format::Pdf) {
        return Detected::Known(Format::Pdf);
    }
    if bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06") {
        return Detected::Known(sniff_zip(bytes, by_ext));
    }
    if bytes.starts_with(&[0xD0, 0xCF, 0x11, 0xE0, 0xA1, 0xB1, 0x1A, 0xE1]) {
        return sniff_cfb(bytes, by_ext);
    }
    if bytes.starts_with(b"{\\rtf") {
        return Detected::Known(Format::Rtf);
    }
    if is_image(bytes) {
        return Detected::Known(Format::Image);
    }
    if bytes.starts_with(b"MZ") || bytes.starts_with(b"\x7fELF") {
        return Detected::Refused("executable");
    }
    if looks_binary(bytes) {
        return match by_ext {
            // Image types whose magic we do not list are still handed to the image reader.
            Some(Format::Image) => Detected::Known(Format::Image),
            _ => Detected::Unknown,
        };
    }
    Detected::Known(sniff_text(bytes, by_ext))
}

fn sniff_zip(bytes: &[u8], by_ext: Option<Format>) -> Format {
    let Ok(archive) = zip::ZipArchive::new(Cursor::new(bytes)) else {
        return Format::Zip;
    };
    let has = |name: &str| archive.index_for_name(name).is_some();
    if has("word/document.xml") {
        return Format::Docx;
    }
    if has("ppt/presentation.xml") {
        return Format::Pptx;
    }
    if has("xl/workbook.xml") || has("xl/workbook.bin") {
        return Format::Xlsx;
    }
    // OpenDocument and EPUB put their media type first, stored, as the member `mimetype`.
    let mimetype = zip_mimetype(bytes);
    match mimetype.as_deref() {
        Some("application/epub+zip") => return Format::Epub,
        Some("application/vnd.oasis.opendocument.text") => return Format::Odt,
        Some("application/vnd.oasis.opendocument.spreadsheet") => return Format::Ods,
        _ => {}
    }
    if has("META-INF/container.xml") {
        return Format::Epub;
    }
    match by_ext {
        Some(f @ (Format::Odt | Format::Ods | Format::Epub))
            if has("content.xml") || f == Format::Epub =>
        {
            f
        }
        _ => Format::Zip,
    }
}

fn zip_mimetype(bytes: &[u8]) -> Option<String> {
    use std::io::Read;
    let mut archive = zip::ZipArchive::new(Cursor::new(bytes)).ok()?;
    let file = archive.by_name("mimetype").ok()?;
    let mut s = String::new();
    file.take(200).read_to_string(&mut s).ok()?;
    Some(s.trim().to_string())
}

fn sniff_cfb(bytes: &[u8], by_ext: Option<Format>) -> Detected {
    let Ok(file) = cfb::CompoundFile::open(Cursor::new(bytes)) else {
        return Detected::Unknown;
    };
    let mut is_msg = false;
    let mut is_xls = false;
    let mut is_doc = false;
    let mut is_ppt = false;
    for entry in file.read_root_storage() {
        let name = entry.name();
        if name.starts_with("__substg1.0_") || name.starts_with("__properties_version1.0") {
            is_msg = true;
        }
        match name {
            "Workbook" | "Book" => is_xls = true,
            "WordDocument" => is_doc = true,
            "PowerPoint Document" => is_ppt = true,
            "EncryptedPackage" => return Detected::Refused("password-protected Office document"),
            _ => {}
        }
    }
    if is_msg {
        Detected::Known(Format::Msg)
    } else if is_xls {
        Detected::Known(Format::Xls)
    } else if is_doc {
        Detected::Refused("legacy Word .doc (save it as .docx)")
    } else if is_ppt {
        Detected::Refused("legacy PowerPoint .ppt (save it as .pptx)")
    } else {
        match by_ext {
            Some(Format::Msg) => Detected::Known(Format::Msg),
            _ => Detected::Refused("OLE compound file of an unknown kind"),
        }
    }
}

fn is_image(b: &[u8]) -> bool {
    b.starts_with(b"\x89PNG\r\n\x1a\n")
        || b.starts_with(&[0xFF, 0xD8, 0xFF])
        || b.starts_with(b"GIF87a")
        || b.starts_with(b"GIF89a")
        || (b.starts_with(b"BM") && b.len() > 26 && b[6..10] == [0, 0, 0, 0])
        || (b.len() >= 12 && &b[..4] == b"RIFF" && &b[8..12] == b"WEBP")
        || b.starts_with(b"II*\0")
        || b.starts_with(b"MM\0*")
        || (b.len() >= 12
            && &b[4..8] == b"ftyp"
            && matches!(&b[8..12], b"heic" | b"heix" | b"avif" | b"mif1"))
}

/// Binary if a NUL byte shows up early, unless it is UTF-16 text with a byte-order mark.
fn looks_binary(b: &[u8]) -> bool {
    if b.starts_with(&[0xFF, 0xFE]) || b.starts_with(&[0xFE, 0xFF]) {
        return false;
    }
    let head = &b[..b.len().min(8192)];
    let controls = head
        .iter()
        .filter(|&&c| c == 0 || (c < 0x09) || (0x0E..0x1B).contains(&c))
        .count();
    head.contains(&0) || controls * 20 > head.len().max(1)
}

fn sniff_text(bytes: &[u8], by_ext: Option<Format>) -> Format {
    let head = crate::text::decode(&bytes[..bytes.len().min(16 * 1024)]);
    let trimmed = head.trim_start_matches('\u{feff}').trim_start();
    let lower: String = trimmed
        .chars()
        .take(512)
        .collect::<String>()
        .to_ascii_lowercase();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        if trimmed.starts_with('{') && lower.contains("\"cells\"")
            || (trimmed.contains("\"nbformat\"") && trimmed.contains("\"cells\""))
        {
            return Format::Ipynb;
        }
        if by_ext == Some(Format::Ipynb) {
            return Format::Ipynb;
        }
        if serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok() {
            return Format::Json;
        }
    }
    if lower.starts_with("<!doctype html")
        || lower.starts_with("<html")
        || (lower.starts_with('<')
            && (lower.contains("<html") || lower.contains("<body") || lower.contains("<head")))
    {
        return Format::Html;
    }
    if lower.starts_with("<?xml") || (lower.starts_with('<') && by_ext != Some(Format::Markdown)) {
        return match by_ext {
            Some(Format::Html) => Format::Html,
            _ => Format::Xml,
        };
    }
    if looks_like_email(trimmed) {
        return Format::Eml;
    }
    match by_ext {
        Some(f @ (Format::Csv | Format::Tsv | Format::Markdown | Format::Json | Format::Ipynb)) => {
            return f
        }
        Some(Format::Html) => return Format::Html,
        _ => {}
    }
    if let Some(delim) = crate::formats::csv::sniff_delimiter(trimmed) {
        if by_ext != Some(Format::Text) {
            return if delim == b'\t' {
                Format::Tsv
            } else {
                Format::Csv
            };
        }
    }
    if by_ext == Some(Format::Text) {
        return Format::Text;
    }
    if looks_like_markdown(trimmed) {
        Format::Markdown
    } else {
        Format::Text
    }
}

fn looks_like_email(text: &str) -> bool {
    let mut headers = 0;
    let mut known = 0;
    for line in text.lines().take(40) {
        if line.is_empty() {
            break;
        }
        if line.starts_with(' ') || line.starts_with('\t') {
            continue;
        }
        let Some((name, _)) = line.split_once(':') else {
            return false;
        };
        if name.is_empty() || name.contains(' ') {
            return false;
        }
        headers += 1;
        let n = name.to_ascii_lowercase();
        if matches!(
            n.as_str(),
            "from"
                | "to"
                | "subject"
                | "date"
                | "received"
                | "message-id"
                | "mime-version"
                | "return-path"
                | "content-type"
        ) {
            known += 1;
        }
    }
    headers >= 2 && known >= 2
}

fn looks_like_markdown(text: &str) -> bool {
    text.lines().take(200).any(|l| {
        l.starts_with("# ")
            || l.starts_with("## ")
            || l.starts_with("```")
            || (l.starts_with('|') && l.contains("---"))
    })
}

pub(crate) fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
