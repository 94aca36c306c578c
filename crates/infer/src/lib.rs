//! Text models: weight loading (GGUF, safetensors, hf-hub), tokenizer, chat template, sampling, batched forward.
