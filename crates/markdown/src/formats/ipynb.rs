//! Jupyter notebooks: Markdown cells as they are, code cells fenced in the kernel's language,
//! text outputs fenced after them.

use serde_json::Value;

use crate::detect::Format;
use crate::error::{Error, Result};
use crate::limits::Ctx;
use crate::md;

fn source(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(Value::as_str).collect(),
        _ => String::new(),
    }
}

pub fn convert(ctx: Ctx<'_>, bytes: &[u8]) -> Result<String> {
    let text = crate::text::decode(bytes);
    let nb: Value = serde_json::from_str(text.trim_start_matches('\u{feff}'))
        .map_err(|e| Error::malformed(Format::Ipynb, e))?;
    let cells = nb
        .get("cells")
        .and_then(Value::as_array)
        .ok_or_else(|| Error::malformed(Format::Ipynb, "no `cells` array"))?;
    let meta = nb.get("metadata");
    let lang = meta
        .and_then(|m| {
            m.pointer("/kernelspec/language")
                .or_else(|| m.pointer("/language_info/name"))
        })
        .and_then(Value::as_str)
        .unwrap_or("python")
        .to_string();
    let mut blocks = Vec::new();
    if let Some(title) = meta.and_then(|m| m.get("title")).and_then(Value::as_str) {
        blocks.push(format!("# {title}"));
    }
    for cell in cells {
        ctx.check_time()?;
        let src = cell.get("source").map(source).unwrap_or_default();
        match cell.get("cell_type").and_then(Value::as_str) {
            Some("markdown") => blocks.push(src),
            Some("code") => {
                if !src.trim().is_empty() {
                    blocks.push(md::fenced(&lang, &src));
                }
                for output in cell
                    .get("outputs")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if let Some(out) = output_text(output) {
                        if !out.trim().is_empty() {
                            blocks.push(md::fenced("", &out));
                        }
                    }
                }
            }
            _ => {
                if !src.trim().is_empty() {
                    blocks.push(md::fenced("", &src));
                }
            }
        }
    }
    Ok(md::join_blocks(blocks))
}

fn output_text(output: &Value) -> Option<String> {
    match output.get("output_type").and_then(Value::as_str)? {
        "stream" => output.get("text").map(source),
        "execute_result" | "display_data" => output.pointer("/data/text~1plain").map(source),
        "error" => {
            let name = output
                .get("ename")
                .and_then(Value::as_str)
                .unwrap_or("Error");
            let value = output.get("evalue").and_then(Value::as_str).unwrap_or("");
            Some(format!("{name}: {value}"))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{Budget, Limits};

    #[test]
    fn cells_and_outputs_render_in_order() {
        let nb = r##"{"cells":[{"cell_type":"markdown","source":["# Analysis\n","Some *notes*."]},
            {"cell_type":"code","source":"print(1+1)","outputs":[{"output_type":"stream","name":"stdout","text":["2\n"]}]},
            {"cell_type":"code","source":"x","outputs":[{"output_type":"error","ename":"NameError","evalue":"x undefined"}]}],
            "metadata":{"kernelspec":{"language":"python"}},"nbformat":4}"##;
        let budget = Budget::new(Limits::default());
        let out = convert(
            Ctx {
                budget: &budget,
                depth: 0,
            },
            nb.as_bytes(),
        )
        .unwrap();
        assert!(out.starts_with("# Analysis\nSome *notes*."), "{out}");
        assert!(out.contains("```python\nprint(1+1)\n```"), "{out}");
        assert!(out.contains("```\n2\n```"), "{out}");
        assert!(out.contains("NameError: x undefined"), "{out}");
    }
}
