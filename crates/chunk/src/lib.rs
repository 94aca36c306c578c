//! Markdown cut into chunks ready to embed: each at most `max_tokens` tokens as a model's
//! tokenizer counts them (its special tokens included, so a chunk fits the model whole), cut on
//! the Markdown's own structure by text-splitter's `MarkdownSplitter` (headings, then
//! paragraphs, list items, sentences, words), tables and code blocks kept whole when they fit.
//! A table or fenced code block longer than a chunk is cut here instead, by rows or lines, with
//! its header (the header and delimiter rows; the opening fence, and the closing one after)
//! repeated atop every piece, so each piece still reads as a table or a code block. Each chunk
//! carries the path of headings it sits under and where it lies in the document.

mod blocks;

use std::time::Instant;

use serde::Serialize;
use text_splitter::{ChunkConfig, ChunkSizer, MarkdownSplitter, TryChunkSizer};
use tokenizers::Tokenizer;

use blocks::{Block, Line};

/// One chunk of a document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Chunk {
    /// The chunk's Markdown. A piece of a long table or code block has the block's header (and
    /// closing fence) added, so it is not always the document's text between `start` and `end`.
    pub text: String,
    /// The titles of the headings the chunk sits under, outermost first (a chunk that opens
    /// with a heading sits under it).
    pub headings: Vec<String>,
    /// Where the chunk's own text starts in the document, in characters (Unicode scalar
    /// values, as Python indexes a `str`).
    pub start: usize,
    /// Where it ends (exclusive), in characters.
    pub end: usize,
}

/// Counts tokens as a model reads a text: its tokenizer, special tokens added. A text the
/// tokenizer refuses counts as too long, so it is cut further.
pub struct TokenCount<'a>(pub &'a Tokenizer);

impl ChunkSizer for TokenCount<'_> {
    fn size(&self, chunk: &str) -> usize {
        self.0
            .encode(chunk, true)
            .map(|e| e.len())
            .unwrap_or(usize::MAX)
    }
}

/// Chunking ran past its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedOut;

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("chunking ran past its time limit")
    }
}

impl std::error::Error for TimedOut {}

/// A sizer under a deadline: every count past it fails, which stops text-splitter at once.
struct Budget<'a, S> {
    sizer: &'a S,
    deadline: Option<Instant>,
}

impl<S> Clone for Budget<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for Budget<'_, S> {}

impl<S: ChunkSizer> Budget<'_, S> {
    fn size(&self, text: &str) -> Result<usize, TimedOut> {
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(TimedOut);
        }
        Ok(self.sizer.size(text))
    }
}

impl<S: ChunkSizer> TryChunkSizer for Budget<'_, S> {
    type Error = TimedOut;

    fn try_size(&self, chunk: &str) -> Result<usize, TimedOut> {
        self.size(chunk)
    }
}

/// A chunk before its headings and character offsets: its bytes in the document and, for a
/// piece of a long block, its text with the header added.
struct Piece {
    start: usize,
    end: usize,
    text: Option<String>,
}

/// `markdown` cut into chunks of at most `max_tokens` as `sizer` counts (at least 1), in order,
/// or [`TimedOut`] once `deadline` passes. Only a single word longer than `max_tokens` comes out
/// longer.
pub fn chunk(
    markdown: &str,
    max_tokens: usize,
    sizer: &impl ChunkSizer,
    deadline: Option<Instant>,
) -> Result<Vec<Chunk>, TimedOut> {
    let sizer = Budget { sizer, deadline };
    let max_tokens = max_tokens.max(1);
    let lines = blocks::lines(markdown);
    let (found, headings) = blocks::parse(markdown, &lines);
    let mut pieces = Vec::new();
    let mut flow = 0;
    for block in &found {
        let (start, end) = (lines[block.first].start, lines[block.last].end);
        if sizer.size(&markdown[start..end])? <= max_tokens {
            continue;
        }
        split_flow(markdown, flow, start, max_tokens, sizer, &mut pieces)?;
        split_block(markdown, &lines, block, max_tokens, sizer, &mut pieces)?;
        flow = end;
    }
    split_flow(
        markdown,
        flow,
        markdown.len(),
        max_tokens,
        sizer,
        &mut pieces,
    )?;
    let pieces = join_lone_headings(markdown, pieces, max_tokens, sizer)?;
    Ok(finish(markdown, pieces, &headings))
}

