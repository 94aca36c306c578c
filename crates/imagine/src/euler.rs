//! The plain (deterministic) Euler discrete scheduler with trailing timestep spacing, as
//! SDXL-Lightning requires.
//!
//! With `N` inference steps over `T` training steps, trailing spacing takes the timesteps
//! `round(T - k*T/N) - 1` for `k = 0..N` (999, 749, 499, 249 for `N = 4`), so the first step
//! always starts from pure noise. Each timestep `t` has the noise level
//! `sigma(t) = sqrt((1 - abar_t) / abar_t)` from the cumulative product `abar` of the
//! scaled-linear beta schedule, and a final sigma of 0 is appended. Sampling starts from
//! noise scaled by `sigma_0`, feeds the model `x / sqrt(sigma^2 + 1)`, and moves along the
//! ODE with one Euler step `x += eps * (sigma_next - sigma)` (epsilon prediction).

use candle_core::Tensor;

use crate::config::SchedulerConfig;
use crate::error::{Error, Result};

/// What the model predicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prediction {
    Epsilon,
    VPrediction,
}

/// A ready-to-run schedule for a given number of steps.
#[derive(Debug, Clone)]
pub struct EulerDiscrete {
    timesteps: Vec<f64>,
    /// `timesteps.len() + 1` entries, the last one 0.
    sigmas: Vec<f64>,
    prediction: Prediction,
}

impl EulerDiscrete {
    /// Builds the schedule for `steps` inference steps (1 ..= num_train_timesteps).
    pub fn new(config: &SchedulerConfig, steps: usize) -> Result<Self> {
        let train = config.num_train_timesteps;
        if steps == 0 || steps > train {
            return Err(Error::InvalidParams {
                field: "steps",
                message: format!("must be between 1 and {train}"),
            });
        }
        let prediction = match config.prediction_type.as_str() {
            "epsilon" => Prediction::Epsilon,
            "v_prediction" => Prediction::VPrediction,
            other => {
                return Err(Error::config(
                    "scheduler_config.json",
                    format!("prediction_type {other} is not supported"),
                ))
            }
        };
        let alphas_cumprod = alphas_cumprod(config)?;
        // Trailing spacing: arange(T, 0, -T/N), rounded, minus one.
        let ratio = train as f64 / steps as f64;
        let timesteps: Vec<f64> = (0..steps)
            .map(|k| (train as f64 - k as f64 * ratio).round() - 1.0)
            .collect();
        let mut sigmas: Vec<f64> = timesteps
            .iter()
            .map(|&t| {
                // Integer timesteps index the table exactly (diffusers interpolates linearly).
                let a = alphas_cumprod[t as usize];
                ((1.0 - a) / a).sqrt()
            })
            .collect();
        sigmas.push(0.0);
        Ok(EulerDiscrete {
            timesteps,
            sigmas,
            prediction,
        })
    }

    /// The model timesteps, highest first.
    pub fn timesteps(&self) -> &[f64] {
        &self.timesteps
    }

    /// The noise levels, one per timestep plus the final 0.
    pub fn sigmas(&self) -> &[f64] {
        &self.sigmas
    }

    /// Scale of the initial noise: the largest sigma (trailing spacing).
    pub fn init_noise_sigma(&self) -> f64 {
        self.sigmas.iter().copied().fold(0.0, f64::max)
    }

    /// The model's input at step `i`: `x / sqrt(sigma_i^2 + 1)`.
    pub fn scale_model_input(&self, sample: &Tensor, i: usize) -> Result<Tensor> {
        let sigma = self.sigmas[i];
        Ok((sample / (sigma * sigma + 1.0).sqrt())?)
    }

