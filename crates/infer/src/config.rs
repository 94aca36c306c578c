//! Where and how to load a text model: the resolved form of a `models.toml` `[text."id"]` entry.

use std::path::PathBuf;

use hearth_kernels::ops::QuantKind;
use hearth_kernels::KernelPath;

/// Where the weights come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WeightSource {
    /// A `.gguf` file, or a folder holding `config.json` + `*.safetensors` (+ `tokenizer.json`).
    Local { path: PathBuf },
    /// A Hugging Face repository, read cache-first (works offline when the files are cached).
    /// `file` names the `.gguf` to take; `None` means a safetensors checkpoint.
    HfHub {
        repo: String,
        file: Option<String>,
        revision: Option<String>,
    },
}

/// Which device runs the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeviceSpec {
    #[default]
    Cpu,
    /// CUDA device ordinal; needs the `cuda` cargo feature.
    Cuda(usize),
}

impl std::str::FromStr for DeviceSpec {
    type Err = String;
    /// Parses `cpu`, `cuda` (= `cuda:0`) or `cuda:N`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceSpec::Cuda)
                .ok_or_else(|| format!("device {other:?}: expected cpu, cuda or cuda:N")),
        }
    }
}

/// Which forward implementation runs the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BackendChoice {
    /// The fastest available for the device (the hand-written CPU path once it exists).
    #[default]
    Auto,
    /// The forward written on candle ops (works on every device).
    Candle,
    /// The hand-written CPU fast path (`src/fast/`).
    Fast,
}

impl std::str::FromStr for BackendChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "auto" => Ok(BackendChoice::Auto),
            "candle" => Ok(BackendChoice::Candle),
            "fast" => Ok(BackendChoice::Fast),
            other => Err(format!("backend {other:?}: expected auto, candle or fast")),
        }
    }
}

/// Precision of the KV cache and of the attention over it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KvPrecision {
    /// Full f32: K, V, Q and the softmax weights are used as computed. This matches llama.cpp
    /// run with an f32 KV cache (`type_k = type_v = f32`), the llama.cpp configuration whose
    /// greedy choices agree with an exact f64 forward (scripts/parity/README.md). Default.
    #[default]
    F32,
    /// Imitates llama.cpp's default f16 KV cache without flash attention: K and V are stored in
    /// f16 (half the memory per token, which the scheduler's KV budget counts), Q is rounded to
    /// f16 for the Q·K products and the softmax weights to f16 for the sum over V.
    F16,
    /// Imitates llama.cpp's q8_0 KV cache (`-ctk q8_0 -ctv q8_0`, which needs its flash
    /// attention): K and V are stored in blocks of 32 values, one f16 scale and 32 signed bytes
    /// each (34 bytes where f16 takes 64), quantized as llama.cpp quantizes them; Q is quantized
    /// the same way for integer Q·K products, and V is widened as it is summed. Fast CPU backend
    /// only, for heads whose size is a multiple of 32.
    Q8_0,
    /// Imitates llama.cpp's q4_0 KV cache (`-ctk q4_0 -ctv q4_0 -fa`): as [`KvPrecision::Q8_0`],
    /// but each block of 32 values is 16 bytes of 4-bit quants and one f16 scale (18 bytes where
    /// f16 takes 64), quantized as llama.cpp's `quantize_row_q4_0_ref` does; Q is still
    /// quantized to q8_0 for the integer Q·K products, as llama.cpp's `vec_dot_q4_0_q8_0` takes it.
    Q4_0,
}

impl std::str::FromStr for KvPrecision {
    type Err = String;
    /// Parses `f32`, `f16`, `q8_0` or `q4_0`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "f32" => Ok(KvPrecision::F32),
            "f16" => Ok(KvPrecision::F16),
            "q8_0" => Ok(KvPrecision::Q8_0),
            "q4_0" => Ok(KvPrecision::Q4_0),
            other => Err(format!(
                "kv_precision {other:?}: expected f32, f16, q8_0 or q4_0"
            )),
        }
    }
}

impl KvPrecision {
    /// Whether K/V, Q and the attention weights are rounded to f16.
    pub fn rounds_to_f16(self) -> bool {
        self == KvPrecision::F16
    }

    /// Values of one quantized block (one scale each).
    pub const QUANT_BLOCK: usize = 32;

    /// The kind of block a quantized cache keeps (`None` for f32 and f16).
    pub fn quant(self) -> Option<QuantKind> {
        match self {
            KvPrecision::F32 | KvPrecision::F16 => None,
            KvPrecision::Q8_0 => Some(QuantKind::Q8_0),
            KvPrecision::Q4_0 => Some(QuantKind::Q4_0),
        }
    }

    /// The name `kv_precision` takes.
    pub fn name(self) -> &'static str {
        match self {
            KvPrecision::F32 => "f32",
            KvPrecision::F16 => "f16",
            KvPrecision::Q8_0 => "q8_0",
            KvPrecision::Q4_0 => "q4_0",
        }
    }

    /// Bytes a host KV cache stores for `values` values (for a quantized cache, whole blocks:
    /// a block's quants and its f16 scale).
    pub fn bytes(self, values: usize) -> usize {
        match self.quant() {
            Some(kind) => values.div_ceil(Self::QUANT_BLOCK) * (kind.block_bytes() + 2),
            None if self == KvPrecision::F16 => 2 * values,
            None => 4 * values,
        }
    }
}

