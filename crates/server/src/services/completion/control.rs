//! The completion service's models as `hearth models`, the admin API and a reload reach them:
//! the text engines (kind `text`), the embedding models (`embedding`) and the rerank models
//! (`rerank`), three registries behind one [`Control`], so that a reload resolves every row of
//! the three kinds from the new table before it changes any.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::{catalog, embeddings, rerank, Core};
use crate::model_table::{RawModelTable, TableError};
use crate::models::{Changes, Control, ModelError, ModelRow};

/// The completion listener's models, registered on the hub.
pub(super) struct CompletionModels(pub(super) Arc<Core>);

impl Control for CompletionModels {
    fn kind(&self) -> &'static str {
        // The first of its kinds: `text`, then `embedding` and `rerank` (each row says its own).
        "text"
    }
    fn rows(&self) -> Vec<ModelRow> {
        let core = &self.0;
        let mut rows = core.engines.rows();
        rows.extend(core.embeddings.rows());
        rows.extend(core.rerankers.rows());
        rows
    }
    fn load(&self, id: &str) -> Option<BoxFuture<'static, Result<(), ModelError>>> {
        let core = &self.0;
        core.engines
            .models()
            .load(id)
            .or_else(|| core.embeddings.models().load(id))
            .or_else(|| core.rerankers.models().load(id))
    }
    fn pull(&self, id: &str) -> Option<BoxFuture<'static, Result<(), ModelError>>> {
        let core = &self.0;
        core.engines
            .models()
            .pull(id)
            .or_else(|| core.embeddings.models().pull(id))
            .or_else(|| core.rerankers.models().pull(id))
    }
    fn unload(&self, id: &str) -> Option<Result<(), ModelError>> {
        let core = &self.0;
        core.engines
            .models()
            .unload(id)
            .or_else(|| core.embeddings.models().unload(id))
            .or_else(|| core.rerankers.models().unload(id))
    }
    fn plan(
        &self,
        table: &RawModelTable,
    ) -> Result<Box<dyn FnOnce() -> Changes + Send>, TableError> {
        let path = &self.0.table_path;
        let catalog = catalog::resolve(table, path)?;
        catalog::check_files(&catalog, path)?;
        let embeddings = embeddings::resolve(table, path)?;
        embeddings.check_files(path, "embedding")?;
        let rerankers = rerank::resolve(table, path)?;
        rerankers.check_files(path, "rerank")?;
        let core = Arc::clone(&self.0);
        Ok(Box::new(move || {
            let mut changes = core.engines.apply(&catalog, &core.hub);
            core.catalog.replace(catalog);
            changes.extend(core.embeddings.apply(embeddings, &core.hub));
            changes.extend(core.rerankers.apply(rerankers, &core.hub));
            changes
        }))
    }
}
