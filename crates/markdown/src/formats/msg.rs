//! Outlook `.msg` (an OLE compound file of MAPI properties): subject, sender, recipients, date,
//! body (plain, else HTML, else the compressed RTF body), and the attachments: listed, or
//! converted nested ([`crate::Attachments`]).

use std::io::{Cursor, Read};

use cfb::CompoundFile;

use crate::detect::Format;
use crate::error::{Error, Result};
use crate::limits::Ctx;
use crate::md;

type Cfb<'a> = CompoundFile<Cursor<&'a [u8]>>;

fn stream(ctx: &Ctx<'_>, cfb: &mut Cfb<'_>, path: &str) -> Result<Option<Vec<u8>>> {
    if !cfb.is_stream(path) {
        return Ok(None);
    }
    let s = cfb
        .open_stream(path)
        .map_err(|e| Error::malformed(Format::Msg, e))?;
    let allowance = ctx.unpack_allowance();
    if s.len() > allowance {
        return Err(Error::ExpandsTooMuch {
            limit: ctx.limits().max_unpacked_bytes,
        });
    }
    let mut out = Vec::new();
    s.take(allowance)
        .read_to_end(&mut out)
        .map_err(|e| Error::malformed(Format::Msg, e))?;
    ctx.charge(out.len() as u64)?;
    Ok(Some(out))
}

/// The list item of an attached file (PR_ATTACH_DATA_BIN): its size from the stream's length, and
/// its format from its first bytes, or from all of it when it is a container.
fn listed_file(ctx: &Ctx<'_>, cfb: &mut Cfb<'_>, dir: &str, name: &str) -> Result<String> {
    const HEAD: u64 = 64 * 1024;
    let path = format!("{dir}/__substg1.0_37010102");
    if !cfb.is_stream(&path) {
        // Attached by reference, or its data lives elsewhere: the name is all there is.
        return Ok(format!("- {}", md::escape_inline(name)));
    }
    let mut s = cfb
        .open_stream(&path)
        .map_err(|e| Error::malformed(Format::Msg, e))?;
    let size = s.len() as usize;
    let mut head = Vec::new();
    (&mut s)
        .take(HEAD)
        .read_to_end(&mut head)
        .map_err(|e| Error::malformed(Format::Msg, e))?;
    if super::head_tells_format(&head) || size as u64 <= HEAD {
        return Ok(super::attachment_item(name, &head, size));
    }
    drop(s);
    let data = binary_prop(ctx, cfb, dir, 0x3701)?.unwrap_or_default();
    Ok(super::attachment_item(name, &data, size))
}

/// A string property: Unicode (001F) or 8-bit (001E).
fn string_prop(ctx: &Ctx<'_>, cfb: &mut Cfb<'_>, dir: &str, id: u16) -> Result<Option<String>> {
    if let Some(b) = stream(ctx, cfb, &format!("{dir}/__substg1.0_{id:04X}001F"))? {
        let (s, _, _) = encoding_rs::UTF_16LE.decode(&b);
        return Ok(Some(s.trim_end_matches('\0').to_string()));
    }
    if let Some(b) = stream(ctx, cfb, &format!("{dir}/__substg1.0_{id:04X}001E"))? {
        return Ok(Some(
            crate::text::decode(&b).trim_end_matches('\0').to_string(),
        ));
    }
    Ok(None)
}

fn binary_prop(ctx: &Ctx<'_>, cfb: &mut Cfb<'_>, dir: &str, id: u16) -> Result<Option<Vec<u8>>> {
    stream(ctx, cfb, &format!("{dir}/__substg1.0_{id:04X}0102"))
}

pub fn convert(ctx: Ctx<'_>, bytes: &[u8]) -> Result<String> {
    let mut cfb =
        CompoundFile::open(Cursor::new(bytes)).map_err(|e| Error::malformed(Format::Msg, e))?;
    message(ctx, &mut cfb, "", 1)
}

