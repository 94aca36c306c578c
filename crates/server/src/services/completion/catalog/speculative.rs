//! A text row's `speculative` key: prompt lookup's bounds, or the draft model another row of the
//! table names (looked up once every row is resolved).

use std::collections::BTreeMap;
use std::path::Path;

use hearth_infer::TextModelConfig;
use hearth_scheduler::{DraftModel, Ngram, Speculation};

use super::{CatalogError, DraftEntry, TextModelEntry};
use crate::model_table::RawSpeculative;

/// `speculative`: absent or `method = "off"` is no speculation; `"ngram"` is prompt lookup
/// within its bounds (each left out takes [`Ngram::default`]'s); `"draft"` is a draft model, the
/// row `model` names (returned beside), drafting up to `max_draft` tokens.
pub(super) fn speculation(
    raw: Option<&RawSpeculative>,
) -> Result<(Speculation, Option<String>), String> {
    let Some(raw) = raw else {
        return Ok((Speculation::Off, None));
    };
    let lookup_given = raw.min_match.is_some() || raw.max_match.is_some();
    let method = raw.method.trim();
    if raw.model.is_some() && method != "draft" {
        return Err(format!(
            "speculative: model names a draft model, which method {method:?} does not use \
             (method = \"draft\" does)"
        ));
    }
    match method {
        "off" if !lookup_given && raw.max_draft.is_none() => Ok((Speculation::Off, None)),
        "off" => {
            Err("speculative: method \"off\" takes no max_draft, min_match or max_match".into())
        }
        "ngram" => {
            let d = Ngram::default();
            let n = Ngram {
                max_draft: raw.max_draft.unwrap_or(d.max_draft),
                min_match: raw.min_match.unwrap_or(d.min_match),
                max_match: raw
                    .max_match
                    .unwrap_or(d.max_match.max(raw.min_match.unwrap_or(0))),
            };
            n.check()?;
            Ok((Speculation::Ngram(n), None))
        }
        "draft" => {
            if lookup_given {
                return Err(
                    "speculative: method \"draft\" takes no min_match or max_match (they \
                            bound prompt lookup, method \"ngram\")"
                        .into(),
                );
            }
            let model = raw.model.as_deref().map(str::trim).unwrap_or_default();
            if model.is_empty() {
                return Err(
                    "speculative: method \"draft\" needs model, the id of the [text] \
                            row whose weights draft"
                        .into(),
                );
            }
            let d = DraftModel {
                max_draft: raw.max_draft.unwrap_or(DraftModel::default().max_draft),
            };
            d.check()?;
            Ok((Speculation::Draft(d), Some(model.to_string())))
        }
        other => Err(format!(
            "speculative: unknown method {other:?} (\"ngram\" drafts by prompt lookup, \"draft\" \
             by a draft model, \"off\" does not speculate)"
        )),
    }
}

