//! 2D convolutions on cuDNN, as a custom op of Hearth's own rather than candle's `cudnn` path.
//!
//! candle's path builds its descriptors, asks cuDNN's heuristic for an algorithm and allocates
//! (and zeroes) a fresh workspace on every call, and never allows tensor-op math. Here, per
//! input shape, the descriptors are built once with tensor-op math allowed, the algorithm is
//! *measured* once (`cudnnFindConvolutionForwardAlgorithm`, which times the candidates on this
//! GPU) and kept with its math type, and one workspace per device grows to the largest any
//! plan needs. Accumulation is in f32 for f16/bf16 data. A custom op rather than a `[patch]` of
//! candle-core: the project does not carry a copy of candle.
//!
//! cuDNN handles and descriptors are not `Send`: they live in the thread that uses them (one
//! image worker thread a model). The `cudnn` build links libcudnn.so.9, so it is there wherever
//! the binary starts.

use std::cell::RefCell;
use std::collections::HashMap;

use candle_core::cuda_backend::cudarc::cudnn::{result, sys};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use candle_core::cuda_backend::{CudaDevice, CudaStorageSlice as S, DeviceId};
use candle_core::{CpuStorage, CudaStorage, CustomOp2, DType, Layout, Shape, Tensor};

/// `conv2d(x, w) + add`: `x` `(n, c_in, h, w)`, `w` `(c_out, c_in, kh, kw)`, `add` `(n or 1,
/// c_out)` added to every position of each sample's channel (the bias, and in a resnet the time
/// embedding with it) by cuDNN in the same call, where a broadcast add would read and write the
/// whole output again.
pub fn conv2d(
    x: &Tensor,
    w: &Tensor,
    add: Option<&Tensor>,
    stride: usize,
    padding: usize,
) -> candle_core::Result<Tensor> {
    let add = add
        .map(|a| a.to_dtype(x.dtype())?.contiguous())
        .transpose()?;
    let conv = Conv {
        stride,
        padding,
        add: add.as_ref(),
    };
    x.contiguous()?.apply_op2_no_bwd(&w.contiguous()?, &conv)
}

struct Conv<'a> {
    stride: usize,
    padding: usize,
    /// `(n or 1, c_out)` in the input's dtype, contiguous; read by address during the launch.
    add: Option<&'a Tensor>,
}

/// cuDNN's name for the data of a plan (`half`: f16, else bf16).
fn data_type(half: bool) -> sys::cudnnDataType_t {
    if half {
        sys::cudnnDataType_t::CUDNN_DATA_HALF
    } else {
        sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16
    }
}

/// A plan's identity: dtype, input and filter dimensions, stride, padding.
type Key = (bool, [i32; 4], [i32; 4], i32, i32);

/// One input shape's descriptors and measured algorithm.
struct Plan {
    x: sys::cudnnTensorDescriptor_t,
    w: sys::cudnnFilterDescriptor_t,
    y: sys::cudnnTensorDescriptor_t,
    conv: sys::cudnnConvolutionDescriptor_t,
    algo: sys::cudnnConvolutionFwdAlgo_t,
    workspace: usize,
    out: [i32; 4],
}

struct State {
    handle: sys::cudnnHandle_t,
    plans: HashMap<Key, Plan>,
    workspace: Option<CudaSlice<u8>>,
}

thread_local! {
    static STATES: RefCell<HashMap<DeviceId, State>> = RefCell::new(HashMap::new());
}

fn err(e: impl std::fmt::Debug) -> candle_core::Error {
    candle_core::Error::Msg(format!("cuDNN: {e:?}"))
}

