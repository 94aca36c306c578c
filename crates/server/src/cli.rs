//! The `hearth` command line: `serve`, `idp mint`, `users list`, `balance show|credit`,
//! `ledger`, `holds release`, `migrate`.
//! The only place that reads the process environment.

mod access;
mod models;
mod signals;

use clap::{Args, Parser, Subcommand};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use access::{admin_call, open_store_directly};
use signals::Signals;

use crate::app::{self, paths};
use crate::config::{
    Config, IdpChoice, Layers, RawAuthConfig, RawCompletionConfig, RawConfig, RawImagineConfig,
    RawMarkdownConfig, StoreChoice,
};
use crate::error::ApiError;
use crate::services::admin::{self, BalanceResponse, CreditResponse, UsersResponse};

#[derive(Debug, Parser)]
#[command(
    name = "hearth",
    version,
    about = "Hearth: a self-hosted inference host (authentication, completion, markdown conversion and image generation services).",
    long_about = None,
    after_help = "Configuration is layered: built-in defaults < hearth.toml (or --config) < HEARTH_* environment variables < flags;\nhearth.example.toml lists every key. Run every command with the server's data dir (default ./data).\n\nStart here:\n  hearth serve                      # all four services on 127.0.0.1:8081-8084\n  hearth idp mint alice             # an identity token to sign in with at http://127.0.0.1:8081/ui"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start the chosen services, each on its own listener, until Ctrl-C or SIGTERM.
    ///
    /// Every service has a web page at /ui: sign-in (auth), chat (completion), upload (markdown)
    /// and images (imagine). A second Ctrl-C or SIGTERM stops at once.
    #[command(
        after_help = "Examples:\n  hearth serve\n  hearth serve --services auth,markdown --markdown-addr 0.0.0.0:8083\n  HEARTH_BILLING_INITIAL_BALANCE=100 hearth serve --data-dir /var/lib/hearth"
    )]
    Serve(ServeArgs),
    /// The built-in shared-secret identity provider.
    #[command(subcommand)]
    Idp(IdpCommand),
    /// Users known to this Hearth.
    #[command(subcommand)]
    Users(UsersCommand),
    /// Balances: show or change them (works with the server running or stopped).
    #[command(subcommand)]
    Balance(BalanceCommand),
    /// A user's ledger: every credit and debit, oldest first.
    #[command(after_help = "Example:\n  hearth ledger alice")]
    Ledger {
        user: String,
        #[command(flatten)]
        common: Common,
    },
    /// Holds: funds reserved for requests in flight.
    #[command(subcommand)]
    Holds(HoldsCommand),
    /// The running server's models: list, load, unload, reload models.toml.
    #[command(subcommand)]
    Models(models::ModelsCommand),
    /// Create or upgrade the PostgreSQL tables of `[store] url` (every node also does at start).
    #[command(
        after_help = "Example:\n  HEARTH_STORE_URL=postgres://hearth@db/hearth hearth migrate"
    )]
    Migrate {
        #[command(flatten)]
        common: Common,
    },
    /// Developer tools.
    #[command(subcommand)]
    Dev(DevCommand),
}

#[derive(Debug, Subcommand)]
enum HoldsCommand {
    /// Give back the open holds of node ID: a node that crashed and will not start again
    /// (a node that restarts releases its own). Never use it on a node that is running.
    #[command(after_help = "Example:\n  hearth holds release --node node-3f2a9c01b7e4")]
    Release {
        /// The node's id (its `[store] node_id`, or `<data dir>/node-id`).
        #[arg(long, value_name = "ID")]
        node: String,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Debug, Subcommand)]
