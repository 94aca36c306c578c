//! The GPU device every Hearth model runs on, text and image alike.
//!
//! candle's default CUDA device runs each thread on a per-thread stream and has cudarc record an
//! event for every buffer a kernel touches and make two for every allocation, which a decode
//! step pays at each of its hundreds of launches; and the device's memory pool, at its default
//! release threshold of 0, hands its free memory back to the driver at every synchronisation,
//! so the next step or image maps all of it again. [`cuda_device`] makes a device with one
//! stream of its own (every thread that loads or runs a model uses it), no event tracking, and
//! the pool kept, as PyTorch's caching allocator keeps its memory. [`Tuning`] can ask for
//! candle's default device, or a trimmed pool, to measure what each brings.

use candle_core::Device;

pub mod kernels;

/// Which of the device's changes are off (all are on by default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tuning {
    /// candle's default device: per-thread streams, event tracking, a trimmed pool.
    pub candle_device: bool,
    /// The pool trimmed at every synchronisation.
    pub trim_pool: bool,
}

/// GPU `ordinal` as [`Tuning`] says (see the crate's documentation).
#[cfg(feature = "cuda")]
pub fn cuda_device(ordinal: usize, tuning: Tuning) -> candle_core::Result<Device> {
    if tuning.candle_device {
        return Device::new_cuda(ordinal);
    }
    let dev = candle_core::CudaDevice::new_with_stream(ordinal)?;
    // SAFETY: cudarc's event tracking orders a buffer's uses across streams. Every tensor of this
    // device is made after this call and used only on the device's one stream (`new_with_stream`:
    // the same stream from every thread), so stream order already orders every use, and a free
    // (cuMemFreeAsync on that stream) comes after every launch enqueued before it.
    #[allow(unsafe_code)]
    unsafe {
        dev.disable_event_tracking()
    };
    if !tuning.trim_pool {
        keep_pool(&dev);
    }
    Ok(Device::Cuda(dev))
}

/// Without the `cuda` feature there is no GPU.
#[cfg(not(feature = "cuda"))]
pub fn cuda_device(ordinal: usize, _tuning: Tuning) -> candle_core::Result<Device> {
    candle_core::bail!("cuda:{ordinal}: this build has no CUDA (the `cuda` feature)")
}

/// GPU `ordinal`'s memory as the driver reports it (the budget's default for that GPU); `None`
/// when there is no such GPU or no driver.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // one driver query
pub fn total_memory(ordinal: usize) -> Option<u64> {
    use candle_core::cuda_backend::cudarc::driver::result;
    result::init().ok()?;
    let dev = result::device::get(i32::try_from(ordinal).ok()?).ok()?;
    // SAFETY: `dev` is a handle the driver gave for an existing device, after `init`.
    let bytes = unsafe { result::device::total_mem(dev) }.ok()?;
    Some(bytes as u64)
}

/// Without the `cuda` feature there is no GPU.
#[cfg(not(feature = "cuda"))]
pub fn total_memory(_ordinal: usize) -> Option<u64> {
    None
}

/// Raises the release threshold of the device's default memory pool (where candle's
/// stream-ordered allocations come from) to its maximum. The pool is the device's, so every
/// model on the same GPU keeps its memory. A failure is logged and changes nothing else.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // two driver calls
fn keep_pool(dev: &candle_core::CudaDevice) {
    use candle_core::cuda_backend::cudarc::driver::sys;
    let cu_device = dev.cuda_stream().context().cu_device();
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold = u64::MAX;
    // SAFETY: `pool` is written by the first call before the second reads it; the attribute
    // takes a u64, which `threshold` is, alive across the call.
    let result = unsafe {
        match sys::cuDeviceGetDefaultMemPool(&mut pool, cu_device) {
            sys::CUresult::CUDA_SUCCESS => sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            ),
            err => err,
        }
    };
    if result != sys::CUresult::CUDA_SUCCESS {
        tracing::warn!(?result, "cannot keep the GPU memory pool from trimming");
    }
}
