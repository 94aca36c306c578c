//! The image-model table: the `[image."id"]` rows of the parsed `models.toml` ([`RawModelTable`],
//! read once by `model_table`), resolved into where the weights are, the price, the request
//! bounds and the worker's queue.
//!
//! Keys (all but `price_per_image` optional):
//! `weights` (diffusers folder), `unet_file` (replaces the folder's UNet, e.g. the Lightning
//! 4-step file), `hf = { base, unet_repo, unet_file, vae_repo, revision, fp16_variant }`,
//! `tiny_weights` (where the tiny test model goes, default `weights/tiny-sdxl`),
//! `price_per_image` (at 1024x1024 and 4 steps), `guidance_scale` (classifier-free guidance
//! used when a negative prompt is given, default 2.0), `default_steps` (4), `max_steps` (8),
//! `default_size` (1024), `min_size` (256), `max_size` (2048), `max_pixels` (1048576),
//! `max_queued` (4), `device` (default `[defaults] device`), `dtype`,
//! `loras = { name = "path.safetensors", ... }` (LoRA files a request may name in `loras`; at
//! most [`MAX_DECLARED_LORAS`], names of letters, digits, `-`, `_` and `.`).

use std::path::{Path, PathBuf};
use std::str::FromStr;

use hearth_billing::Price;
use hearth_imagine::ImageModelSource;
use rust_decimal::Decimal;

use crate::models::KeepAlive;

/// Sizes are multiples of this (the VAE's 8x and the UNet's two 2x downsamplings need 32;
/// 64 is SDXL's training grid).
pub const SIZE_MULTIPLE: usize = 64;
/// The size and step count `price_per_image` is quoted for.
pub const REFERENCE_PIXELS: u64 = 1024 * 1024;
pub const REFERENCE_STEPS: u64 = 4;
/// The most LoRA files one model may declare.
pub const MAX_DECLARED_LORAS: usize = 64;

/// Request bounds and defaults of one image model.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub min_size: usize,
    pub max_size: usize,
    pub default_size: usize,
    pub max_pixels: usize,
    pub max_steps: usize,
    pub default_steps: usize,
    /// The LoRA names a request may use (`loras` in the table), sorted.
    pub loras: Vec<String>,
}

#[cfg(test)]
impl Limits {
    /// The defaults of a table row that sets none, with two LoRAs declared (`ink`, `pixel`).
    pub fn for_tests() -> Limits {
        Limits {
            min_size: 256,
            max_size: 2048,
            default_size: 1024,
            max_pixels: 1 << 20,
            max_steps: 8,
            default_steps: 4,
            loras: vec!["ink".into(), "pixel".into()],
        }
    }
}

/// One image model id, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageModelEntry {
    pub id: String,
    pub source: ImageModelSource,
    pub tiny_dir: PathBuf,
    /// `price_per_image` for [`REFERENCE_PIXELS`] × [`REFERENCE_STEPS`] pixel-steps.
    pub price_per_image: Price,
    pub guidance_scale: f64,
    pub limits: Limits,
    pub max_queued: usize,
    pub device: String,
    pub dtype: Option<String>,
    /// Each declared LoRA's name and file, bound to the model when it loads.
    pub lora_files: Vec<(String, PathBuf)>,
    /// `keep_alive`; `None`: `[loading] keep_alive`.
    pub keep_alive: Option<KeepAlive>,
    /// `pinned`: never unloaded.
    pub pinned: bool,
}

impl ImageModelEntry {
    /// The folder its weights load from (the tiny test model's when the row names none that
    /// exists).
    pub fn weights_dir(&self) -> PathBuf {
        match &self.source.weights {
            Some(dir) if dir.exists() => dir.clone(),
            _ => self.tiny_dir.clone(),
        }
    }
}

/// That the files a reload would bind exist (the LoRAs): a typo refuses the reload instead of
/// replacing a running model.
pub(crate) fn check_files(entry: &ImageModelEntry, path: &Path) -> Result<(), CatalogError> {
    for (name, file) in &entry.lora_files {
        model_table::must_exist(path, "image", &entry.id, &format!("loras: {name} = "), file)?;
    }
    Ok(())
}