#[allow(unsafe_code)] // cuDNN's C API
fn plan(state: &mut State, key: Key) -> candle_core::Result<&Plan> {
    if !state.plans.contains_key(&key) {
        let (half, xd, wd, stride, pad) = key;
        let dt = data_type(half);
        let nchw = sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
        let x = result::create_tensor_descriptor().map_err(err)?;
        let w = result::create_filter_descriptor().map_err(err)?;
        let y = result::create_tensor_descriptor().map_err(err)?;
        let conv = result::create_convolution_descriptor().map_err(err)?;
        let out = [
            xd[0],
            wd[0],
            (xd[2] + 2 * pad - wd[2]) / stride + 1,
            (xd[3] + 2 * pad - wd[3]) / stride + 1,
        ];
        let mut found = [unsafe { std::mem::zeroed::<sys::cudnnConvolutionFwdAlgoPerf_t>() }; 8];
        let mut returned = 0;
        // SAFETY: every descriptor was just created; `found` holds the 8 results asked for.
        unsafe {
            result::set_tensor4d_descriptor(x, nchw, dt, xd).map_err(err)?;
            result::set_filter4d_descriptor(w, dt, nchw, wd).map_err(err)?;
            result::set_tensor4d_descriptor(y, nchw, dt, out).map_err(err)?;
            result::set_convolution2d_descriptor(
                conv,
                pad,
                pad,
                stride,
                stride,
                1,
                1,
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
            )
            .map_err(err)?;
            result::set_convolution_math_type(
                conv,
                sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
            )
            .map_err(err)?;
            sys::cudnnFindConvolutionForwardAlgorithm(
                state.handle,
                x,
                w,
                conv,
                y,
                found.len() as i32,
                &mut returned,
                found.as_mut_ptr(),
            )
            .result()
            .map_err(err)?;
        }
        let best = found[..returned.max(0) as usize]
            .iter()
            .find(|p| p.status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS)
            .ok_or_else(|| err(format!("no algorithm for {xd:?} * {wd:?}")))?;
        // SAFETY: `conv` is live; the math type is the one the measurement used.
        unsafe { result::set_convolution_math_type(conv, best.mathType) }.map_err(err)?;
        tracing::debug!(?xd, ?wd, algo = ?best.algo, ms = best.time, "cuDNN plan");
        state.plans.insert(
            key,
            Plan {
                x,
                w,
                y,
                conv,
                algo: best.algo,
                workspace: best.memory,
                out,
            },
        );
    }
    Ok(&state.plans[&key])
}

fn with_state<R>(
    dev: &CudaDevice,
    f: impl FnOnce(&mut State) -> candle_core::Result<R>,
) -> candle_core::Result<R> {
    STATES.with(|states| {
        let mut states = states.borrow_mut();
        let state = match states.entry(dev.id()) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let stream = dev.cuda_stream();
                stream.context().bind_to_thread().map_err(err)?;
                let handle = result::create_handle().map_err(err)?;
                // SAFETY: the handle was just created and the stream lives as long as the device.
                #[allow(unsafe_code)]
                unsafe { result::set_stream(handle, stream.cu_stream() as sys::cudaStream_t) }
                    .map_err(err)?;
                v.insert(State {
                    handle,
                    plans: HashMap::new(),
                    workspace: None,
                })
            }
        };
        f(state)
    })
}

fn dims4(l: &Layout, what: &str) -> candle_core::Result<[i32; 4]> {
    let (a, b, c, d) = l.shape().dims4()?;
    let all = [a, b, c, d];
    if all.iter().any(|&v| v == 0 || v > i32::MAX as usize) {
        candle_core::bail!("conv2d: the {what} has dimensions {all:?}")
    }
    Ok(all.map(|v| v as i32))
}

/// `y += a` for `a` `(rows, c, 1, 1)` at device address `ap`, broadcast over `y`'s positions
/// (and samples, when `rows` is 1).
///
/// # Safety
/// `ap` holds `rows * c` values of `dt`; `y_desc` describes the output at `yp`, on the handle's
/// stream.
#[allow(unsafe_code)]
unsafe fn add_channels(
    handle: sys::cudnnHandle_t,
    dt: sys::cudnnDataType_t,
    rows: i32,
    c: i32,
    ap: u64,
    y_desc: sys::cudnnTensorDescriptor_t,
    yp: u64,
) -> candle_core::Result<()> {
    let a = result::create_tensor_descriptor().map_err(err)?;
    let one = 1f32;
    let done = result::set_tensor4d_descriptor(
        a,
        sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
        dt,
        [rows, c, 1, 1],
    )
    .and_then(|()| {
        sys::cudnnAddTensor(
            handle,
            &one as *const f32 as *const _,
            a,
            ap as *const _,
            &one as *const f32 as *const _,
            y_desc,
            yp as *mut _,
        )
        .result()
    });
    result::destroy_tensor_descriptor(a).map_err(err)?;
    done.map_err(err)
}