/// The candle backend's activation dtype (its dense weights and cache follow it). The fast CPU
/// path computes in f32 and 8-bit activations whatever this says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Dtype {
    /// f32 on the CPU, f16 on a GPU.
    #[default]
    Auto,
    F32,
    F16,
    BF16,
}

impl std::str::FromStr for Dtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "auto" => Ok(Dtype::Auto),
            "f32" => Ok(Dtype::F32),
            "f16" => Ok(Dtype::F16),
            "bf16" => Ok(Dtype::BF16),
            other => Err(format!("dtype {other:?}: expected auto, f32, f16 or bf16")),
        }
    }
}

/// What the candle backend does differently on a GPU, each on by default; turned off one by one
/// only to measure what each is worth (`bench_device` and `device_check` read the environment
/// variables of [`GpuTuning::from_vars`]; the server always runs the default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuTuning {
    /// candle's default device: a per-thread stream, cudarc's event tracking, and the driver's
    /// memory pool threshold (`HEARTH_CUDA_EVENTS=track`).
    pub candle_device: bool,
    /// The memory pool hands its free memory back at every synchronisation
    /// (`HEARTH_CUDA_POOL=trim`).
    pub trim_pool: bool,
    /// Decode rows attend on the general path, not the decode attention kernel
    /// (`HEARTH_DECODE_ATTENTION=gather`).
    pub gathered_attention: bool,
    /// candle's ops for the projections and for prompt rows' gathers and softmax, not the
    /// fused kernels (`HEARTH_FUSED=off`).
    pub unfused: bool,
    /// cuBLAS (or candle's quantized product) for one-row matrix products too, not the one-row
    /// kernels (`HEARTH_GEMV=off`).
    pub cublas_rows: bool,
    /// Every decode step launched kernel by kernel, none replayed as a CUDA graph
    /// (`HEARTH_CUDA_GRAPHS=off`).
    pub no_graphs: bool,
    /// The first decode attention kernel (a thread a position, splits merged by a second
    /// kernel), the scalar add-norm kernel and the one-row product's first loop (each load used
    /// at once), not their later versions, to compare (`HEARTH_STEP_KERNELS=first`).
    pub first_kernels: bool,
    /// The fewest positions a split of the decode attention's register kernel takes
    /// (`HEARTH_DECODE_CHUNK=N`, a multiple of 16), to measure the split; 0 = the kernel's
    /// default.
    pub decode_chunk: usize,
    /// The gated MLP's activation, and RoPE with the KV write, as kernels of their own after the
    /// one-row gate/up and Q/K/V products, not in those products' last step
    /// (`HEARTH_EPILOGUES=off`).
    pub separate_epilogues: bool,
}

impl GpuTuning {
    /// The tuning the variables named above ask for, read through `var` (an entry point hands
    /// in its process environment).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let is = |key: &str, value: &str| var(key).as_deref() == Some(value);
        GpuTuning {
            candle_device: is("HEARTH_CUDA_EVENTS", "track"),
            trim_pool: is("HEARTH_CUDA_POOL", "trim"),
            gathered_attention: is("HEARTH_DECODE_ATTENTION", "gather"),
            unfused: is("HEARTH_FUSED", "off"),
            cublas_rows: is("HEARTH_GEMV", "off"),
            no_graphs: is("HEARTH_CUDA_GRAPHS", "off"),
            first_kernels: is("HEARTH_STEP_KERNELS", "first"),
            decode_chunk: var("HEARTH_DECODE_CHUNK")
                .and_then(|v| v.parse::<usize>().ok())
                .filter(|n| n.is_multiple_of(16))
                .unwrap_or(0),
            separate_epilogues: is("HEARTH_EPILOGUES", "off"),
        }
    }
}

/// Where and how to load one text model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextModelConfig {
    pub source: WeightSource,
    /// A `tokenizer.json`; `None` = from the GGUF metadata or the safetensors folder.
    pub tokenizer: Option<PathBuf>,
    /// Overrides the model's own chat template.
    pub chat_template: Option<String>,
    pub device: DeviceSpec,
    /// CPU threads; 0 = one per physical core.
    pub threads: usize,
    pub backend: BackendChoice,
    /// Precision of the attention over the KV cache (default f32).
    pub kv_precision: KvPrecision,
    /// The candle backend's activation dtype.
    pub dtype: Dtype,
    /// The fast backend's kernel path, to compare paths on one machine (entry points read
    /// `HEARTH_KERNEL`); `None`, or a path this CPU lacks, runs the best it has.
    pub kernel: Option<KernelPath>,
    /// On a GPU: the candle backend's fast paths, each of which can be turned off to compare.
    pub gpu: GpuTuning,
}

