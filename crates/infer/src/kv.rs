//! One sequence's K (or V) cache: a slice of `capacity * kv_dim` values per layer (f32, or f16
//! for `kv_precision = "f16"`, half the bytes), all in one anonymous memory mapping of its own.
//! The operating system hands the mapping's pages out zeroed as they are first written, so a cache is resident only as far as it has filled, and
//! dropping it returns the memory at once. A `Vec` would not promise either: once the allocator
//! has recycled a freed cache's memory, a new zeroed one is written through (all of it resident
//! before its first token) and a freed one may stay with the process.

use std::ops::{Index, IndexMut};

use crate::config::KvPrecision;
use crate::Error;

pub(crate) struct KvCache {
    map: memmap2::MmapMut,
    layers: usize,
    per_layer: usize,
    elem: KvPrecision,
}

impl KvCache {
    /// `layers` zeroed slices of `per_layer` f32 values each.
    #[cfg(test)]
    pub(crate) fn new(layers: usize, per_layer: usize) -> Result<KvCache, Error> {
        Self::with_elem(layers, per_layer, KvPrecision::F32)
    }

    /// Layers.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.layers
    }

    /// `layers` zeroed slices of `per_layer` values of `elem` each.
    pub(crate) fn with_elem(
        layers: usize,
        per_layer: usize,
        elem: KvPrecision,
    ) -> Result<KvCache, Error> {
        let bytes = layers * per_layer * elem.value_bytes();
        // A mapping cannot be empty: a cache of no positions maps one value (a page).
        let map = memmap2::MmapMut::map_anon(bytes.max(std::mem::size_of::<f32>()))
            .map_err(|source| Error::KvMemory { bytes, source })?;
        Ok(KvCache {
            map,
            layers,
            per_layer,
            elem,
        })
    }

    pub(crate) fn elem(&self) -> KvPrecision {
        self.elem
    }

    /// Layer `layer` of an f16 cache; `None` for an f32 one.
    pub(crate) fn f16(&self, layer: usize) -> Option<&[half::f16]> {
        (self.elem == KvPrecision::F16 && layer < self.layers).then(|| {
            let all: &[half::f16] = bytemuck::cast_slice(&self.map[..]);
            &all[layer * self.per_layer..(layer + 1) * self.per_layer]
        })
    }

    /// Layer `layer` of an f16 cache, to write; `None` for an f32 one.
    pub(crate) fn f16_mut(&mut self, layer: usize) -> Option<&mut [half::f16]> {
        let per = self.per_layer;
        (self.elem == KvPrecision::F16 && layer < self.layers).then(|| {
            let all: &mut [half::f16] = bytemuck::cast_slice_mut(&mut self.map[..]);
            &mut all[layer * per..(layer + 1) * per]
        })
    }

    /// Copies the first `values` values of every layer of `from` (a cache of the same shape and
    /// element) into this one.
    pub(crate) fn copy_prefix(&mut self, from: &KvCache, values: usize) {
        let (size, per) = (self.elem.value_bytes(), self.per_layer);
        let n = values.min(per) * size;
        for il in 0..self.layers.min(from.layers) {
            let (a, b) = (il * per * size, il * from.per_layer * size);
            self.map[a..a + n].copy_from_slice(&from.map[b..b + n]);
        }
    }

    /// The values of an f32 cache. Host backends index only caches they made (`Backend::accepts`);
    /// an f16 cache has no f32 view, and indexing one is a bug, caught here.
    fn floats(&self) -> &[f32] {
        assert_eq!(self.elem, KvPrecision::F32, "an f16 cache read as f32");
        // The mapping is page-aligned, so the cast cannot fail on alignment.
        &bytemuck::cast_slice(&self.map[..])[..self.layers * self.per_layer]
    }

    fn floats_mut(&mut self) -> &mut [f32] {
        assert_eq!(self.elem, KvPrecision::F32, "an f16 cache written as f32");
        let n = self.layers * self.per_layer;
        &mut bytemuck::cast_slice_mut(&mut self.map[..])[..n]
    }
}

