//! Integration tests: each starts the real `hearth` server on ephemeral ports and talks HTTP to it.
//! One binary (`cargo test --test integration`); every file below is a module of it.

mod common;

mod anthropic;
mod architecture;
mod auth;
mod auth_admin;
mod auth_oidc;
mod browser_auth;
mod chaos;
mod completion;
mod completion_browser;
mod completion_refusals;
mod connections;
mod deploy;
mod embeddings;
mod embeddings_runtime;
mod field_rules;
mod holds;
mod imagine;
mod imagine_browser;
mod imagine_edits;
mod imagine_jobs;
mod imagine_lora;
mod kv_cache;
mod markdown;
mod markdown_browser;
mod markdown_chunks;
mod markdown_hostile;
mod metrics;
mod model_table;
mod models_pull;
mod models_runtime;
mod multinode;
mod ollama;
mod openai;
mod openapi;
mod pages_browser;
mod prefix_reuse;
mod quickstart;
mod random_model;
mod rerank;
mod responses;
mod speculative;
