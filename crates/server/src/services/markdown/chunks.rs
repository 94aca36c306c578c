//! `?chunks=TOKENS` on the markdown service: beside the spec's `markdown` and
//! `original_filename`, a `chunks` array of the Markdown cut by `hearth-chunk` into pieces of at
//! most that many tokens of a model's tokenizer, ready to embed. `?tokenizer=ID` names an
//! `[embedding."id"]` or `[rerank."id"]` row of the model table, whose folder's `tokenizer.json`
//! counts; by default the first embedding row's. Without `?chunks` the answer is the spec's,
//! exactly.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hearth_chunk::{chunk, Chunk, TokenCount};
use tokenizers::Tokenizer;

use crate::error::MarkdownError;
use crate::model_table::{self, RawModelTable};

/// The fewest and most tokens a chunk may be asked to hold.
pub const MIN_TOKENS: usize = 16;
pub const MAX_TOKENS: usize = 65_536;

/// What the query asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub max_tokens: usize,
    pub tokenizer: Option<String>,
}

/// `chunks=` read: a whole number of tokens within the bounds.
pub fn max_tokens(value: &str) -> Result<usize, MarkdownError> {
    match value.trim().parse::<usize>() {
        Ok(n) if (MIN_TOKENS..=MAX_TOKENS).contains(&n) => Ok(n),
        _ => Err(MarkdownError::BadQuery(format!(
            "chunks must be a number of tokens from {MIN_TOKENS} to {MAX_TOKENS}, not {value:?}"
        ))),
    }
}

/// The tokenizers the model table offers, each read on first use and kept.
#[derive(Default)]
pub struct Tokenizers {
    folders: BTreeMap<String, PathBuf>,
    default: Option<String>,
    loaded: Mutex<HashMap<String, Arc<Tokenizer>>>,
}

impl Tokenizers {
    /// The embedding and rerank rows of the table read from `path` that are model folders (a
    /// GGUF embedder's tokenizer is not offered: chunks count with a `tokenizer.json`).
    pub fn from_table(table: &RawModelTable, path: &Path) -> Tokenizers {
        let folder =
            |row: &&model_table::RawEncoderModel| !hearth_embed::is_gguf(Path::new(&row.weights));
        let folders: BTreeMap<String, PathBuf> = table
            .embedding
            .iter()
            .chain(&table.rerank)
            .filter(|(_, row)| folder(row))
            .map(|(id, row)| {
                let dir = model_table::relative_to(path, Path::new(&row.weights));
                (id.clone(), dir)
            })
            .collect();
        Tokenizers {
            default: table
                .embedding
                .iter()
                .find(|(_, row)| folder(row))
                .map(|(id, _)| id.clone()),
            folders,
            loaded: Mutex::default(),
        }
    }

    /// The tokenizer `id` names (the default when none), read from its folder if not yet.
    fn get(&self, id: Option<&str>) -> Result<Arc<Tokenizer>, MarkdownError> {
        let id = match id.or(self.default.as_deref()) {
            Some(id) => id,
            None => {
                return Err(MarkdownError::BadQuery(
                    "chunks needs a tokenizer, and the model table has no [embedding] or \
                     [rerank] model to take one from"
                        .into(),
                ))
            }
        };
        let dir = self.folders.get(id).ok_or_else(|| {
            let known: Vec<&str> = self.folders.keys().map(String::as_str).collect();
            MarkdownError::BadQuery(format!(
                "tokenizer {id:?} is no embedding or rerank model; known: {}",
                known.join(", ")
            ))
        })?;
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = loaded.get(id) {
            return Ok(Arc::clone(t));
        }
        let tokenizer = hearth_embed::open_tokenizer(&dir.join("tokenizer.json"))
            .map_err(|e| MarkdownError::Failed(e.to_string()))?;
        let tokenizer = Arc::new(tokenizer);
        loaded.insert(id.to_string(), Arc::clone(&tokenizer));
        Ok(tokenizer)
    }
}

/// The Markdown's chunks as `ask` wants them, off the async workers, given up after `within`;
/// the Markdown is handed back with them (a large document is not copied to be chunked).
pub async fn chunks(
    tokenizers: Arc<Tokenizers>,
    markdown: String,
    ask: Ask,
    within: Duration,
) -> Result<(String, Vec<Chunk>), MarkdownError> {
    let deadline = Instant::now() + within;
    tokio::task::spawn_blocking(move || {
        let tokenizer = tokenizers.get(ask.tokenizer.as_deref())?;
        chunk(
            &markdown,
            ask.max_tokens,
            &TokenCount(&tokenizer),
            Some(deadline),
        )
        .map(|chunks| (markdown, chunks))
        .map_err(|e| MarkdownError::Failed(e.to_string()))
    })
    .await
    .map_err(|e| MarkdownError::Failed(format!("chunking failed: {e}")))?
}
