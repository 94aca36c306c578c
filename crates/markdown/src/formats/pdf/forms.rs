//! The shape of each page checked before pdf-extract walks it.
//!
//! pdf-extract follows a form XObject's `Do` by recursing into the form's content, with no
//! depth limit and no memory of where it has been, and finds a page's inherited attributes by
//! recursing up the `Parent` chain: a form that draws itself, two forms that draw each other, a
//! chain of ten thousand forms or a `Parent` loop overflow the stack, and a form drawing the
//! next twice, thirty deep, runs a billion times. Here every page's forms are walked (depth-
//! capped, cycle-checked, draws counted) on our side first; a page that fails is left out, with
//! a warning, instead of handed on.

use std::collections::{HashMap, HashSet};

use pdf_extract::{Dictionary, Document, Object, ObjectId};

use super::unpack::{unescape, MAX_STREAM_BYTES};
use crate::error::Result;
use crate::limits::Ctx;

/// Deepest nesting of forms within forms a page may have (real documents stay under ten).
const MAX_FORM_DEPTH: usize = 32;
/// Most form XObjects one page may draw, counting every time each is drawn.
const MAX_FORM_DRAWS: u64 = 100_000;
/// Longest `Parent` chain from a page to the root of the page tree.
const MAX_TREE_DEPTH: usize = 64;

/// Why a page is not handed to pdf-extract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bad {
    Cycle,
    TooDeep,
    TooMany,
    TreeLoop,
    TooLong,
}

impl Bad {
    fn describe(self) -> &'static str {
        match self {
            Bad::Cycle => "its form XObjects draw themselves",
            Bad::TooDeep => "its form XObjects nest too deeply",
            Bad::TooMany => "its form XObjects are drawn too many times",
            Bad::TreeLoop => "its page tree loops",
            Bad::TooLong => "its content is too long",
        }
    }
}

/// Checks every page; the pages that fail lose their content (and, for a looping page tree,
/// their parent) so that pdf-extract reads them as empty.
pub(super) fn check_pages(ctx: &Ctx<'_>, doc: &mut Document) -> Result<()> {
    let mut walk = Walk {
        doc,
        memo: HashMap::new(),
        path: Vec::new(),
    };
    let mut bad = Vec::new();
    for (n, page) in walk.doc.get_pages() {
        ctx.check_time()?;
        if let Err(why) = walk.page(page) {
            bad.push((n, page, why));
        }
    }
    for (n, page, why) in bad {
        ctx.warn(format!("page {n}: left out, {}", why.describe()));
        if let Ok(Object::Dictionary(dict)) = doc.get_object_mut(page) {
            dict.remove(b"Contents");
            if why == Bad::TreeLoop {
                dict.remove(b"Parent");
                if !dict.has(b"MediaBox") {
                    let letter = vec![0.into(), 0.into(), 612.into(), 792.into()];
                    dict.set("MediaBox", Object::Array(letter));
                }
            }
        }
    }
    Ok(())
}

struct Walk<'d> {
    doc: &'d Document,
    /// (form, object whose resources it reads names in) -> (forms drawn by one draw of it,
    /// itself included; depth of its nesting). Only cycle-free results are kept.
    memo: HashMap<(ObjectId, Option<ObjectId>), (u64, usize)>,
    /// The forms being drawn, outermost first.
    path: Vec<ObjectId>,
}