/// A chunk of headings alone (text-splitter leaves one when its section does not fit whole)
/// joined to the text that follows it, when the two fit together.
fn join_lone_headings<S: ChunkSizer>(
    md: &str,
    pieces: Vec<Piece>,
    max_tokens: usize,
    sizer: Budget<'_, S>,
) -> Result<Vec<Piece>, TimedOut> {
    let lone = |p: &Piece| {
        p.text.is_none()
            && md[p.start..p.end]
                .lines()
                .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
    };
    let mut out: Vec<Piece> = Vec::with_capacity(pieces.len());
    for piece in pieces {
        if let Some(last) = out.last_mut() {
            if lone(last)
                && piece.text.is_none()
                && sizer.size(&md[last.start..piece.end])? <= max_tokens
            {
                last.end = piece.end;
                continue;
            }
        }
        out.push(piece);
    }
    Ok(out)
}

/// The text between long blocks, by text-splitter.
fn split_flow<S: ChunkSizer>(
    md: &str,
    start: usize,
    end: usize,
    max_tokens: usize,
    sizer: Budget<'_, S>,
    out: &mut Vec<Piece>,
) -> Result<(), TimedOut> {
    let splitter = MarkdownSplitter::new(ChunkConfig::new(max_tokens).with_sizer(sizer));
    for found in splitter.try_chunk_indices(&md[start..end]) {
        let (at, text) = found?;
        out.push(Piece {
            start: start + at,
            end: start + at + text.len(),
            text: None,
        });
    }
    Ok(())
}

/// A table or code block longer than a chunk, by rows or lines, its header repeated.
fn split_block<S: ChunkSizer>(
    md: &str,
    lines: &[Line],
    block: &Block,
    max_tokens: usize,
    sizer: Budget<'_, S>,
    out: &mut Vec<Piece>,
) -> Result<(), TimedOut> {
    let (head, foot) = block.frame();
    let text = |i: usize| &md[lines[i].start..lines[i].end];
    let header: Vec<&str> = (block.first..block.first + head).map(text).collect();
    let footer: Vec<&str> = (block.last + 1 - foot..=block.last).map(text).collect();
    let body: Vec<usize> = (block.first + head..block.last + 1 - foot).collect();
    let compose = |rows: &[usize]| -> String {
        let mut all = header.clone();
        all.extend(rows.iter().map(|&i| text(i)));
        all.extend(footer.iter().copied());
        all.join("\n")
    };
    // Rows are counted one by one and summed (a tokenizer that splits on whitespace counts a
    // line the same alone or among others); a piece is counted whole once, and shortened if the
    // sum was wrong.
    let specials = sizer.size("")?;
    let frame = sizer.size(&compose(&[]))?;
    let mut cost = Vec::with_capacity(body.len());
    for &row in &body {
        cost.push(sizer.size(text(row))?.saturating_sub(specials));
    }
    // A row too long to go with its header (or a header alone): the block is cut as text,
    // without the header repeated.
    if body.is_empty() || cost.iter().any(|c| frame + c > max_tokens) {
        let (start, end) = (lines[block.first].start, lines[block.last].end);
        return split_flow(md, start, end, max_tokens, sizer, out);
    }
    let mut i = 0;
    while i < body.len() {
        let (mut j, mut sum) = (i + 1, frame + cost[i]);
        while j < body.len() && sum + cost[j] <= max_tokens {
            sum += cost[j];
            j += 1;
        }
        while j > i + 1 && sizer.size(&compose(&body[i..j]))? > max_tokens {
            j -= 1;
        }
        let first = if i == 0 { block.first } else { body[i] };
        let last = if j == body.len() {
            block.last
        } else {
            body[j - 1]
        };
        out.push(Piece {
            start: lines[first].start,
            end: lines[last].end,
            text: Some(compose(&body[i..j])),
        });
        i = j;
    }
    Ok(())
}

/// Each piece with its headings and character offsets.
fn finish(md: &str, pieces: Vec<Piece>, headings: &[blocks::Heading]) -> Vec<Chunk> {
    // Byte offsets to character offsets, in one walk over the document.
    let mut marks: Vec<usize> = pieces.iter().flat_map(|p| [p.start, p.end]).collect();
    marks.sort_unstable();
    marks.dedup();
    let mut chars = Vec::with_capacity(marks.len());
    let (mut byte, mut count) = (0, 0);
    for &mark in &marks {
        count += md[byte..mark].chars().count();
        byte = mark;
        chars.push(count);
    }
    let char_at = |b: usize| chars[marks.binary_search(&b).expect("a marked offset")];
    let mut path: Vec<&blocks::Heading> = Vec::new();
    let mut next = 0;
    pieces
        .into_iter()
        .map(|p| {
            while next < headings.len() && headings[next].at <= p.start {
                let h = &headings[next];
                while path.last().is_some_and(|top| top.level >= h.level) {
                    path.pop();
                }
                path.push(h);
                next += 1;
            }
            Chunk {
                text: p.text.unwrap_or_else(|| md[p.start..p.end].to_string()),
                headings: path.iter().map(|h| h.text.clone()).collect(),
                start: char_at(p.start),
                end: char_at(p.end),
            }
        })
        .collect()
}
