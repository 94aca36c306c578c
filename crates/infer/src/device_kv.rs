//! The candle backend's KV cache: one pool per model of fixed-size blocks on the model's device
//! (a GPU's memory under CUDA), each sequence holding a list of blocks. A step writes its new
//! K/V rows into the pool in place (one scatter per layer for the whole batch) and attention
//! gathers the blocks of all the step's sequences at once (one gather per layer), so neither
//! grows with the number of sequences in a step, and nothing goes through the host.
//!
//! A sequence reserves the blocks of its whole capacity when it is made, so a step never runs
//! out of cache halfway; the blocks go back to the pool's free list when the sequence is
//! dropped. The pool grows (a larger allocation, the old blocks copied in) when a reservation
//! finds too few free blocks, and never shrinks: device memory, once taken, is kept for the next
//! sequences, as vLLM keeps its block pool.

use std::sync::{Arc, Mutex, MutexGuard};

use candle_core::{DType, Device, Tensor};

use crate::Error;

/// Positions per block.
pub(crate) const BLOCK: usize = 16;

/// K and V of every layer, `[blocks * BLOCK, kv_dim]` each, and which blocks are free.
pub(crate) struct Pool {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    blocks: usize,
    free: Vec<u32>,
    layers: usize,
    kv_dim: usize,
    dtype: DType,
    device: Device,
}

/// A pool shared by a model and the sequences it made.
#[derive(Clone)]
pub(crate) struct SharedPool(Arc<Mutex<Pool>>);

impl SharedPool {
    pub(crate) fn new(layers: usize, kv_dim: usize, dtype: DType, device: &Device) -> Self {
        SharedPool(Arc::new(Mutex::new(Pool {
            k: Vec::new(),
            v: Vec::new(),
            blocks: 0,
            free: Vec::new(),
            layers,
            kv_dim,
            dtype,
            device: device.clone(),
        })))
    }

    /// The pool, locked. A panic elsewhere while it was held leaves nothing half-written that
    /// matters here (a free list and tensors), so a poisoned lock is taken over.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Pool> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn same(&self, other: &SharedPool) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Blocks for `positions` positions, growing the pool when too few are free.
    pub(crate) fn reserve(&self, positions: usize) -> Result<DeviceKv, Error> {
        let need = positions.div_ceil(BLOCK);
        let mut pool = self.lock();
        if pool.free.len() < need {
            let short = need - pool.free.len();
            // Grow by half again at least, so that many small reservations copy the pool a
            // logarithmic number of times.
            let more = short.max(pool.blocks / 2).max(4);
            pool.grow(more)?;
        }
        let at = pool.free.len() - need;
        let blocks = pool.free.split_off(at);
        Ok(DeviceKv {
            pool: self.clone(),
            blocks,
            dtype: pool.dtype,
        })
    }
}

impl Pool {
    fn grow(&mut self, more: usize) -> Result<(), Error> {
        let rows = (self.blocks + more) * BLOCK;
        let fresh = |old: &[Tensor]| -> Result<Vec<Tensor>, Error> {
            (0..self.layers)
                .map(|il| {
                    let t = Tensor::zeros((rows, self.kv_dim), self.dtype, &self.device)?;
                    if let Some(o) = old.get(il) {
                        t.slice_set(o, 0, 0)?;
                    }
                    Ok(t)
                })
                .collect()
        };
        let (k, v) = (fresh(&self.k)?, fresh(&self.v)?);
        self.k = k;
        self.v = v;
        // Newest blocks last: reservations take from the end, so the lowest blocks go first.
        self.free.splice(
            0..0,
            (self.blocks..self.blocks + more).rev().map(|b| b as u32),
        );
        self.blocks += more;
        Ok(())
    }

    pub(crate) fn dtype(&self) -> DType {
        self.dtype
    }

    #[cfg(feature = "cuda")]
    /// Blocks in the pool (it only grows, each time into a new allocation).
    pub(crate) fn blocks(&self) -> usize {
        self.blocks
    }

    /// Writes `k` and `v` (`[n, kv_dim]`, the pool's dtype) of layer `il` at pool rows `at`
    /// (`[n]` u32).
    pub(crate) fn write(
        &self,
        il: usize,
        at: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(), Error> {
        for (pool, src) in [(&self.k[il], k), (&self.v[il], v)] {
            if let Err(e) = crate::kv_write::write_rows(pool, at, src) {
                if self.device.is_cpu() {
                    return Err(e);
                }
                // A GPU machine without NVRTC: candle's scatter, slower for long prompts.
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| {
                    tracing::warn!(error = %e, "the KV write kernel is unavailable; using candle's scatter")
                });
                let idx = at.unsqueeze(1)?.broadcast_as(src.shape())?.contiguous()?;
                pool.scatter_set(&idx, src, 0)?;
            }
        }
        Ok(())
    }

    /// The whole K and V pools of layer `il`, `[blocks * BLOCK, kv_dim]` each.
    pub(crate) fn layer(&self, il: usize) -> (&Tensor, &Tensor) {
        (&self.k[il], &self.v[il])
    }