    /// One Euler step from step `i` to `i + 1` given the model output at step `i`.
    pub fn step(&self, model_output: &Tensor, i: usize, sample: &Tensor) -> Result<Tensor> {
        let sigma = self.sigmas[i];
        let sigma_next = self.sigmas[i + 1];
        let pred_original = match self.prediction {
            Prediction::Epsilon => (sample - (model_output * sigma)?)?,
            Prediction::VPrediction => {
                let c_out = -sigma / (sigma * sigma + 1.0).sqrt();
                let c_skip = 1.0 / (sigma * sigma + 1.0);
                ((model_output * c_out)? + (sample * c_skip)?)?
            }
        };
        let derivative = ((sample - pred_original)? / sigma)?;
        Ok((sample + (derivative * (sigma_next - sigma))?)?)
    }
}

/// Cumulative products of `1 - beta` over the training schedule.
///
/// Computed in f32 like diffusers (torch float32 linspace and cumprod) so that the sigmas agree
/// to the last bit or two with the reference implementation.
fn alphas_cumprod(config: &SchedulerConfig) -> Result<Vec<f64>> {
    let n = config.num_train_timesteps;
    let betas: Vec<f32> = match config.beta_schedule.as_str() {
        "scaled_linear" => linspace(config.beta_start.sqrt(), config.beta_end.sqrt(), n)
            .into_iter()
            .map(|b| b * b)
            .collect(),
        "linear" => linspace(config.beta_start, config.beta_end, n),
        other => {
            return Err(Error::config(
                "scheduler_config.json",
                format!("beta_schedule {other} is not supported"),
            ))
        }
    };
    let mut acc = 1.0f32;
    Ok(betas
        .into_iter()
        .map(|b| {
            acc *= 1.0 - b;
            acc as f64
        })
        .collect())
}

fn linspace(start: f64, end: f64, n: usize) -> Vec<f32> {
    if n == 1 {
        return vec![start as f32];
    }
    let step = (end - start) / (n - 1) as f64;
    (0..n).map(|i| (start + step * i as f64) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn four_steps_use_trailing_timesteps_like_lightning() {
        let s = EulerDiscrete::new(&SchedulerConfig::default(), 4).unwrap();
        assert_eq!(s.timesteps(), &[999.0, 749.0, 499.0, 249.0]);
        assert_eq!(s.sigmas().len(), 5);
        assert_eq!(*s.sigmas().last().unwrap(), 0.0);
        // sigma(999) of the SDXL schedule is about 14.61; sigmas decrease.
        assert!(
            (s.init_noise_sigma() - 14.6146).abs() < 1e-3,
            "{}",
            s.sigmas()[0]
        );
        assert!(s.sigmas().windows(2).all(|w| w[0] > w[1]));
    }

    #[test]
    fn one_and_eight_steps_start_from_the_last_training_timestep() {
        for n in [1, 2, 8] {
            let s = EulerDiscrete::new(&SchedulerConfig::default(), n).unwrap();
            assert_eq!(s.timesteps()[0], 999.0);
            assert_eq!(s.timesteps().len(), n);
        }
        let s = EulerDiscrete::new(&SchedulerConfig::default(), 8).unwrap();
        assert_eq!(s.timesteps()[7], 124.0);
    }

    #[test]
    fn zero_steps_is_an_error_naming_steps() {
        let err = EulerDiscrete::new(&SchedulerConfig::default(), 0).unwrap_err();
        assert!(matches!(err, Error::InvalidParams { field: "steps", .. }));
    }

    #[test]
    fn a_perfect_noise_prediction_recovers_the_clean_sample_in_one_step() {
        // x_T = x_0 + sigma * eps; predicting eps exactly lands on x_0 at sigma 0.
        let s = EulerDiscrete::new(&SchedulerConfig::default(), 1).unwrap();
        let dev = Device::Cpu;
        let x0 = Tensor::new(&[0.5f32, -0.25, 1.0], &dev).unwrap();
        let eps = Tensor::new(&[1.0f32, -2.0, 0.3], &dev).unwrap();
        let xt = (&x0 + (&eps * s.sigmas()[0]).unwrap()).unwrap();
        let out = s.step(&eps, 0, &xt).unwrap().to_vec1::<f32>().unwrap();
        for (a, b) in out.iter().zip([0.5f32, -0.25, 1.0]) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }
}