enum DevCommand {
    /// Write the tiny SDXL-shaped test model (seeded random weights, diffusers layout) into DIR.
    #[command(after_help = "Example:\n  hearth dev tiny-sdxl /tmp/tiny-sdxl")]
    TinySdxl {
        /// Folder to write (created if missing; files in it are overwritten).
        dir: PathBuf,
        /// Seed of the weights.
        #[arg(long, default_value_t = hearth_imagine::tiny::TINY_SEED)]
        seed: u64,
    },
    /// Write a llama-shaped GGUF model with seeded random weights and the tokenizer of another
    /// GGUF file (default shape: Llama 3.2 1B's layers; the vocabulary is the tokenizer's).
    #[command(after_help = "Examples:\n  \
        hearth dev random-model /tmp/llama-1b-f16.gguf --tokenizer-from weights/SmolLM2-135M-Instruct.Q4_1.gguf\n  \
        hearth dev random-model /tmp/tok.gguf --tokenizer-from weights/SmolLM2-135M-Instruct.Q4_1.gguf --tokenizer-only")]
    RandomModel {
        /// File to write (overwritten).
        out: PathBuf,
        /// GGUF file whose tokenizer (tokens, merges, special ids, chat template) is copied.
        #[arg(long, value_name = "FILE")]
        tokenizer_from: PathBuf,
        /// Write only the tokenizer (a small file to carry where the model is written).
        #[arg(long)]
        tokenizer_only: bool,
        /// How the matrices are stored: f16, q8_0, q4_0 or q4_k.
        #[arg(long, default_value = "f16")]
        weights: hearth_infer::WeightType,
        #[arg(long, default_value_t = 16)]
        layers: usize,
        #[arg(long, default_value_t = 2048)]
        hidden: usize,
        #[arg(long, default_value_t = 32)]
        heads: usize,
        #[arg(long, default_value_t = 8)]
        kv_heads: usize,
        #[arg(long, default_value_t = 8192)]
        ff: usize,
        #[arg(long, default_value_t = 8192)]
        context: usize,
        /// Make it an embedding model pooling its hidden states so: mean, cls or last.
        #[arg(long)]
        pooling: Option<hearth_infer::Pooling>,
        /// Seed of the weights.
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
    /// Re-write a GGUF model with its matrices in another storage type: the same weights,
    /// metadata and tokenizer (vectors stay F32; matrices whose rows are not whole blocks of
    /// the type become F16). A same-vocabulary pair for draft-model speculation, say.
    #[command(after_help = "Examples:\n  \
        hearth dev requantize weights/SmolLM2-135M-Instruct.Q4_1.gguf weights/SmolLM2-135M-Instruct.F16.gguf --type f16\n  \
        hearth dev requantize weights/SmolLM2-135M-Instruct.Q4_1.gguf weights/SmolLM2-135M-Instruct.Q4_0.gguf --type q4_0")]
    Requantize {
        /// GGUF file to read.
        input: PathBuf,
        /// File to write (overwritten; written beside and renamed, so it may be INPUT).
        output: PathBuf,
        /// How the matrices are stored: f16, q8_0, q4_0 or q4_k.
        #[arg(long = "type", value_name = "TYPE")]
        to: hearth_infer::WeightType,
    },
}

#[derive(Debug, Args)]
struct Common {
    /// Configuration file [default: ./hearth.toml when it exists].
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Folder for the database, keys and secrets [default: ./data].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct ServeArgs {
    #[command(flatten)]
    common: Common,
    /// Services to run, comma-separated [default: every service in this build].
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    services: Option<Vec<String>>,
    /// Listen address of the auth service [default: 127.0.0.1:8081]; port 0 picks a free port.
    #[arg(long, value_name = "ADDR")]
    auth_addr: Option<String>,
    /// Listen address of the completion service [default: 127.0.0.1:8082].
    #[arg(long, value_name = "ADDR")]
    completion_addr: Option<String>,
    /// Listen address of the markdown service [default: 127.0.0.1:8083].
    #[arg(long, value_name = "ADDR")]
    markdown_addr: Option<String>,
    /// Listen address of the image service [default: 127.0.0.1:8084].
    #[arg(long, value_name = "ADDR")]
    imagine_addr: Option<String>,
    /// Model table [default: ./models.toml].
    #[arg(long, value_name = "FILE")]
    models: Option<PathBuf>,
    /// Environment name reported by health endpoints [default: development].
    #[arg(long)]
    env: Option<String>,
    /// Region name [default: local].
    #[arg(long)]
    region: Option<String>,
}

#[derive(Debug, Subcommand)]
enum IdpCommand {
    /// Print an identity token for USER, accepted by the shared-secret provider at POST /token.
    ///
    /// The token is signed with <data dir>/idp.secret, so mint it against the server's data dir
    /// (run it from the server's folder, or pass the same --data-dir); a token minted elsewhere
    /// is refused with InvalidCredentials.
    #[command(
        after_help = "Examples:\n  hearth idp mint alice\n  hearth idp mint alice --data-dir /var/lib/hearth   # the data dir the server was started with"
    )]
    Mint {
        /// The user id the token speaks for.
        user: String,
        /// Lifetime of the identity token in seconds.
        #[arg(long, value_name = "SECS", default_value_t = 3600)]
        ttl: i64,
        /// Mark the user as a marketing account.
        #[arg(long)]
        marketing: bool,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Debug, Subcommand)]