impl Index<usize> for KvCache {
    type Output = [f32];
    fn index(&self, layer: usize) -> &[f32] {
        assert!(layer < self.layers, "layer {layer} of {}", self.layers);
        &self.floats()[layer * self.per_layer..(layer + 1) * self.per_layer]
    }
}

impl IndexMut<usize> for KvCache {
    fn index_mut(&mut self, layer: usize) -> &mut [f32] {
        assert!(layer < self.layers, "layer {layer} of {}", self.layers);
        let per = self.per_layer;
        &mut self.floats_mut()[layer * per..(layer + 1) * per]
    }
}

impl std::fmt::Debug for KvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvCache")
            .field("layers", &self.layers)
            .field("per_layer", &self.per_layer)
            .field("elem", &self.elem)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_are_separate_zeroed_slices() {
        let mut c = KvCache::new(3, 10).unwrap();
        assert_eq!(c.len(), 3);
        assert!((0..3).all(|l| c[l].len() == 10 && c[l].iter().all(|&x| x == 0.0)));
        c[1][9] = 2.5;
        c[2][0] = -1.0;
        assert_eq!((c[0][9], c[1][9], c[2][0], c[1][0]), (0.0, 2.5, -1.0, 0.0));
        let empty = KvCache::new(4, 0).unwrap();
        assert!(empty[3].is_empty());
        assert!(c.f16(0).is_none());
    }

    #[test]
    fn an_f16_cache_takes_half_the_bytes_and_copies_its_prefix() {
        let mut a = KvCache::with_elem(2, 8, KvPrecision::F16).unwrap();
        assert!(a.f16(2).is_none());
        a.f16_mut(1).unwrap()[..3].copy_from_slice(&[half::f16::from_f32(1.5); 3]);
        let mut b = KvCache::with_elem(2, 8, KvPrecision::F16).unwrap();
        b.copy_prefix(&a, 2);
        let got: Vec<f32> = b.f16(1).unwrap().iter().map(|x| x.to_f32()).collect();
        assert_eq!(got, [1.5, 1.5, 0., 0., 0., 0., 0., 0.]);
        assert_eq!(a.map.len(), 2 * 8 * 2);
    }

    /// Pages of the cache's mapping that are resident (`mincore`), and the page size.
    #[cfg(target_os = "linux")]
    #[allow(unsafe_code)]
    fn resident_pages(c: &KvCache) -> (usize, usize) {
        // SAFETY: sysconf has no preconditions; mincore reads the residency of a range this
        // cache maps (page-aligned start, its own length) into a vector of one byte per page.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let len = c.map.len();
        let mut flags = vec![0u8; len.div_ceil(page)];
        let rc = unsafe { libc::mincore(c.map.as_ptr() as *mut _, len, flags.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        (flags.iter().filter(|&&f| f & 1 == 1).count(), page)
    }

    /// A large cache costs nothing until written, and only what is written, however many caches
    /// came and went before it (a `Vec` from a recycling allocator is written through at once).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_cache_is_resident_only_as_far_as_it_is_written() {
        let per_layer = 16 << 20; // 64 MiB of floats per layer, 256 MiB in all
        for _ in 0..3 {
            let mut c = KvCache::new(4, per_layer).unwrap();
            assert_eq!(resident_pages(&c).0, 0, "an untouched cache is resident");
            c[1][..1 << 20].fill(1.0); // 4 MiB of the second layer
            let (pages, page) = resident_pages(&c);
            let written = (4 << 20) / page;
            // Transparent huge pages, where the system gives them, round up to 2 MiB.
            assert!(
                (written..=written + 2 * (2 << 20) / page).contains(&pages),
                "{pages} pages resident for {written} written"
            );
        }
    }
}
