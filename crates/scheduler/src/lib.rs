//! Continuous batching: one engine loop per model on its own thread, per-stream bounded token channels.