impl Walk<'_> {
    fn page(&mut self, page: ObjectId) -> std::result::Result<(), Bad> {
        let owner = self.resources_owner(page)?;
        let mut content_len = 0u64;
        let mut draws = 0u64;
        self.path.clear();
        for id in self.doc.get_page_contents(page) {
            let Ok(stream) = self.doc.get_object(id).and_then(Object::as_stream) else {
                continue;
            };
            content_len += stream.content.len() as u64;
            if content_len > MAX_STREAM_BYTES {
                return Err(Bad::TooLong);
            }
            for name in drawn_names(&stream.content) {
                draws = draws.saturating_add(self.draws(owner, &name, 1)?.0);
                if draws > MAX_FORM_DRAWS {
                    return Err(Bad::TooMany);
                }
            }
        }
        Ok(())
    }

    /// The page-tree node whose `Resources` the page uses (the page or its nearest ancestor
    /// with some), after checking that the `Parent` chain ends.
    fn resources_owner(&self, page: ObjectId) -> std::result::Result<Option<ObjectId>, Bad> {
        let mut owner = None;
        let mut seen = HashSet::new();
        let mut node = page;
        loop {
            if !seen.insert(node) || seen.len() > MAX_TREE_DEPTH {
                return Err(Bad::TreeLoop);
            }
            let Ok(dict) = self.doc.get_dictionary(node) else {
                return Ok(owner);
            };
            if owner.is_none() && dict.has(b"Resources") {
                owner = Some(node);
            }
            match dict.get(b"Parent").and_then(Object::as_reference) {
                Ok(parent) => node = parent,
                Err(_) => return Ok(owner),
            }
        }
    }

    /// One draw of XObject `name`, looked up in the resources of `owner`, at `depth`: the forms
    /// it draws (itself included) and how deep they nest.
    fn draws(
        &mut self,
        owner: Option<ObjectId>,
        name: &[u8],
        depth: usize,
    ) -> std::result::Result<(u64, usize), Bad> {
        let Some(form) = owner.and_then(|o| self.xobject(o, name)) else {
            return Ok((0, 0));
        };
        if self.path.contains(&form) {
            return Err(Bad::Cycle);
        }
        if depth > MAX_FORM_DEPTH {
            return Err(Bad::TooDeep);
        }
        let Ok(stream) = self.doc.get_object(form).and_then(Object::as_stream) else {
            return Ok((0, 0));
        };
        // A form without resources of its own reads names in those of whatever draws it.
        let inner = if stream.dict.has(b"Resources") {
            Some(form)
        } else {
            owner
        };
        if let Some(&(count, height)) = self.memo.get(&(form, inner)) {
            if depth + height > MAX_FORM_DEPTH {
                return Err(Bad::TooDeep);
            }
            return Ok((count, height));
        }
        self.path.push(form);
        let (mut count, mut height) = (1u64, 1usize);
        for name in drawn_names(&stream.content) {
            let (c, h) = self.draws(inner, &name, depth + 1)?;
            count = count.saturating_add(c);
            height = height.max(h + 1);
            if count > MAX_FORM_DRAWS {
                return Err(Bad::TooMany);
            }
        }
        self.path.pop();
        self.memo.insert((form, inner), (count, height));
        Ok((count, height))
    }

    /// The object named `name` in the `XObject` resources of `owner` (a page-tree node or form).
    fn xobject(&self, owner: ObjectId, name: &[u8]) -> Option<ObjectId> {
        let dict: &Dictionary = match self.doc.get_object(owner).ok()? {
            Object::Dictionary(d) => d,
            Object::Stream(s) => &s.dict,
            _ => return None,
        };
        let resources = self.resolve(dict.get(b"Resources").ok()?)?.as_dict().ok()?;
        let xobjects = self
            .resolve(resources.get(b"XObject").ok()?)?
            .as_dict()
            .ok()?;
        xobjects.get(name).and_then(Object::as_reference).ok()
    }

    fn resolve<'o>(&'o self, obj: &'o Object) -> Option<&'o Object> {
        match obj {
            Object::Reference(id) => self.doc.get_object(*id).ok(),
            other => Some(other),
        }
    }
}

/// The names a content stream draws with `Do`, once per draw. A plain scan, not a parse: a
/// name followed (past white space and comments) by the `Do` operator counts wherever it
/// stands, inside a string or inline image too, so nothing can hide a draw from it.
fn drawn_names(content: &[u8]) -> Vec<Vec<u8>> {
    let is_delim = |b: u8| b"()<>[]{}/%".contains(&b) || b.is_ascii_whitespace() || b == 0;
    let mut names = Vec::new();
    let mut i = 0;
    while i < content.len() {
        if content[i] != b'/' {
            i += 1;
            continue;
        }
        let start = i + 1;
        let mut end = start;
        while end < content.len() && !is_delim(content[end]) {
            end += 1;
        }
        let mut j = end;
        loop {
            while j < content.len() && (content[j].is_ascii_whitespace() || content[j] == 0) {
                j += 1;
            }
            if content.get(j) == Some(&b'%') {
                while j < content.len() && content[j] != b'\n' && content[j] != b'\r' {
                    j += 1;
                }
                continue;
            }
            break;
        }
        let is_do = content[j.min(content.len())..].starts_with(b"Do")
            && content.get(j + 2).is_none_or(|&b| is_delim(b));
        if is_do {
            names.push(unescape(&content[start..end]));
        }
        i = end.max(i + 1);
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drawn_names_are_found_past_comments_and_escapes() {
        let content = b"q /Fm1 Do Q /F#6d2 %c\n Do /Im1 Dox /Fm3\nDo";
        assert_eq!(
            drawn_names(content),
            vec![b"Fm1".to_vec(), b"Fm2".to_vec(), b"Fm3".to_vec()]
        );
    }
}