/// The message whose properties live in storage `dir` ("" for the file's root), its heading at
/// `level`. Messages attached to it (embedded, not as files) are converted in place, nested.
fn message(ctx: Ctx<'_>, cfb: &mut Cfb<'_>, dir: &str, level: usize) -> Result<String> {
    let mut blocks = Vec::new();
    let subject = string_prop(&ctx, cfb, dir, 0x0037)?.unwrap_or_else(|| "(no subject)".into());
    blocks.push(format!("{} {}", "#".repeat(level.min(6)), subject.trim()));
    let headers = string_prop(&ctx, cfb, dir, 0x007D)?.unwrap_or_default();
    let header = |name: &str| {
        headers.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    };
    let sender_name = string_prop(&ctx, cfb, dir, 0x0C1A)?;
    let sender_addr = match string_prop(&ctx, cfb, dir, 0x5D01)? {
        Some(a) => Some(a),
        None => string_prop(&ctx, cfb, dir, 0x0C1F)?,
    };
    let from = match (sender_name, sender_addr) {
        (Some(n), Some(a)) if !a.is_empty() && n != a => Some(format!("{n} <{a}>")),
        (Some(n), _) => Some(n),
        (None, Some(a)) => Some(a),
        (None, None) => header("From"),
    };
    let mut lines = Vec::new();
    for (label, value) in [
        ("From", from),
        (
            "To",
            string_prop(&ctx, cfb, dir, 0x0E04)?
                .filter(|s| !s.is_empty())
                .or_else(|| header("To")),
        ),
        (
            "Cc",
            string_prop(&ctx, cfb, dir, 0x0E03)?.filter(|s| !s.is_empty()),
        ),
        ("Date", header("Date")),
    ] {
        if let Some(v) = value {
            lines.push(format!("**{label}:** {}", md::escape_inline(&v)));
        }
    }
    if !lines.is_empty() {
        blocks.push(lines.join("  \n"));
    }
    let body = match string_prop(&ctx, cfb, dir, 0x1000)? {
        Some(t) if !t.trim().is_empty() => t.replace("\r\n", "\n"),
        _ => {
            let html = match binary_prop(&ctx, cfb, dir, 0x1013)? {
                Some(b) => Some(crate::text::decode(&b)),
                None => string_prop(&ctx, cfb, dir, 0x1013)?,
            };
            match html {
                Some(h) => super::html::html_to_markdown(&h),
                None => match binary_prop(&ctx, cfb, dir, 0x1009)? {
                    Some(c) => {
                        let rtf = decompress_rtf(&ctx, &c)?;
                        super::rtf::convert(ctx, &rtf)?
                    }
                    None => String::new(),
                },
            }
        }
    };
    blocks.push(body);
    // Attachments live in storages named __attach_version1.0_#XXXXXXXX.
    let storage = if dir.is_empty() { "/" } else { dir };
    let attach_dirs: Vec<String> = match cfb.read_storage(storage) {
        Ok(entries) => entries
            .filter(|e| e.is_storage() && e.name().starts_with("__attach_version1.0_"))
            .map(|e| format!("{dir}/{}", e.name()))
            .collect(),
        Err(_) => Vec::new(),
    };
    let sub = (level + 1).min(6);
    // Attached messages are read here, in order (they need the compound file); attached files
    // are collected and converted together afterwards, on several threads.
    enum Part {
        Done(String),
        File {
            heading: String,
            name: String,
            data: Vec<u8>,
        },
    }
    let mut parts = Vec::new();
    let mut listed = Vec::new();
    for adir in attach_dirs {
        ctx.check_time()?;
        let name = match string_prop(&ctx, cfb, &adir, 0x3707)? {
            Some(n) if !n.is_empty() => n,
            _ => string_prop(&ctx, cfb, &adir, 0x3704)?
                .filter(|n| !n.is_empty())
                .or(string_prop(&ctx, cfb, &adir, 0x3001)?)
                .unwrap_or_else(|| "attachment".into()),
        };
        // An attached message is a storage of its own (PR_ATTACH_DATA_OBJ, type 000D).
        let embedded = format!("{adir}/__substg1.0_3701000D");
        if !ctx.convert_attachments() {
            listed.push(if cfb.is_storage(&embedded) {
                format!("- {} (msg)", md::escape_inline(&name))
            } else {
                listed_file(&ctx, cfb, &adir, &name)?
            });
            continue;
        }
        let heading = format!(
            "{} Attachment: {}",
            "#".repeat(sub),
            md::escape_inline(&name)
        );
        if cfb.is_storage(&embedded) {
            let converted = ctx
                .nested()
                .and_then(|nested| message(nested, cfb, &embedded, (sub + 1).min(6)));
            parts.push(Part::Done(match converted {
                Ok(text) => format!("{heading}\n\n{}", text.trim()),
                Err(e @ (Error::ExpandsTooMuch { .. } | Error::TimedOut { .. })) => return Err(e),
                Err(e) => format!("{heading}\n\n*(not converted: {e})*"),
            }));
            continue;
        }
        match binary_prop(&ctx, cfb, &adir, 0x3701)? {
            Some(data) => parts.push(Part::File {
                heading,
                name,
                data,
            }),
            None => parts.push(Part::Done(heading)),
        }
    }
    let files: Vec<(&str, &[u8])> = parts
        .iter()
        .filter_map(|p| match p {
            Part::File { name, data, .. } => Some((name.as_str(), data.as_slice())),
            Part::Done(_) => None,
        })
        .collect();
    let mut converted = super::convert_nested_all(ctx, &files).into_iter();
    for part in &parts {
        match part {
            Part::Done(block) => blocks.push(block.clone()),
            Part::File { heading, .. } => match converted.next() {
                Some(Ok(text)) => blocks.push(format!("{heading}\n\n{}", text.trim())),
                Some(Err(e @ (Error::ExpandsTooMuch { .. } | Error::TimedOut { .. }))) => {
                    return Err(e)
                }
                Some(Err(e)) => blocks.push(format!("{heading}\n\n*(not converted: {e})*")),
                None => blocks.push(heading.clone()),
            },
        }
    }
    blocks.extend(super::attachment_list(sub, &listed));
    Ok(md::join_blocks(blocks))
}

