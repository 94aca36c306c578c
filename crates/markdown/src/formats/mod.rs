//! One module per format, and the dispatch from [`Format`] to its converter.

pub(crate) mod archive;
mod chart;
pub(crate) mod csv;
mod docx;
mod email;
mod epub;
mod html;
mod image;
mod inline;
mod ipynb;
pub(crate) mod msg;
mod odf;
mod pdf;
mod pptx;
pub(crate) mod rtf;
mod sheet;
mod structured;
mod text;
mod xmp;
mod zipfile;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::detect::{detect, Detected, Format};
use crate::error::{Error, Result};
use crate::limits::Ctx;
use crate::Converter;

/// Converts `bytes`, already identified as `format`.
pub(crate) fn convert(
    ctx: Ctx<'_>,
    format: Format,
    bytes: &[u8],
    filename: Option<&str>,
) -> Result<String> {
    match format {
        Format::Pdf => pdf::convert(ctx, bytes),
        Format::Docx => docx::convert(ctx, bytes),
        Format::Pptx => pptx::convert(ctx, bytes),
        Format::Xlsx | Format::Xls | Format::Ods => sheet::convert(ctx, format, bytes),
        Format::Odt => odf::convert(ctx, bytes),
        Format::Epub => epub::convert(ctx, bytes),
        Format::Zip => zipfile::convert(ctx, bytes, filename),
        Format::Msg => msg::convert(ctx, bytes),
        Format::Eml => email::convert(ctx, bytes),
        Format::Rtf => rtf::convert(ctx, bytes),
        Format::Html => html::convert(ctx, bytes),
        Format::Xml => structured::xml(ctx, bytes),
        Format::Json => structured::json(ctx, bytes),
        Format::Ipynb => ipynb::convert(ctx, bytes),
        Format::Csv | Format::Tsv => csv::convert(ctx, format, bytes),
        Format::Markdown => Ok(text::markdown(bytes)),
        Format::Text => Ok(text::plain(bytes)),
        Format::Image => image::convert(ctx, bytes),
    }
}

/// A list item for an attachment that is listed, not converted: its name, the format its content
/// (`data`, or as much of its start as tells the format) looks like, and its size.
pub(crate) fn attachment_item(name: &str, data: &[u8], size: usize) -> String {
    let kind = match detect(data, Some(name)) {
        Detected::Known(f) => f.name(),
        _ => "binary",
    };
    format!(
        "- {} ({kind}, {})",
        crate::md::escape_inline(name),
        human_size(size)
    )
}

/// The `Attachments` section of a message whose attachments are listed (`items` from
/// [`attachment_item`]), its heading at `level`; none when nothing is attached.
pub(crate) fn attachment_list(level: usize, items: &[String]) -> Option<String> {
    (!items.is_empty())
        .then(|| format!("{} Attachments\n\n{}", "#".repeat(level), items.join("\n")))
}

/// Whether the start of a file is enough to tell its format: not for containers (zip, OLE),
/// whose members decide.
pub(crate) fn head_tells_format(head: &[u8]) -> bool {
    !(head.starts_with(b"PK") || head.starts_with(&[0xD0, 0xCF, 0x11, 0xE0]))
}

/// `512 bytes`, `14.2 KB`, `3.1 MB` (powers of 1024).
fn human_size(bytes: usize) -> String {
    const KB: f64 = 1024.0;
    let b = bytes as f64;
    if b < KB {
        format!("{bytes} bytes")
    } else if b < KB * KB {
        format!("{:.1} KB", b / KB)
    } else {
        format!("{:.1} MB", b / (KB * KB))
    }
}

/// Most threads one document's attachments are converted on.
const MAX_NESTED_THREADS: usize = 4;

/// Converts nested documents (`(file name, bytes)`, e.g. e-mail attachments) one level down,
/// each identified by content and name, on up to [`MAX_NESTED_THREADS`] threads at once.
/// Results come back in input order.
pub(crate) fn convert_nested_all(ctx: Ctx<'_>, items: &[(&str, &[u8])]) -> Vec<Result<String>> {
    let one = |&(name, data): &(&str, &[u8])| -> Result<String> {
        let nested = ctx.nested()?;
        match detect(data, Some(name)) {
            Detected::Known(f) => crate::convert_format(nested, f, data, Some(name)),
            _ => Err(Error::Unsupported {
                what: "binary attachment".into(),
            }),
        }
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_NESTED_THREADS)
        .min(items.len());
    if threads <= 1 {
        return items.iter().map(one).collect();
    }
    // Largest first: the longest conversion (a big PDF beside small messages) starts at once
    // instead of after the small ones, so the threads finish closer together.
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(items[i].1.len()));
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<Result<String>>>> =
        items.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let worker = std::thread::Builder::new()
                .name("hearth-markdown-nested".into())
                .stack_size(crate::CONVERSION_STACK_BYTES)
                .spawn_scoped(scope, || {
                    while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let result = one(&items[i]);
                        *slots[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
                    }
                });
            if worker.is_err() {
                break; // what no thread took is converted below
            }
        }
    });
    slots
        .into_iter()
        .zip(items)
        .map(|(slot, item)| {
            slot.into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .unwrap_or_else(|| one(item))
        })
        .collect()
}

/// Converts small built-in samples (HTML, CSV, RTF, JSON) and checks the Markdown that comes out.
pub(crate) fn self_test(converter: &Converter) -> Result<()> {
    let samples: [(&str, &[u8], &str); 4] = [
        (
            "self-test.html",
            b"<html><body><h1>Self test</h1><p>Hello <b>world</b></p><script>x()</script></body></html>",
            "# Self test",
        ),
        ("self-test.csv", b"name,qty\napple,3\n", "| apple | 3 |"),
        ("self-test.rtf", b"{\\rtf1\\ansi {\\b bold} text\\par}", "**bold** text"),
        ("self-test.json", b"{\"a\": [1, 2]}", "\"a\""),
    ];
    for (name, bytes, expected) in samples {
        let out = converter.convert(bytes, Some(name))?;
        if !out.markdown.contains(expected) {
            return Err(Error::Crashed {
                format: out.format,
                message: format!("self-test of {name} produced unexpected output"),
            });
        }
    }
    Ok(())
}
