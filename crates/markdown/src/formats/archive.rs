//! Bounded reading of zip archives (DOCX, PPTX, EPUB, ODF, plain zip).

use std::io::Cursor;

use zip::ZipArchive;

use crate::detect::Format;
use crate::error::{Error, Result};
use crate::limits::Ctx;

/// A zip archive whose reads are charged against the conversion's unpack budget.
pub struct Archive<'a> {
    zip: ZipArchive<Cursor<&'a [u8]>>,
    format: Format,
}

impl<'a> Archive<'a> {
    /// Opens `bytes`, refusing archives with too many members or whose declared sizes alone
    /// exceed the remaining unpack allowance.
    pub fn open(ctx: &Ctx<'_>, format: Format, bytes: &'a [u8]) -> Result<Self> {
        let zip = ZipArchive::new(Cursor::new(bytes)).map_err(|e| Error::malformed(format, e))?;
        let limit = ctx.limits().max_members;
        if zip.len() > limit {
            return Err(Error::TooManyMembers {
                count: zip.len(),
                limit,
            });
        }
        Ok(Archive { zip, format })
    }

    /// Member names in archive order.
    pub fn names(&self) -> Vec<String> {
        self.zip
            .file_names()
            .filter_map(|n| n.ok().map(|n| n.into_owned()))
            .collect::<Vec<_>>()
    }

    /// Member names in central-directory order (the order they were written).
    pub fn names_in_order(&mut self) -> Vec<String> {
        (0..self.zip.len())
            .filter_map(|i| {
                self.zip
                    .by_index_raw(i)
                    .ok()
                    .and_then(|f| f.name().ok().map(|n| n.into_owned()))
            })
            .collect()
    }

    /// Reads a member fully, or `None` when it is absent. Decompressed bytes count against the
    /// unpack limit; a member that would exceed it fails with [`Error::ExpandsTooMuch`].
    pub fn read(&mut self, ctx: &Ctx<'_>, name: &str) -> Result<Option<Vec<u8>>> {
        let Some(index) = self.zip.index_for_name(name) else {
            return Ok(None);
        };
        self.read_index(ctx, index).map(Some)
    }

    /// Reads the member at `index`.
    pub fn read_index(&mut self, ctx: &Ctx<'_>, index: usize) -> Result<Vec<u8>> {
        ctx.check_time()?;
        let format = self.format;
        let allowance = ctx.unpack_allowance();
        let file = self.zip.by_index(index).map_err(|e| match e {
            zip::result::ZipError::UnsupportedArchive(msg)
                if msg.contains("ncrypt") || msg.contains("assword") =>
            {
                Error::Encrypted { format }
            }
            other => Error::malformed(format, other),
        })?;
        if file.size() > allowance {
            return Err(Error::ExpandsTooMuch {
                limit: ctx.limits().max_unpacked_bytes,
            });
        }
        // Read a chunk at a time and charged as it comes: a member whose declared size lies
        // stops at the budget, and nothing is reserved past what the header claims.
        let mut out = Vec::with_capacity(file.size().min(allowance).min(64 << 20) as usize);
        ctx.read_charged(file, &mut out)?
            .map_err(|e| Error::malformed(format, e))?;
        Ok(out)
    }

    /// Reads a member as a parsed XML tree.
    pub fn xml(&mut self, ctx: &Ctx<'_>, name: &str) -> Result<Option<crate::xml::Element>> {
        match self.read(ctx, name)? {
            Some(bytes) => crate::xml::parse(ctx, self.format, &bytes).map(Some),
            None => Ok(None),
        }
    }
}

/// Checks the declared sizes and member count of a zip before handing it to a third-party
/// reader (calamine) that does its own unpacking.
pub fn precheck(ctx: &Ctx<'_>, format: Format, bytes: &[u8]) -> Result<()> {
    let mut zip = ZipArchive::new(Cursor::new(bytes)).map_err(|e| Error::malformed(format, e))?;
    let limit = ctx.limits().max_members;
    if zip.len() > limit {
        return Err(Error::TooManyMembers {
            count: zip.len(),
            limit,
        });
    }
    let mut total: u64 = 0;
    for i in 0..zip.len() {
        if let Ok(f) = zip.by_index_raw(i) {
            total = total.saturating_add(f.size());
        }
    }
    ctx.charge(total)
}

/// Resolves a relationship target against the folder of the part that refers to it
/// (`word/document.xml` + `media/a.png` = `word/media/a.png`; `../x` climbs).
pub fn resolve(base_part: &str, target: &str) -> String {
    if let Some(abs) = target.strip_prefix('/') {
        return abs.to_string();
    }
    let mut parts: Vec<&str> = base_part.split('/').collect();
    parts.pop();
    for seg in target.split('/') {
        match seg {
            ".." => {
                parts.pop();
            }
            "." | "" => {}
            s => parts.push(s),
        }
    }
    parts.join("/")
}

/// The relationships part of `part` (`word/document.xml` -> `word/_rels/document.xml.rels`).
pub fn rels_path(part: &str) -> String {
    match part.rsplit_once('/') {
        Some((dir, file)) => format!("{dir}/_rels/{file}.rels"),
        None => format!("_rels/{part}.rels"),
    }
}

/// A part's relationships: id -> (type suffix, resolved target, external?).
pub fn relationships(ctx: &Ctx<'_>, archive: &mut Archive<'_>, part: &str) -> Result<Vec<Rel>> {
    let Some(root) = archive.xml(ctx, &rels_path(part))? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    if let Some(rels) = root.child("Relationships") {
        for r in rels.children_named("Relationship") {
            let external = r.attr("TargetMode") == Some("External");
            let target = r.attr("Target").unwrap_or_default();
            out.push(Rel {
                id: r.attr("Id").unwrap_or_default().to_string(),
                kind: r
                    .attr("Type")
                    .unwrap_or_default()
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_string(),
                target: if external {
                    target.to_string()
                } else {
                    resolve(part, target)
                },
            });
        }
    }
    Ok(out)
}

/// One relationship of an OOXML part.
#[derive(Debug, Clone)]
pub struct Rel {
    pub id: String,
    /// Last segment of the type URI: `hyperlink`, `slide`, `notesSlide`, `footnotes` ...
    pub kind: String,
    /// Archive path for internal targets, the URL for external ones.
    pub target: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_targets_resolve_against_the_part_folder() {
        assert_eq!(
            resolve("word/document.xml", "media/a.png"),
            "word/media/a.png"
        );
        assert_eq!(
            resolve("ppt/slides/slide1.xml", "../notesSlides/n1.xml"),
            "ppt/notesSlides/n1.xml"
        );
        assert_eq!(resolve("ppt/slides/slide1.xml", "/ppt/x.xml"), "ppt/x.xml");
        assert_eq!(
            rels_path("word/document.xml"),
            "word/_rels/document.xml.rels"
        );
    }
}
