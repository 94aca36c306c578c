//! Image generation: the SDXL pipeline on candle (text encoders, UNet, VAE, Euler scheduler) and the tiny test model.
