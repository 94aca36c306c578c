//! E-mail (`.eml`, MIME): the headers that matter, the body (plain text, or HTML converted), and
//! the attachments: listed, or converted under their own headings within the nesting limits
//! ([`crate::Attachments`]).

use mail_parser::{Address, MessageParser, MimeHeaders, PartType};

use crate::detect::{detect, Detected, Format};
use crate::error::{Error, Result};
use crate::limits::Ctx;
use crate::md;

fn addresses(a: Option<&Address<'_>>) -> Option<String> {
    let list: Vec<String> = a?
        .iter()
        .map(
            |addr| match (addr.name.as_deref(), addr.address.as_deref()) {
                (Some(n), Some(e)) if !n.is_empty() => format!("{n} <{e}>"),
                (_, Some(e)) => e.to_string(),
                (Some(n), None) => n.to_string(),
                (None, None) => String::new(),
            },
        )
        .filter(|s| !s.is_empty())
        .collect();
    (!list.is_empty()).then(|| list.join(", "))
}

pub fn convert(ctx: Ctx<'_>, bytes: &[u8]) -> Result<String> {
    let msg = MessageParser::default()
        .parse(bytes)
        .ok_or_else(|| Error::malformed(Format::Eml, "not a MIME message"))?;
    let mut blocks = Vec::new();
    blocks.push(format!(
        "# {}",
        msg.subject().unwrap_or("(no subject)").trim()
    ));
    let mut headers = Vec::new();
    for (label, value) in [
        ("From", addresses(msg.from())),
        ("To", addresses(msg.to())),
        ("Cc", addresses(msg.cc())),
        // The date as the sender wrote it (weekday, month name, zone), else as parsed.
        (
            "Date",
            msg.header_raw("Date")
                .map(|d| d.trim().to_string())
                .filter(|d| !d.is_empty())
                .or_else(|| msg.date().map(|d| d.to_rfc3339())),
        ),
    ] {
        if let Some(v) = value {
            headers.push(format!("**{label}:** {}", md::escape_inline(&v)));
        }
    }
    if !headers.is_empty() {
        blocks.push(headers.join("  \n"));
    }
    // Every part of the readable body, in order: a multipart/mixed message may carry several
    // (an HTML part and a later plain-text one); of alternatives, the plain text is chosen.
    // HTML parts go through the HTML converter, so their structure survives.
    for &id in &msg.text_body {
        let Some(part) = msg.part(id) else { continue };
        let text = match &part.body {
            PartType::Text(t) => t.replace("\r\n", "\n"),
            PartType::Html(h) => super::html::html_to_markdown(h),
            _ => continue,
        };
        blocks.push(text);
    }
    let mut listed = Vec::new();
    for part in msg.attachments() {
        ctx.check_time()?;
        let name = part.attachment_name().unwrap_or("attachment").to_string();
        let data = part.contents();
        if !ctx.convert_attachments() {
            listed.push(super::attachment_item(&name, data, data.len()));
            continue;
        }
        ctx.charge(data.len() as u64)?;
        let converted = ctx
            .nested()
            .and_then(|nested| match detect(data, Some(&name)) {
                Detected::Known(f) => crate::convert_format(nested, f, data, Some(&name)),
                _ => Err(Error::Unsupported {
                    what: "binary attachment".into(),
                }),
            });
        match converted {
            Ok(text) => blocks.push(format!(
                "## Attachment: {}\n\n{}",
                md::escape_inline(&name),
                text.trim()
            )),
            Err(e @ (Error::ExpandsTooMuch { .. } | Error::TimedOut { .. })) => return Err(e),
            Err(e) => blocks.push(format!(
                "## Attachment: {}\n\n*(not converted: {e})*",
                md::escape_inline(&name)
            )),
        }
    }
    blocks.extend(super::attachment_list(2, &listed));
    Ok(md::join_blocks(blocks))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{Budget, Limits};
    use crate::Attachments;

    #[test]
    fn headers_body_and_a_text_attachment_listed_or_converted() {
        let eml = b"From: Ann Example <ann@example.org>\r\nTo: bob@example.org\r\nSubject: Quarterly figures\r\nDate: Tue, 1 Oct 2024 10:00:00 +0000\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=XX\r\n\r\n--XX\r\nContent-Type: text/plain\r\n\r\nPlease find the numbers attached.\r\n--XX\r\nContent-Type: text/csv\r\nContent-Disposition: attachment; filename=\"q3.csv\"\r\n\r\nregion,sales\r\nnorth,10\r\n--XX--\r\n";
        let run = |attachments| {
            let options = crate::Options {
                attachments,
                ..Default::default()
            };
            let budget = Budget::new(Limits::default()).with_options(options);
            convert(
                Ctx {
                    budget: &budget,
                    depth: 0,
                },
                eml,
            )
            .unwrap()
        };
        for out in [run(Attachments::List), run(Attachments::Convert)] {
            assert!(out.starts_with("# Quarterly figures"), "{out}");
            assert!(
                out.contains("**From:** Ann Example \\<ann@example.org\\>"),
                "{out}"
            );
            assert!(out.contains("Please find the numbers attached."), "{out}");
        }
        let listed = run(Attachments::List);
        assert!(
            listed
                .trim_end()
                .ends_with("## Attachments\n\n- q3.csv (csv, 22 bytes)"),
            "{listed}"
        );
        assert!(!listed.contains("north"), "{listed}");
        let converted = run(Attachments::Convert);
        assert!(converted.contains("## Attachment: q3.csv"), "{converted}");
        assert!(converted.contains("| north | 10 |"), "{converted}");
    }

    #[test]
    fn every_inline_body_part_of_a_mixed_message_is_kept() {
        let eml = b"From: a@example.org\r\nSubject: Two parts\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=XX\r\n\r\n--XX\r\nContent-Type: text/html\r\n\r\n<html><head><title>Ignored title</title></head><body><h2>Agenda</h2><p>HTML part</p></body></html>\r\n--XX\r\nContent-Type: text/plain\r\nContent-Disposition: inline\r\n\r\nPlain part.\r\n--XX--\r\n";
        let budget = Budget::new(Limits::default());
        let out = convert(
            Ctx {
                budget: &budget,
                depth: 0,
            },
            eml,
        )
        .unwrap();
        assert!(out.contains("## Agenda\n\nHTML part"), "{out}");
        assert!(out.contains("Plain part."), "{out}");
        assert!(!out.contains("Ignored title"), "{out}");
    }
}