/// Each entry's draft (`drafts[i]`, the id its `speculative` names) resolved to that row's load
/// settings: refused when it is the entry itself, its weights, an unknown id or on another device.
pub(super) fn resolve_drafts(
    entries: &mut [TextModelEntry],
    drafts: Vec<Option<String>>,
    path: &Path,
) -> Result<(), CatalogError> {
    let loads: BTreeMap<String, TextModelConfig> = entries
        .iter()
        .map(|e| (e.spec.id.clone(), e.load.clone()))
        .collect();
    for (entry, draft) in entries.iter_mut().zip(drafts) {
        let Some(draft) = draft else { continue };
        let invalid = |message: String| CatalogError::Invalid {
            path: path.to_path_buf(),
            section: "text",
            id: entry.spec.id.clone(),
            message,
        };
        if draft == entry.spec.id {
            return Err(invalid(format!(
                "speculative: model {draft:?} is this row: a draft must be a smaller model"
            )));
        }
        let load = loads.get(&draft).ok_or_else(|| {
            invalid(format!(
                "speculative: model {draft:?} is not a [text] row of this table (rows: {})",
                loads.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })?;
        if load.source == entry.load.source {
            return Err(invalid(format!(
                "speculative: model {draft:?} loads this row's own weights: a draft must be a \
                 smaller model"
            )));
        }
        if load.device != entry.load.device {
            return Err(invalid(format!(
                "speculative: model {draft:?} is on {:?}, this row on {:?}: a draft runs beside \
                 its model, on the same device",
                load.device, entry.load.device
            )));
        }
        entry.draft = Some(DraftEntry {
            id: draft,
            load: load.clone(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use hearth_infer::WeightSource;

    use super::*;
    use crate::services::completion::catalog::{parse, tests::table};

    #[test]
    fn speculative_decoding_is_read_with_defaults_and_bad_bounds_are_named() {
        let base = Path::new("/models");
        let spec = |extra: &str| {
            parse(&table(extra), base).map(|c| c.entry("alpha-3.3").unwrap().scheduler.speculation)
        };
        assert_eq!(spec("").unwrap(), Speculation::Off);
        assert_eq!(
            spec("speculative = { method = \"off\" }").unwrap(),
            Speculation::Off
        );
        assert_eq!(
            spec("speculative = { method = \"ngram\" }").unwrap(),
            Speculation::Ngram(Ngram::default())
        );
        assert_eq!(
            spec("speculative = { method = \"ngram\", max_draft = 16, min_match = 3 }").unwrap(),
            Speculation::Ngram(Ngram {
                max_draft: 16,
                min_match: 3,
                max_match: 4
            })
        );
        assert_eq!(
            spec("speculative = { method = \"ngram\", min_match = 6 }").unwrap(),
            Speculation::Ngram(Ngram {
                max_draft: 8,
                min_match: 6,
                max_match: 6
            }),
            "a longer min_match raises the default max_match with it"
        );
        for (bad, names) in [
            ("speculative = { method = \"medusa\" }", "medusa"),
            (
                "speculative = { method = \"ngram\", max_draft = 0 }",
                "max_draft",
            ),
            (
                "speculative = { method = \"ngram\", max_draft = 100000 }",
                "max_draft",
            ),
            (
                "speculative = { method = \"ngram\", min_match = 5, max_match = 2 }",
                "min_match",
            ),
            ("speculative = { method = \"off\", max_draft = 4 }", "off"),
        ] {
            let err = spec(bad).unwrap_err().to_string();
            assert!(
                err.contains(names) && err.contains("alpha-3.3"),
                "{bad}: {err}"
            );
        }
        let err = spec("speculative = { method = \"ngram\", max_drafts = 4 }")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("max_drafts") && err.contains("max_draft"),
            "{err}"
        );
    }

    #[test]
    fn a_draft_model_is_another_row_of_the_table_on_the_same_device() {
        let base = Path::new("/models");
        // alpha-3.3 with `extra`, and a small row to draft for it.
        let with = |extra: &str, draft_row: &str| {
            let text = format!(
                "{}\n[text.small]\nweights = \"small.gguf\"\ninput_price_per_million = \"1\"\n\
                 output_price_per_million = \"1\"\n{draft_row}",
                table(extra)
            );
            parse(&text, base).map(|c| c.entry("alpha-3.3").unwrap().clone())
        };
        let alpha = with(
            "speculative = { method = \"draft\", model = \"small\" }",
            "threads = 1",
        )
        .unwrap();
        assert_eq!(
            alpha.scheduler.speculation,
            Speculation::Draft(DraftModel::default())
        );
        let draft = alpha.draft.expect("small drafts");
        assert_eq!(draft.id, "small");
        assert_eq!(
            draft.load.source,
            WeightSource::Local {
                path: PathBuf::from("/models/small.gguf")
            }
        );
        assert_eq!(draft.load.threads, 1, "the draft loads as its own row says");
        let alpha = with(
            "speculative = { method = \"draft\", model = \"small\", max_draft = 5 }",
            "",
        )
        .unwrap();
        assert_eq!(
            alpha.scheduler.speculation,
            Speculation::Draft(DraftModel { max_draft: 5 })
        );
        assert!(with("speculative = { method = \"ngram\" }", "")
            .unwrap()
            .draft
            .is_none());

        for (extra, draft_row, names) in [
            (
                "speculative = { method = \"draft\", model = \"tiny\" }",
                "",
                "\"tiny\" is not a [text] row",
            ),
            (
                "speculative = { method = \"draft\", model = \"alpha-3.3\" }",
                "",
                "is this row",
            ),
            (
                "speculative = { method = \"draft\", model = \"small\" }",
                "device = \"cuda\"",
                "same device",
            ),
            ("speculative = { method = \"draft\" }", "", "needs model"),
            (
                "speculative = { method = \"draft\", model = \" \" }",
                "",
                "needs model",
            ),
            (
                "speculative = { method = \"draft\", model = \"small\", min_match = 2 }",
                "",
                "min_match",
            ),
            (
                "speculative = { method = \"draft\", model = \"small\", max_draft = 0 }",
                "",
                "max_draft",
            ),
            (
                "speculative = { method = \"ngram\", model = \"small\" }",
                "",
                "method = \"draft\" does",
            ),
        ] {
            let err = with(extra, draft_row).unwrap_err().to_string();
            assert!(
                err.contains(names) && err.contains("alpha-3.3"),
                "{extra} / {draft_row}: {err}"
            );
        }
        // A row naming the weights alpha-3.3 itself loads is no draft.
        let text = format!(
            "{}\n[text.copy]\nweights = \"w.gguf\"\ninput_price_per_million = \"1\"\n\
             output_price_per_million = \"1\"\n",
            table("speculative = { method = \"draft\", model = \"copy\" }")
        );
        let err = parse(&text, base).unwrap_err().to_string();
        assert!(err.contains("own weights"), "{err}");
    }
}
