//! The image service's model in the shared registry (`crate::models`): what a loaded model is
//! ([`Ready`]: its worker, provenance and bound LoRAs), how it loads, when two rows are the same
//! model ([`ImageKey`]), and the service as `hearth models` and a reload reach it.

use std::collections::BTreeMap;
use std::sync::Arc;

use hearth_imagine::lora::Lora;
use hearth_imagine::{ImageWorker, LoadOptions, Provenance};
use tracing::warn;

use super::{catalog, ImageModelEntry, ImagineState};
use crate::models::{Keep, Loader, Need, Place, Progress, Served, UnitSpec};

/// A loaded image model: its worker thread, where its weights came from, and its declared
/// LoRAs, each bound to it or the reason it could not be.
pub(super) struct Ready {
    pub(super) worker: ImageWorker,
    pub(super) provenance: Provenance,
    pub(super) loras: BTreeMap<String, Result<Arc<Lora>, String>>,
}

impl Served for Arc<Ready> {
    fn unavailable(&self) -> Option<String> {
        (!self.worker.is_alive()).then(|| "the image worker stopped".to_string())
    }
    fn in_flight(&self) -> usize {
        self.worker.in_flight()
    }
    async fn stop(self) {
        // The worker's thread ends, dropping the pipeline, once its last handle is gone.
        let ended = self.worker.ended();
        drop(self);
        crate::models::until_released(ended, "an image worker's pipeline").await;
    }
}

/// What makes two image models the same: the resolved row and its files as they are on disk.
#[derive(Debug, PartialEq)]
pub(super) struct ImageKey {
    entry: ImageModelEntry,
    files: Vec<crate::models::FileStamp>,
}

impl ImagineState {
    /// The served row now; a request keeps the one it started with.
    pub(super) fn entry(&self) -> Arc<ImageModelEntry> {
        self.entry.now()
    }

    /// Routes the current row's id to its model (a changed row loads beside the old one).
    pub(super) fn apply(&self) -> crate::models::Changes {
        let entry = self.entry();
        let files = crate::models::FileStamp::of(&entry.weights_dir());
        let need = Need {
            // A device the loader will refuse holds nothing; counted on the host meanwhile.
            place: entry
                .device
                .parse::<hearth_infer::DeviceSpec>()
                .map_or(Place::Host, Place::from),
            bytes: files.iter().map(|f| f.len).sum(),
        };
        let (e, observers) = (Arc::clone(&entry), Arc::clone(&self.observers));
        let load: Loader<Arc<Ready>> = Arc::new(move |_: &Progress| load_image(&e, observers()));
        self.models.apply(vec![UnitSpec {
            ids: vec![entry.id.clone()],
            key: ImageKey {
                entry: (*entry).clone(),
                files,
            },
            load,
            // The image model's hub files load through `hearth_imagine`'s own cache-first fetch.
            pull: None,
            need,
            keep: Keep {
                keep_alive: entry.keep_alive.unwrap_or(self.app.hub.config().keep_alive),
                pinned: entry.pinned,
            },
            preload: true,
        }])
    }
}

/// Loads an image model and starts its worker, binding its LoRAs.
fn load_image(
    e: &ImageModelEntry,
    on_step: hearth_imagine::StepObserver,
) -> Result<Arc<Ready>, String> {
    let opts = LoadOptions {
        device: e.device.clone(),
        dtype: e.dtype.clone(),
        tiny_dir: e.tiny_dir.clone(),
        hub_cache: None,
    };
    let loaded = hearth_imagine::load_model(&e.source, &opts).map_err(|e| e.to_string())?;
    // A LoRA that does not fit is refused by the requests that name it, not by the model.
    let loras = e
        .lora_files
        .iter()
        .map(|(name, file)| {
            let bound = Lora::load(file, &loaded.pipeline).map(Arc::new);
            if let Err(why) = &bound {
                warn!(model = %e.id, lora = %name, error = %why, "LoRA not usable");
            }
            (name.clone(), bound.map_err(|why| why.to_string()))
        })
        .collect();
    let worker = ImageWorker::spawn_observed(loaded.pipeline, e.max_queued, &e.id, on_step)
        .map_err(|e| e.to_string())?;
    if let Provenance::Tiny(dir) = &loaded.provenance {
        warn!(
            model = %e.id, dir = %dir.display(),
            "serving the tiny SDXL-shaped TEST model: images are noise-like, not real pictures"
        );
    }
    Ok(Arc::new(Ready {
        worker,
        provenance: loaded.provenance,
        loras,
    }))
}

/// The image model as `hearth models` and a reload reach it.
impl crate::models::Control for ImagineState {
    fn kind(&self) -> &'static str {
        "image"
    }
    fn rows(&self) -> Vec<crate::models::ModelRow> {
        self.models.rows()
    }
    fn load(
        &self,
        id: &str,
    ) -> Option<futures::future::BoxFuture<'static, Result<(), crate::models::ModelError>>> {
        self.models.load(id)
    }
    fn pull(
        &self,
        id: &str,
    ) -> Option<futures::future::BoxFuture<'static, Result<(), crate::models::ModelError>>> {
        self.models.pull(id)
    }
    fn unload(&self, id: &str) -> Option<Result<(), crate::models::ModelError>> {
        self.models.unload(id)
    }
    fn plan(
        &self,
        table: &crate::model_table::RawModelTable,
    ) -> Result<Box<dyn FnOnce() -> crate::models::Changes + Send>, crate::model_table::TableError>
    {
        let entry = served_entry(table, &self.app.config.models)?;
        let st = self.clone();
        Ok(Box::new(move || {
            st.entry.replace(entry);
            st.apply()
        }))
    }
}

/// The row the service serves: the spec's image model id, or the table's first image row.
fn served_entry(
    table: &crate::model_table::RawModelTable,
    path: &std::path::Path,
) -> Result<ImageModelEntry, crate::model_table::TableError> {
    let entries = catalog::resolve(table, path)?;
    let entry = chosen(entries).ok_or_else(|| crate::model_table::TableError::Invalid {
        path: path.to_path_buf(),
        section: "image",
        id: String::new(),
        message: "no image model configured".into(),
    })?;
    catalog::check_files(&entry, path)?;
    Ok(entry)
}

/// The row served among the table's image rows: the spec's image model id, else the first.
pub(super) fn chosen(entries: Vec<ImageModelEntry>) -> Option<ImageModelEntry> {
    let spec = entries.iter().position(|e| e.id == "xl-lightning");
    entries.into_iter().nth(spec.unwrap_or(0))
}