impl TextModelConfig {
    /// A config for a local file or folder with every other setting at its default.
    pub fn local(path: impl Into<PathBuf>) -> Self {
        TextModelConfig {
            source: WeightSource::Local { path: path.into() },
            tokenizer: None,
            chat_template: None,
            device: DeviceSpec::Cpu,
            threads: 0,
            backend: BackendChoice::Auto,
            kv_precision: KvPrecision::F32,
            dtype: Dtype::Auto,
            kernel: None,
            gpu: GpuTuning::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_specs_parse_cpu_and_cuda_ordinals() {
        assert_eq!("cpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
        assert_eq!("cuda".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
        assert_eq!("cuda:2".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(2));
        assert!("tpu".parse::<DeviceSpec>().is_err());
        assert!("cuda:x".parse::<DeviceSpec>().is_err());
    }

    #[test]
    fn backend_choices_parse() {
        assert_eq!(
            "fast".parse::<BackendChoice>().unwrap(),
            BackendChoice::Fast
        );
        assert!("gpu".parse::<BackendChoice>().is_err());
    }

    #[test]
    fn dtypes_parse_and_default_to_auto() {
        assert_eq!("bf16".parse::<Dtype>().unwrap(), Dtype::BF16);
        assert_eq!(" f32 ".parse::<Dtype>().unwrap(), Dtype::F32);
        assert!("fp8"
            .parse::<Dtype>()
            .unwrap_err()
            .contains("expected auto"));
        assert_eq!(TextModelConfig::local("m.gguf").dtype, Dtype::Auto);
    }

    #[test]
    fn kv_precisions_parse_and_default_to_f32() {
        assert_eq!("f16".parse::<KvPrecision>().unwrap(), KvPrecision::F16);
        assert_eq!(" f32".parse::<KvPrecision>().unwrap(), KvPrecision::F32);
        assert!("bf16".parse::<KvPrecision>().is_err());
        assert_eq!(
            TextModelConfig::local("m.gguf").kv_precision,
            KvPrecision::F32
        );
        assert_eq!(" q8_0".parse::<KvPrecision>().unwrap(), KvPrecision::Q8_0);
        assert_eq!("q4_0".parse::<KvPrecision>().unwrap(), KvPrecision::Q4_0);
        for p in [
            KvPrecision::F32,
            KvPrecision::F16,
            KvPrecision::Q8_0,
            KvPrecision::Q4_0,
        ] {
            assert_eq!(p.name().parse::<KvPrecision>().unwrap(), p);
        }
        assert!("q8".parse::<KvPrecision>().is_err());
        assert!(KvPrecision::F16.rounds_to_f16() && !KvPrecision::F32.rounds_to_f16());
        assert!(!KvPrecision::Q8_0.rounds_to_f16());
        // llama.cpp's sizes: q8_0 is 34 bytes a block of 32, a little over half of f16; q4_0
        // 18 bytes, a little over a quarter.
        let per = |p: KvPrecision| p.bytes(4096);
        assert_eq!(
            (
                per(KvPrecision::F32),
                per(KvPrecision::F16),
                per(KvPrecision::Q8_0),
                per(KvPrecision::Q4_0)
            ),
            (16384, 8192, 4352, 2304)
        );
    }

    /// Every fast path is on unless its variable asks, with its exact value, for it off: a
    /// config, and so the server, never turns one off by accident.
    #[test]
    fn gpu_fast_paths_are_on_unless_a_variable_turns_one_off_by_name() {
        assert_eq!(TextModelConfig::local("m.gguf").gpu, GpuTuning::default());
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(GpuTuning::from_vars(vars(&[])), GpuTuning::default());
        let all_off = GpuTuning::from_vars(vars(&[
            ("HEARTH_CUDA_EVENTS", "track"),
            ("HEARTH_CUDA_POOL", "trim"),
            ("HEARTH_DECODE_ATTENTION", "gather"),
            ("HEARTH_FUSED", "off"),
            ("HEARTH_GEMV", "off"),
            ("HEARTH_CUDA_GRAPHS", "off"),
            ("HEARTH_STEP_KERNELS", "first"),
            ("HEARTH_DECODE_CHUNK", "256"),
            ("HEARTH_EPILOGUES", "off"),
        ]));
        assert!(
            all_off.candle_device
                && all_off.trim_pool
                && all_off.gathered_attention
                && all_off.unfused
                && all_off.cublas_rows
                && all_off.no_graphs
                && all_off.first_kernels
                && all_off.decode_chunk == 256
                && all_off.separate_epilogues
        );
        let other_values = GpuTuning::from_vars(vars(&[
            ("HEARTH_CUDA_EVENTS", "1"),
            ("HEARTH_FUSED", "no"),
            ("HEARTH_GEMV", "0"),
            ("HEARTH_CUDA_GRAPHS", "no"),
            ("HEARTH_STEP_KERNELS", "tiled"),
            ("HEARTH_DECODE_CHUNK", "100"),
            ("HEARTH_EPILOGUES", "separate"),
        ]));
        assert_eq!(other_values, GpuTuning::default());
    }
}