/// The dictionary every compressed-RTF stream starts from (MS-OXRTFCP).
const RTF_PREBUF: &[u8] = b"{\\rtf1\\ansi\\mac\\deff0\\deftab720{\\fonttbl;}{\\f0\\fnil \\froman \\fswiss \\fmodern \\fscript \\fdecor MS Sans SerifSymbolArialTimes New RomanCourier{\\colortbl\\red0\\green0\\blue0\r\n\\par \\pard\\plain\\f0\\fs20\\b\\i\\u\\tab\\tx";

/// Decompresses an MS-OXRTFCP stream (`LZFu`, or `MELA` for stored). Output is bounded by the
/// declared raw size and the unpack allowance.
pub(crate) fn decompress_rtf(ctx: &Ctx<'_>, data: &[u8]) -> Result<Vec<u8>> {
    let bad = |why: &str| Error::malformed(Format::Msg, format!("compressed RTF: {why}"));
    if data.len() < 16 {
        return Err(bad("header too short"));
    }
    let u32_at = |i: usize| u32::from_le_bytes([data[i], data[i + 1], data[i + 2], data[i + 3]]);
    let raw_size = u32_at(4) as u64;
    let kind = &data[8..12];
    let body = &data[16..];
    if raw_size > ctx.unpack_allowance() {
        return Err(Error::ExpandsTooMuch {
            limit: ctx.limits().max_unpacked_bytes,
        });
    }
    if kind == b"MELA" {
        let n = (raw_size as usize).min(body.len());
        ctx.charge(n as u64)?;
        return Ok(body[..n].to_vec());
    }
    if kind != b"LZFu" {
        return Err(bad("unknown compression type"));
    }
    let mut dict = [0u8; 4096];
    dict[..RTF_PREBUF.len()].copy_from_slice(RTF_PREBUF);
    let mut write = RTF_PREBUF.len();
    let mut out = Vec::with_capacity((raw_size as usize).min(1 << 20));
    let mut i = 0;
    'outer: while i < body.len() {
        let control = body[i];
        i += 1;
        for bit in 0..8 {
            if i >= body.len() || out.len() as u64 >= raw_size {
                break 'outer;
            }
            if control & (1 << bit) == 0 {
                let b = body[i];
                i += 1;
                out.push(b);
                dict[write] = b;
                write = (write + 1) % 4096;
            } else {
                if i + 1 >= body.len() {
                    break 'outer;
                }
                let word = u16::from_be_bytes([body[i], body[i + 1]]) as usize;
                i += 2;
                let offset = word >> 4;
                let len = (word & 0xF) + 2;
                if offset == write {
                    break 'outer;
                }
                for k in 0..len {
                    let b = dict[(offset + k) % 4096];
                    out.push(b);
                    dict[write] = b;
                    write = (write + 1) % 4096;
                }
            }
        }
    }
    out.truncate(raw_size as usize);
    ctx.charge(out.len() as u64)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{Budget, Limits};

    #[test]
    fn prebuf_has_the_specified_length() {
        assert_eq!(RTF_PREBUF.len(), 207);
    }

    #[test]
    fn compressed_rtf_example_from_the_specification_decompresses() {
        // The worked example of MS-OXRTFCP section 4.1 (facts: the byte values).
        let data: [u8; 0x2d] = [
            0x2d, 0x00, 0x00, 0x00, 0x2b, 0x00, 0x00, 0x00, 0x4c, 0x5a, 0x46, 0x75, 0xf1, 0xc5,
            0xc7, 0xa7, 0x03, 0x00, 0x0a, 0x00, 0x72, 0x63, 0x70, 0x67, 0x31, 0x32, 0x35, 0x42,
            0x32, 0x0a, 0xf3, 0x20, 0x68, 0x65, 0x6c, 0x09, 0x00, 0x20, 0x62, 0x77, 0x05, 0xb0,
            0x6c, 0x64, 0x7d,
        ];
        let budget = Budget::new(Limits::default());
        let ctx = Ctx {
            budget: &budget,
            depth: 0,
        };
        let mut input = data.to_vec();
        input.extend_from_slice(&[0x0a, 0x80, 0x0f, 0xa0]);
        let out = decompress_rtf(&ctx, &input).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out),
            "{\\rtf1\\ansi\\ansicpg1252\\pard hello world}\r\n"
        );
    }
}
