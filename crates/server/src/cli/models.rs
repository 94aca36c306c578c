//! `hearth models list|load|pull|unload|reload`: the running server's models, through its admin API
//! (`services/admin/models.rs`). Only a running server has loaded models, so these always go
//! over HTTP, found through the data dir like every admin command.

use clap::Subcommand;
use serde_json::json;

use super::access::server_call;
use super::{load_config, CliError, Common};
use crate::config::RawConfig;
use crate::models::ModelRow;
use crate::services::admin::models::{ModelResponse, ModelsResponse, ReloadResponse};

#[derive(Debug, Subcommand)]
pub(super) enum ModelsCommand {
    /// Every model of the table: kind, state, memory, device, last use, keep-alive.
    #[command(after_help = "Example:\n  hearth models list")]
    List {
        /// Print the admin API's JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Load a model and wait until it is ready, unloading idle models (least recently used
    /// first) when the memory budget needs room.
    #[command(after_help = "Example:\n  hearth models load gamma-3.5-sonnet")]
    Load {
        id: String,
        #[command(flatten)]
        common: Common,
    },
    /// Download a model's weights from its hub (`hf = ...` rows) without loading them, resuming
    /// a download cut short; every file's checksum is checked.
    #[command(after_help = "Example:\n  hearth models pull my-qwen")]
    Pull {
        id: String,
        #[command(flatten)]
        common: Common,
    },
    /// Unload a model: at once when nothing runs on it, else when its running requests end.
    #[command(after_help = "Example:\n  hearth models unload gamma-3.5-sonnet")]
    Unload {
        id: String,
        #[command(flatten)]
        common: Common,
    },
    /// Read models.toml again: added models appear, removed ones leave once idle, changed ones
    /// load beside the running version and take over when ready. `kill -HUP` does the same. A
    /// table with an error changes nothing.
    #[command(after_help = "Example:\n  hearth models reload")]
    Reload {
        #[command(flatten)]
        common: Common,
    },
}

pub(super) async fn run(command: ModelsCommand) -> Result<(), CliError> {
    match command {
        ModelsCommand::List { json, common } => {
            let config = load_config(&common, RawConfig::default())?;
            let resp: ModelsResponse = server_call(&config, "models", json!({})).await?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&resp).unwrap_or_default()
                );
            } else {
                print_rows(&resp.models);
            }
        }
        ModelsCommand::Load { id, common } => {
            let config = load_config(&common, RawConfig::default())?;
            let resp: ModelResponse =
                server_call(&config, "models/load", json!({ "id": id })).await?;
            print_rows(&[resp.model]);
        }
        ModelsCommand::Pull { id, common } => {
            let config = load_config(&common, RawConfig::default())?;
            let resp: ModelResponse =
                server_call(&config, "models/pull", json!({ "id": id })).await?;
            print_rows(&[resp.model]);
        }
        ModelsCommand::Unload { id, common } => {
            let config = load_config(&common, RawConfig::default())?;
            let resp: ModelResponse =
                server_call(&config, "models/unload", json!({ "id": id })).await?;
            if resp.model.unload_when_idle {
                println!(
                    "{id} runs {} request(s): it unloads when they end",
                    resp.model.in_flight
                );
            }
            print_rows(&[resp.model]);
        }
        ModelsCommand::Reload { common } => {
            let config = load_config(&common, RawConfig::default())?;
            let resp: ReloadResponse = server_call(&config, "models/reload", json!({})).await?;
            let c = &resp.changes;
            for (word, ids) in [
                ("added", &c.added),
                ("removed", &c.removed),
                ("changed", &c.changed),
                ("unchanged", &c.unchanged),
            ] {
                if !ids.is_empty() {
                    println!("{word}: {}", ids.join(", "));
                }
            }
            print_rows(&resp.models);
        }
    }
    Ok(())
}

fn print_rows(rows: &[ModelRow]) {
    println!(
        "{:<24} {:<6} {:<10} {:>10} {:<7} {:>7} {:<8} LAST USED",
        "ID", "KIND", "STATE", "MEMORY", "DEVICE", "RUNNING", "KEEP"
    );
    for r in rows {
        let state = match r.next {
            Some(next) => format!("{}+{}", r.state.word(), next.word()),
            None => r.state.word().to_string(),
        };
        let keep = if r.pinned {
            "pinned".to_string()
        } else {
            r.keep_alive.clone()
        };
        println!(
            "{:<24} {:<6} {:<10} {:>7} MiB {:<7} {:>7} {:<8} {}",
            r.id,
            r.kind,
            state,
            r.memory_bytes.div_ceil(1 << 20),
            r.device,
            r.in_flight,
            keep,
            r.last_used.as_deref().unwrap_or("-"),
        );
        if let Some(why) = &r.error {
            println!("  failed: {why}");
        }
        if let Some(p) = &r.pull {
            println!(
                "  pulling {}: {} of {} MiB",
                p.file,
                p.done_bytes >> 20,
                p.total_bytes.div_ceil(1 << 20)
            );
        }
    }
}
