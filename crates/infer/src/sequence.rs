//! [`Sequence`]: one generation's K/V cache and how far it is filled.
//!
//! The cache is the one the backend that made it keeps ([`Cache`]: host memory for the fast
//! backend, blocks of a device pool for candle's), and the sequence carries that backend's
//! [`Maker`]. Every backend refuses a sequence another one made, however alike their shapes
//! (`Backend::accepts`, checked before every step): each matches on the cache it knows and
//! never reaches into the other kind.

use std::sync::Arc;

use crate::config::KvPrecision;
use crate::device_kv::{DeviceKv, SharedPool};
use crate::kv::KvCache;
use crate::Error;

/// Which loaded backend made a cache: one per backend instance, compared by identity (two models
/// of the same shape, or two loads of one file, have different makers). No global counter: the
/// identity is the address of a small allocation the backend holds.
#[derive(Clone, Debug)]
pub(crate) struct Maker(Arc<()>);

impl Maker {
    pub(crate) fn new() -> Maker {
        Maker(Arc::new(()))
    }

    pub(crate) fn is(&self, other: &Maker) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// A sequence's K/V cache, where the backend that made it keeps it.
#[derive(Debug)]
pub(crate) enum Cache {
    /// The fast backend's, in host memory (`kv.rs`).
    Host(HostKv),
    /// The candle backend's: blocks of its model's pool on its device (`device_kv.rs`).
    Device(DeviceKv),
}

/// A host cache: for each layer `l`, `k[l]` and `v[l]` hold `capacity * kv_dim` values (f32,
/// or f16 under `kv_precision = "f16"`), row-major `[position][kv_head][head_dim]`, with
/// `kv_dim = n_head_kv * head_dim`. K is stored after RoPE.
#[derive(Debug)]
pub(crate) struct HostKv {
    pub(crate) k: KvCache,
    pub(crate) v: KvCache,
}

/// One sequence's KV cache, preallocated for `capacity` positions and written in place;
/// positions `0..len` are valid. Made by [`TextModel::new_sequence`](crate::TextModel::new_sequence)
/// and usable only with the model that made it.
#[derive(Debug)]
pub struct Sequence {
    pub(crate) cache: Cache,
    maker: Maker,
    pub(crate) len: usize,
    capacity: usize,
    layers: usize,
    kv_dim: usize,
}

impl Sequence {
    /// An empty host cache of `capacity` positions for `layers` layers of `kv_dim` values of
    /// `elem`, made by `maker`.
    pub(crate) fn on_host(
        maker: &Maker,
        layers: usize,
        kv_dim: usize,
        capacity: usize,
        elem: KvPrecision,
    ) -> Result<Self, Error> {
        let alloc = || KvCache::with_elem(layers, capacity * kv_dim, elem);
        let cache = Cache::Host(HostKv {
            k: alloc()?,
            v: alloc()?,
        });
        Ok(Self::new(maker, cache, layers, kv_dim, capacity))
    }

    /// An empty cache of `capacity` positions in blocks of `pool` (the candle backend's), made
    /// by `maker`.
    pub(crate) fn on_device(
        maker: &Maker,
        pool: &SharedPool,
        layers: usize,
        kv_dim: usize,
        capacity: usize,
    ) -> Result<Self, Error> {
        let cache = Cache::Device(pool.reserve(capacity)?);
        Ok(Self::new(maker, cache, layers, kv_dim, capacity))
    }

    fn new(maker: &Maker, cache: Cache, layers: usize, kv_dim: usize, capacity: usize) -> Self {
        Sequence {
            cache,
            maker: maker.clone(),
            len: 0,
            capacity,
            layers,
            kv_dim,
        }
    }

    /// Whether the backend holding `maker` made this sequence.
    pub(crate) fn made_by(&self, maker: &Maker) -> bool {
        self.maker.is(maker)
    }

    /// The host cache, if this is one.
    pub(crate) fn host(&self) -> Option<&HostKv> {
        match &self.cache {
            Cache::Host(c) => Some(c),
            Cache::Device(_) => None,
        }
    }

    pub(crate) fn host_mut(&mut self) -> Option<&mut HostKv> {
        match &mut self.cache {
            Cache::Host(c) => Some(c),
            Cache::Device(_) => None,
        }
    }

    /// Positions filled so far.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Positions the cache holds in all.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// Positions still free.
    pub fn remaining(&self) -> usize {
        self.capacity - self.len
    }
    /// Forgets positions from `len` on (e.g. to re-run a suffix); no-op if `len >= self.len()`.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
    /// Makes this cache hold the first `len` positions of `from` (a cache of the same model),
    /// for a sequence that starts with what another one computed; returns how many positions
    /// it holds now (fewer when `from` has fewer or this cache is smaller; none when the two
    /// were not made by the same model).
    pub fn copy_prefix(&mut self, from: &Sequence, len: usize) -> usize {
        let len = len.min(from.len).min(self.capacity);
        let copied = self.maker.is(&from.maker)
            && match (&mut self.cache, &from.cache) {
                (Cache::Host(to), Cache::Host(src)) if to.k.elem() == src.k.elem() => {
                    to.k.copy_prefix(&src.k, len * self.kv_dim);
                    to.v.copy_prefix(&src.v, len * self.kv_dim);
                    true
                }
                (Cache::Device(to), Cache::Device(src)) if to.pool().same(src.pool()) => {
                    match to.copy_from(src, len) {
                        Ok(()) => true,
                        Err(e) => {
                            tracing::warn!(error = %e, "copying a cached prefix on the device failed");
                            false
                        }
                    }
                }
                _ => false,
            };
        self.len = if copied { len } else { 0 };
        self.len
    }
    /// Bytes of KV memory this sequence reserved.
    pub fn kv_bytes(&self) -> usize {
        let values = self.capacity * self.kv_dim;
        let per_layer = match &self.cache {
            Cache::Host(c) => c.k.elem().bytes(values),
            Cache::Device(d) => values * d.dtype().size_in_bytes(),
        };
        2 * self.layers * per_layer
    }
}
