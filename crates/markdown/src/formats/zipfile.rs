//! ZIP archives: each member converted under its own heading, recursively, within the limits.

use super::archive::Archive;
use crate::detect::{detect, Detected, Format};
use crate::error::{Error, Result};
use crate::limits::Ctx;
use crate::md;

pub fn convert(ctx: Ctx<'_>, bytes: &[u8], filename: Option<&str>) -> Result<String> {
    let mut ar = Archive::open(&ctx, Format::Zip, bytes)?;
    let mut blocks = Vec::new();
    if let Some(name) = filename {
        blocks.push(format!("# {}", md::escape_inline(name)));
    }
    let level = "#".repeat((ctx.depth + 2).min(6));
    for (index, name) in ar.names_in_order().into_iter().enumerate() {
        ctx.check_time()?;
        if name.ends_with('/')
            || name.starts_with("__MACOSX/")
            || name
                .rsplit('/')
                .next()
                .is_some_and(|f| f.starts_with("._") || f == ".DS_Store")
        {
            continue;
        }
        let heading = format!("{level} {}", md::escape_inline(&name));
        let body = match ar.read_index(&ctx, index) {
            Ok(data) => member(&ctx, &data, &name),
            Err(e @ (Error::ExpandsTooMuch { .. } | Error::TimedOut { .. })) => return Err(e),
            Err(e) => Err(e),
        };
        match body {
            Ok(text) => blocks.push(format!("{heading}\n\n{}", text.trim())),
            Err(e @ (Error::ExpandsTooMuch { .. } | Error::TimedOut { .. })) => return Err(e),
            Err(e) => {
                ctx.warn(format!("{name}: {e}"));
                blocks.push(format!("{heading}\n\n*(not converted: {e})*"));
            }
        }
    }
    Ok(md::join_blocks(blocks))
}

fn member(ctx: &Ctx<'_>, data: &[u8], name: &str) -> Result<String> {
    if data.is_empty() {
        return Ok("*(empty file)*".into());
    }
    let nested = ctx.nested()?;
    match detect(data, Some(name)) {
        Detected::Known(format) => crate::convert_format(nested, format, data, Some(name)),
        Detected::Refused(what) => Err(Error::Unsupported {
            what: what.to_string(),
        }),
        Detected::Unknown => Err(Error::Unsupported {
            what: "binary content".to_string(),
        }),
    }
}