impl CustomOp2 for Conv<'_> {
    fn name(&self) -> &'static str {
        "hearth-cudnn-conv2d"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        hearth_gpu::kernels::gpu_only(self.name())
    }

    /// The convolution, then `add` when given.
    #[allow(unsafe_code)] // cuDNN's C API
    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        w: &CudaStorage,
        wl: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let (xd, wd) = (dims4(xl, "input")?, dims4(wl, "filter")?);
        if xd[1] != wd[1] {
            candle_core::bail!(
                "conv2d: input channels {} against filter's {}",
                xd[1],
                wd[1]
            )
        }
        let (Some((x0, x1)), Some((w0, w1))) = (xl.contiguous_offsets(), wl.contiguous_offsets())
        else {
            candle_core::bail!("conv2d needs contiguous tensors")
        };
        let half = matches!(x.slice, S::F16(_));
        let key: Key = (half, xd, wd, self.stride as i32, self.padding as i32);
        let dev = x.device.clone();
        let stream = dev.cuda_stream();
        with_state(&dev, |state| {
            let (out, need) = {
                let p = plan(state, key)?;
                (p.out, p.workspace)
            };
            if state.workspace.as_ref().map_or(0, |w| w.len()) < need {
                state.workspace = None;
                // SAFETY: a workspace needs no initial contents.
                state.workspace = Some(unsafe { dev.alloc::<u8>(need) }?);
            }
            let n_out: usize = out.iter().map(|&v| v as usize).product();
            let (alpha, beta) = (1f32, 0f32);
            // The values to add, `(rows, c_out)` with `rows` 1 or the batch: their address.
            let add = match self.add {
                Some(a) => {
                    let dtype = if half { DType::F16 } else { DType::BF16 };
                    let (ap, len) = hearth_gpu::kernels::device_span(a, dtype, "conv2d's add")?;
                    let c = out[1] as usize;
                    let rows = len / c.max(1);
                    if rows * c != len || (rows != 1 && rows != out[0] as usize) {
                        candle_core::bail!("conv2d: an add of {len} values for output {out:?}")
                    }
                    Some((rows as i32, ap))
                }
                None => None,
            };
            macro_rules! run {
                ($x:expr, $w:expr, $ty:ty) => {{
                    // SAFETY: every value of `y` is written by the convolution.
                    let mut y = unsafe { dev.alloc::<$ty>(n_out) }?;
                    {
                        let (xv, wv) = ($x.slice(x0..x1), $w.slice(w0..w1));
                        let (xp, _gx) = xv.device_ptr(&stream);
                        let (wp, _gw) = wv.device_ptr(&stream);
                        let (yp, _gy) = y.device_ptr_mut(&stream);
                        let ws = state.workspace.as_mut();
                        let ws_len = ws.as_ref().map_or(0, |w| w.len());
                        let (wsp, _gws) = match ws {
                            Some(w) => {
                                let (p, g) = w.device_ptr_mut(&stream);
                                (p, Some(g))
                            }
                            None => (0, None),
                        };
                        let p = &state.plans[&key];
                        // SAFETY: the descriptors describe these contiguous buffers (checked
                        // above), the workspace is at least the plan's size, all on `stream`.
                        unsafe {
                            result::convolution_forward(
                                state.handle,
                                &alpha as *const f32 as *const _,
                                p.x,
                                xp as *const _,
                                p.w,
                                wp as *const _,
                                p.conv,
                                p.algo,
                                wsp as *mut _,
                                ws_len,
                                &beta as *const f32 as *const _,
                                p.y,
                                yp as *mut _,
                            )
                        }
                        .map_err(err)?;
                        if let Some((rows, ap)) = add {
                            // SAFETY: `ap` holds `rows x c_out` values (checked above), alive
                            // while `self.add` is borrowed, broadcast over the output.
                            unsafe {
                                add_channels(
                                    state.handle,
                                    data_type(half),
                                    rows,
                                    out[1],
                                    ap,
                                    p.y,
                                    yp,
                                )
                            }?;
                        }
                    }
                    CudaStorage::wrap_cuda_slice(y, dev.clone())
                }};
            }
            let y = match (&x.slice, &w.slice) {
                (S::F16(x), S::F16(w)) => run!(x, w, half::f16),
                (S::BF16(x), S::BF16(w)) => run!(x, w, half::bf16),
                _ => candle_core::bail!("the cuDNN convolution takes f16 or bf16, both alike"),
            };
            Ok((y, Shape::from(out.map(|v| v as usize).to_vec())))
        })
    }
}