pub use crate::model_table::TableError as CatalogError;
use crate::model_table::{self, RawModelTable};

/// [`load`] on text already read.
#[cfg(test)]
pub fn parse(path: &Path, text: &str) -> Result<Vec<ImageModelEntry>, CatalogError> {
    resolve(&model_table::parse(path, text)?, path)
}

/// Every `[image."id"]` row of the table read from `path`, resolved.
pub(crate) fn resolve(
    raw: &RawModelTable,
    path: &Path,
) -> Result<Vec<ImageModelEntry>, CatalogError> {
    let rel = |p: &Path| model_table::relative_to(path, p);
    if raw.image.is_empty() {
        return Err(CatalogError::Empty {
            path: path.into(),
            section: "image",
        });
    }
    let mut out = Vec::new();
    for (id, m) in &raw.image {
        let bad = |message: String| CatalogError::Invalid {
            path: path.into(),
            section: "image",
            id: id.clone(),
            message,
        };
        let amount = Decimal::from_str(&m.price_per_image)
            .map_err(|e| bad(format!("price_per_image {:?}: {e}", m.price_per_image)))?;
        let price_per_image = Price::new(amount, Decimal::from(REFERENCE_PIXELS * REFERENCE_STEPS))
            .map_err(|e| bad(format!("price_per_image {:?}: {e}", m.price_per_image)))?;
        let limits = Limits {
            min_size: m.min_size.unwrap_or(256),
            max_size: m.max_size.unwrap_or(2048),
            default_size: m.default_size.unwrap_or(1024),
            max_pixels: m.max_pixels.unwrap_or(1024 * 1024),
            max_steps: m.max_steps.unwrap_or(8),
            default_steps: m.default_steps.unwrap_or(4),
            loras: m.loras.iter().flatten().map(|(k, _)| k.clone()).collect(),
        };
        let lora_files: Vec<(String, PathBuf)> = m
            .loras
            .iter()
            .flatten()
            .map(|(name, file)| (name.clone(), rel(file)))
            .collect();
        if lora_files.len() > MAX_DECLARED_LORAS {
            return Err(bad(format!(
                "loras: at most {MAX_DECLARED_LORAS} may be declared"
            )));
        }
        if let Some((name, _)) = lora_files.iter().find(|(name, _)| {
            name.is_empty()
                || name.len() > 64
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        }) {
            return Err(bad(format!(
                "loras: the name {name:?} must be 1 to 64 letters, digits, '-', '_' or '.'"
            )));
        }
        let l = &limits;
        for (name, v) in [
            ("min_size", l.min_size),
            ("max_size", l.max_size),
            ("default_size", l.default_size),
        ] {
            if v == 0 || !v.is_multiple_of(SIZE_MULTIPLE) {
                return Err(bad(format!(
                    "{name} must be a positive multiple of {SIZE_MULTIPLE}"
                )));
            }
        }
        if !(l.min_size <= l.default_size && l.default_size <= l.max_size) {
            return Err(bad("need min_size <= default_size <= max_size".into()));
        }
        if l.default_size * l.default_size > l.max_pixels {
            return Err(bad("default_size squared exceeds max_pixels".into()));
        }
        if !(1 <= l.default_steps && l.default_steps <= l.max_steps && l.max_steps <= 1000) {
            return Err(bad("need 1 <= default_steps <= max_steps <= 1000".into()));
        }
        let guidance_scale = m.guidance_scale.unwrap_or(2.0);
        if !(guidance_scale.is_finite() && guidance_scale > 1.0 && guidance_scale <= 30.0) {
            return Err(bad("guidance_scale must be above 1 and at most 30".into()));
        }
        let source = ImageModelSource {
            weights: m.weights.as_deref().map(rel),
            unet_file: m.unet_file.clone(),
            hf: m.hf.clone(),
        };
        out.push(ImageModelEntry {
            tiny_dir: rel(m
                .tiny_weights
                .as_deref()
                .unwrap_or(Path::new("weights/tiny-sdxl"))),
            source,
            price_per_image,
            guidance_scale,
            limits,
            max_queued: m.max_queued.unwrap_or(4).max(1),
            device: m
                .device
                .clone()
                .or(raw.defaults.device.clone())
                .unwrap_or_else(|| "cpu".into()),
            dtype: m.dtype.clone(),
            lora_files,
            keep_alive: m.keep_alive,
            pinned: m.pinned.unwrap_or(false),
            id: id.clone(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table at `path` read and resolved, as the server does at start.
    fn load(path: &Path) -> Result<Vec<ImageModelEntry>, CatalogError> {
        resolve(&model_table::load(path)?, path)
    }

    #[test]
    fn the_shipped_model_table_has_xl_lightning_with_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models.toml");
        let entries = load(&path).unwrap();
        let e = entries
            .iter()
            .find(|e| e.id == "xl-lightning")
            .expect("xl-lightning entry");
        assert_eq!(
            e.price_per_image.amount(),
            Decimal::from_str("0.040").unwrap()
        );
        assert_eq!(e.limits.default_steps, 4);
        assert_eq!(e.limits.default_size, 1024);
        assert!(e
            .source
            .weights
            .as_ref()
            .unwrap()
            .ends_with("weights/sdxl-lightning"));
        assert!(e.tiny_dir.ends_with("weights/tiny-sdxl"));
    }

    #[test]
    fn bad_entries_are_refused_with_the_key_named() {
        let p = Path::new("/x/models.toml");
        let err = parse(p, "[image.a]\nprice_per_image = \"abc\"\n").unwrap_err();
        assert!(err.to_string().contains("price_per_image"), "{err}");
        let err = parse(
            p,
            "[image.a]\nprice_per_image = \"1\"\ndefault_size = 1000\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("default_size"), "{err}");
        let err = parse(
            p,
            "[image.a]\nprice_per_image = \"1\"\nguidance_scale = 0.5\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("guidance_scale"), "{err}");
        assert!(matches!(
            parse(p, "[text.a]\nweights = \"a.gguf\"\n"),
            Err(CatalogError::Empty { .. })
        ));
    }

    #[test]
    fn the_image_rows_of_a_table_with_both_kinds_resolve_with_its_defaults() {
        let p = Path::new("/srv/models.toml");
        let text = "[defaults]\ndevice = \"cuda:1\"\nthreads = 2\n\n\
            [text.m]\nweights = \"m.gguf\"\ninput_price_per_million = \"1\"\noutput_price_per_million = \"1\"\n\n\
            [image.a]\nprice_per_image = \"1\"\n";
        let table = model_table::parse(p, text).unwrap();
        let entries = resolve(&table, p).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(
            (entries[0].id.as_str(), entries[0].device.as_str()),
            ("a", "cuda:1")
        );
    }

    #[test]
    fn loras_are_declared_by_name_with_their_files_beside_the_table() {
        let p = Path::new("/srv/hearth/models.toml");
        let e = &parse(
            p,
            "[image.a]\nprice_per_image = \"1\"\nloras = { pixel-art = \"l/pixel.safetensors\", ink = \"/abs/ink.safetensors\" }\n",
        )
        .unwrap()[0];
        assert_eq!(e.limits.loras, ["ink", "pixel-art"]);
        assert_eq!(
            e.lora_files,
            [
                ("ink".to_string(), PathBuf::from("/abs/ink.safetensors")),
                (
                    "pixel-art".to_string(),
                    PathBuf::from("/srv/hearth/l/pixel.safetensors")
                ),
            ]
        );
        let err = parse(
            p,
            "[image.a]\nprice_per_image = \"1\"\nloras = { \"a b\" = \"x\" }\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("loras"), "{err}");
    }

    #[test]
    fn relative_paths_are_resolved_against_the_table_folder() {
        let p = Path::new("/srv/hearth/models.toml");
        let e = &parse(
            p,
            "[image.a]\nprice_per_image = \"1\"\nweights = \"w/sdxl\"\n",
        )
        .unwrap()[0];
        assert_eq!(
            e.source.weights.as_deref(),
            Some(Path::new("/srv/hearth/w/sdxl"))
        );
        assert_eq!(e.tiny_dir, Path::new("/srv/hearth/weights/tiny-sdxl"));
    }
}