    /// K and V of layer `il` for the blocks `blocks` (u32), as `[blocks.len() * BLOCK, kv_dim]`.
    pub(crate) fn gather(&self, il: usize, blocks: &Tensor) -> Result<(Tensor, Tensor), Error> {
        let by_block = |t: &Tensor| -> Result<Tensor, Error> {
            let n = blocks.dim(0)?;
            Ok(t.reshape((self.blocks, BLOCK * self.kv_dim))?
                .index_select(blocks, 0)?
                .reshape((n * BLOCK, self.kv_dim))?)
        };
        Ok((by_block(&self.k[il])?, by_block(&self.v[il])?))
    }

    /// Copies positions `0..len` of `from` into `to`, every layer.
    fn copy(&self, from: &[u32], to: &[u32], len: usize) -> Result<(), Error> {
        let (src, dst): (Vec<u32>, Vec<u32>) = (0..len).map(|p| (row(from, p), row(to, p))).unzip();
        let src = Tensor::from_vec(src, len, &self.device)?;
        let dst = Tensor::from_vec(dst, len, &self.device)?;
        for il in 0..self.layers {
            let k = self.k[il].index_select(&src, 0)?;
            let v = self.v[il].index_select(&src, 0)?;
            self.write(il, &dst, &k, &v)?;
        }
        Ok(())
    }
}

/// The pool row of position `pos` of a sequence holding `blocks`.
pub(crate) fn row(blocks: &[u32], pos: usize) -> u32 {
    blocks[pos / BLOCK] * BLOCK as u32 + (pos % BLOCK) as u32
}

/// One sequence's blocks; they go back to the pool when it is dropped.
pub(crate) struct DeviceKv {
    pool: SharedPool,
    blocks: Vec<u32>,
    /// The pool's (fixed for its life), kept here so that asking takes no lock.
    dtype: DType,
}

impl DeviceKv {
    pub(crate) fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    pub(crate) fn pool(&self) -> &SharedPool {
        &self.pool
    }

    pub(crate) fn dtype(&self) -> DType {
        self.dtype
    }

    /// Copies the first `len` positions of `from` (a sequence of the same pool) into this one.
    pub(crate) fn copy_from(&mut self, from: &DeviceKv, len: usize) -> Result<(), Error> {
        if len == 0 {
            return Ok(());
        }
        self.pool.lock().copy(&from.blocks, &self.blocks, len)
    }
}

impl Drop for DeviceKv {
    fn drop(&mut self) {
        let blocks = std::mem::take(&mut self.blocks);
        self.pool.lock().free.extend(blocks);
    }
}

impl std::fmt::Debug for DeviceKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceKv")
            .field("blocks", &self.blocks.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    #[test]
    fn blocks_are_reserved_freed_and_reused_and_the_pool_grows_keeping_what_it_holds() {
        let pool = SharedPool::new(2, 3, DType::F32, &Device::Cpu);
        let a = pool.reserve(20).unwrap(); // 2 blocks
        assert_eq!(a.blocks().len(), 2);
        // Position 17 of `a`, layer 1: K = 1, 2, 3, V = -1, -2, -3.
        let at = Tensor::from_vec(vec![row(a.blocks(), 17)], 1, &Device::Cpu).unwrap();
        let k = Tensor::new(&[[1f32, 2., 3.]], &Device::Cpu).unwrap();
        pool.lock().write(1, &at, &k, &k.neg().unwrap()).unwrap();
        // Many more blocks than free: the pool grows and `a`'s rows survive the copy.
        let b = pool.reserve(16 * 40).unwrap();
        assert_eq!(b.blocks().len(), 40);
        assert!(a.blocks().iter().all(|x| !b.blocks().contains(x)));
        let sel = Tensor::new(a.blocks(), &Device::Cpu).unwrap();
        let (gk, gv) = pool.lock().gather(1, &sel).unwrap();
        assert_eq!(gk.dims(), &[32, 3]);
        assert_eq!(host(&gk.get(17).unwrap()), [1., 2., 3.]);
        assert_eq!(host(&gv.get(17).unwrap()), [-1., -2., -3.]);
        assert_eq!(host(&gk.get(16).unwrap()), [0., 0., 0.]);
        // Copying a prefix into another sequence.
        let mut c = pool.reserve(18).unwrap();
        c.copy_from(&a, 18).unwrap();
        let sel = Tensor::new(c.blocks(), &Device::Cpu).unwrap();
        let (gk, _) = pool.lock().gather(1, &sel).unwrap();
        assert_eq!(host(&gk.get(17).unwrap()), [1., 2., 3.]);
        // Dropped sequences give their blocks back, and the next reservation takes them.
        let total = pool.lock().blocks;
        drop(b);
        let free = pool.lock().free.len();
        assert!(free >= 40);
        let d = pool.reserve(16 * 40).unwrap();
        assert_eq!(
            pool.lock().blocks,
            total,
            "the pool grew although blocks were free"
        );
        drop((a, c, d));
        assert_eq!(pool.lock().free.len(), total);
    }
}