enum UsersCommand {
    /// List users with their balances.
    #[command(after_help = "Example:\n  hearth users list")]
    List {
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Debug, Subcommand)]
enum BalanceCommand {
    /// Print a user's spendable balance.
    #[command(after_help = "Example:\n  hearth balance show alice")]
    Show {
        user: String,
        #[command(flatten)]
        common: Common,
    },
    /// Add AMOUNT (a decimal string, at most 6 decimal places) to a user's balance.
    ///
    /// A user not seen before is created first. With the server running this goes through its
    /// admin API (the key is read from the data dir), otherwise to the database directly.
    #[command(
        after_help = "Examples:\n  hearth balance credit alice 25 --note \"first top-up\"\n  hearth balance credit alice 5 --debit"
    )]
    Credit {
        user: String,
        /// Decimal amount, e.g. 25 or 0.50; negative only together with --debit.
        #[arg(allow_hyphen_values = true)]
        amount: String,
        /// Reason recorded in the ledger.
        #[arg(long, value_name = "TEXT")]
        note: Option<String>,
        /// Take the amount away instead (never below zero); AMOUNT may then be written negative.
        #[arg(long)]
        debit: bool,
        #[command(flatten)]
        common: Common,
    },
}

/// Why a command failed; printed as `error: ...`.
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Start(#[from] app::StartError),
    #[error(transparent)]
    Store(#[from] hearth_store::Error),
    #[error(transparent)]
    Auth(#[from] hearth_auth::Error),
    #[error("{0}")]
    Api(ApiError),
    #[error("cannot reach the running server's admin API at {url}: {source}")]
    AdminUnreachable { url: String, source: reqwest::Error },
    #[error("{0}")]
    Usage(String),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// Entry point of the `hearth` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(CliError::Runtime(e)),
    };
    let result = runtime.block_on(run(cli));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

fn fail(e: CliError) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::FAILURE
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("hearth=info,tower_http=info"));
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Layers defaults < config file < HEARTH_* env < flags, and resolves.
fn load_config(common: &Common, flags: RawConfig) -> Result<Config, CliError> {
    let mut layers = Layers::new();
    match &common.config {
        Some(path) => layers = layers.file(path)?,
        None if Path::new("hearth.toml").exists() => {
            layers = layers.file(Path::new("hearth.toml"))?
        }
        None => {}
    }
    let (layers, unknown) = layers.env(std::env::vars())?;
    for name in unknown {
        match crate::config::closest_env_name(&name) {
            Some(near) => eprintln!(
                "warning: {name} matches no configuration key and is ignored; the closest is {near}"
            ),
            None => eprintln!("warning: {name} matches no configuration key and is ignored"),
        }
    }
    let mut flags = flags;
    if let Some(dir) = &common.data_dir {
        flags.data_dir = Some(dir.clone());
    }
    Ok(layers.raw(&flags).build()?.resolve()?)
}

async fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Serve(args) => serve(args).await,
        Command::Models(command) => models::run(command).await,
        Command::Idp(IdpCommand::Mint {
            user,
            ttl,
            marketing,
            common,
        }) => {
            let config = load_config(&common, RawConfig::default())?;
            if !matches!(config.auth.identity_provider, IdpChoice::SharedSecret) {
                return Err(CliError::Usage(
                    "idp mint works only with identity_provider = \"shared-secret\"".into(),
                ));
            }
            if ttl < 1 {
                return Err(CliError::Usage("--ttl must be at least 1 second".into()));
            }
            let path = paths::idp_secret(&config.data_dir);
            let secret = match config.store.choice {
                // The file: the server may hold the database open.
                StoreChoice::Embedded => hearth_auth::load_or_create_secret(&path)?,
                StoreChoice::Postgres(_) => {
                    app::shared_secret(&app::open_store(&config).await?, &path).await?
                }
            };
            let idp = hearth_auth::SharedSecretIdp::new(secret.as_bytes());
            println!(
                "{}",
                idp.mint(&user, chrono::Duration::seconds(ttl), marketing)?
            );
            Ok(())
        }
        Command::Users(UsersCommand::List { common }) => {
            let config = load_config(&common, RawConfig::default())?;
            let resp: UsersResponse = admin_call(&config, "users", json!({}), |s| async move {
                admin::list_users(&s).await
            })
            .await?;
            println!(
                "{:<32} {:>20}  {:<9}  CREATED",
                "USER", "BALANCE", "MARKETING"
            );
            for u in resp.users {
                println!(
                    "{:<32} {:>20}  {:<9}  {}",
                    u.user_id,
                    u.balance,
                    if u.is_marketing { "yes" } else { "no" },
                    u.created_at
                );
            }
            Ok(())
        }
        Command::Ledger { user, common } => {
            let store = open_store_directly(&load_config(&common, RawConfig::default())?).await?;
            println!(
                "{:>8}  {:<20}  {:>16}  {:>16}  REASON",
                "SEQ", "AT", "AMOUNT", "BALANCE"
            );
            for e in store.ledger(&user).await? {
                println!(
                    "{:>8}  {:<20}  {:>16}  {:>16}  {}",
                    e.seq,
                    e.at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    hearth_billing::money(e.amount),
                    hearth_billing::money(e.balance_after),
                    e.reason
                );
            }
            Ok(())
        }
        Command::Holds(HoldsCommand::Release { node, common }) => {
            let store = open_store_directly(&load_config(&common, RawConfig::default())?).await?;
            let released = store.release_holds_of_node(&node).await?;
            println!("released {released} hold(s) of node {node}");
            Ok(())
        }
        Command::Migrate { common } => {
            let config = load_config(&common, RawConfig::default())?;
            open_store_directly(&config).await?;
            match config.store.choice {
                StoreChoice::Embedded => println!("embedded store: nothing to migrate"),
                StoreChoice::Postgres(_) => println!("the PostgreSQL schema is up to date"),
            }
            Ok(())
        }
        Command::Dev(DevCommand::TinySdxl { dir, seed }) => {
            hearth_imagine::write_tiny_sdxl(&dir, seed)
                .map_err(|e| CliError::Usage(e.to_string()))?;
            println!(
                "wrote the tiny SDXL test model (seed {seed}) to {}",
                dir.display()
            );
            Ok(())
        }
        Command::Dev(DevCommand::RandomModel {
            out,
            tokenizer_from,
            tokenizer_only: true,
            ..
        }) => {
            let vocab = hearth_infer::write_tokenizer_gguf(&tokenizer_from, &out)
                .map_err(|e| CliError::Usage(e.to_string()))?;
            println!(
                "wrote the tokenizer of {} ({vocab} tokens) to {}",
                tokenizer_from.display(),
                out.display()
            );
            Ok(())
        }
        Command::Dev(DevCommand::RandomModel {
            out,
            tokenizer_from,
            weights,
            layers,
            hidden,
            heads,
            kv_heads,
            ff,
            context,
            pooling,
            seed,
            ..
        }) => {
            let shape = hearth_infer::LlamaShape {
                layers,
                hidden,
                heads,
                kv_heads,
                ff,
                vocab: 0,
                context,
                pooling,
            };
            let vocab =
                hearth_infer::write_random_gguf(&out, shape, weights, &tokenizer_from, seed)
                    .map_err(|e| CliError::Usage(e.to_string()))?;
            let shape = hearth_infer::LlamaShape { vocab, ..shape };
            println!(
                "wrote a random llama of {:.2}B weights ({weights:?}, vocabulary {vocab}, seed {seed}) to {}",
                shape.parameters() as f64 / 1e9,
                out.display()
            );
            Ok(())
        }
        Command::Dev(DevCommand::Requantize { input, output, to }) => {
            let started = std::time::Instant::now();
            let r = hearth_infer::requantize(&input, &output, to)
                .map_err(|e| CliError::Usage(e.to_string()))?;
            let mb = |b: u64| b as f64 / 1e6;
            let fallback = match r.f16_fallback.as_slice() {
                [] => String::new(),
                names => format!(
                    " ({} as f16, rows not whole {to} blocks: {})",
                    names.len(),
                    names.join(", ")
                ),
            };
            println!(
                "wrote {} as {to}: {} tensors, {} converted{fallback}, {} kept; {:.1} MB -> {:.1} MB in {:.1} s",
                output.display(),
                r.tensors,
                r.converted,
                r.kept,
                mb(r.bytes_in),
                mb(r.bytes_out),
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Command::Balance(BalanceCommand::Show { user, common }) => {
            let config = load_config(&common, RawConfig::default())?;
            let u = user.clone();
            let resp: BalanceResponse = admin_call(
                &config,
                "balance",
                json!({ "userId": user }),
                |s| async move { admin::show_balance(&s, &u).await },
            )
            .await?;
            println!("{} {}", resp.user_id, resp.balance);
            Ok(())
        }
        Command::Balance(BalanceCommand::Credit {
            user,
            amount,
            note,
            debit,
            common,
        }) => {
            let config = load_config(&common, RawConfig::default())?;
            admin::parse_amount(&amount).map_err(CliError::Api)?;
            let body = json!({ "userId": user, "amount": amount, "note": note, "debit": debit });
            let resp: CreditResponse = admin_call(&config, "credit", body, |s| async move {
                admin::apply_credit(&s, &user, &amount, note.as_deref(), debit).await
            })
            .await?;
            println!(
                "{}: {} -> {}",
                resp.user_id, resp.balance_before, resp.balance_after
            );
            Ok(())
        }
    }
}

async fn serve(args: ServeArgs) -> Result<(), CliError> {
    init_tracing();
    let flags = RawConfig {
        services: args.services,
        models: args.models,
        env: args.env,
        region: args.region,
        auth: RawAuthConfig {
            addr: args.auth_addr,
            ..Default::default()
        },
        completion: RawCompletionConfig {
            addr: args.completion_addr,
            ..Default::default()
        },
        markdown: RawMarkdownConfig {
            addr: args.markdown_addr,
            ..Default::default()
        },
        imagine: RawImagineConfig {
            addr: args.imagine_addr,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut config = load_config(&args.common, flags)?;
    config.loading.hub = crate::config::HubVars::from_vars(|k| std::env::var(k).ok());
    tracing::info!(data_dir = %app::absolute(&config.data_dir).display(), env = %config.env, region = %config.region, "starting");
    let running = app::start(config).await?;
    let token = running.shutdown_token();
    let grace = running.state.config.server.shutdown_timeout;
    let mut signals = Signals::new();
    signals::reload_on_hangup(running.state.hub.clone(), token.clone());
    tokio::spawn(async move {
        signals.next().await;
        tracing::info!(
            deadline_secs = grace.as_secs(),
            "shutting down; a second Ctrl-C or SIGTERM exits at once"
        );
        token.cancel();
        signals.next().await;
        tracing::warn!("second signal: exiting without waiting for requests in flight");
        std::process::exit(EXIT_ON_SECOND_SIGNAL);
    });
    running.wait().await;
    Ok(())
}

/// Exit status of `hearth serve` when a second signal cuts its shutdown short (128 + SIGINT, as
/// shells report an interrupted command).
pub const EXIT_ON_SECOND_SIGNAL: i32 = 130;
