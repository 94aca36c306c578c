//! One sequence's K (or V) cache: `capacity * kv_dim` values per layer, all in one anonymous
//! memory mapping of its own. The values are f32, f16 (`kv_precision = "f16"`, half the bytes),
//! or quantized: every layer's quants, then every layer's f16 scales, one per block of 32
//! values (`"q8_0"`, a byte a value: 34 bytes where f16 takes 64; `"q4_0"`, half a byte: 18).
//! The operating system hands the mapping's pages out zeroed as they are first written, so a cache is resident only as far as it has filled, and
//! dropping it returns the memory at once. A `Vec` would not promise either: once the allocator
//! has recycled a freed cache's memory, a new zeroed one is written through (all of it resident
//! before its first token) and a freed one may stay with the process.

use std::ops::Range;

use hearth_kernels::ops::{QuantKind, QuantValues};

use crate::config::KvPrecision;
use crate::Error;

/// Values of one quantized block.
const BLOCK: usize = KvPrecision::QUANT_BLOCK;

pub(crate) struct KvCache {
    map: memmap2::MmapMut,
    layers: usize,
    per_layer: usize,
    elem: KvPrecision,
}

/// One layer of a cache, to read.
pub(crate) enum Layer<'a> {
    F32(&'a [f32]),
    F16(&'a [half::f16]),
    Quant(QuantValues<'a>),
}

/// One layer of a cache, to write.
pub(crate) enum LayerMut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [half::f16]),
    /// The blocks' quants ([`QuantKind::block_bytes`] each) and one scale per block.
    Quant(QuantKind, &'a mut [u8], &'a mut [half::f16]),
}

impl KvCache {
    /// `layers` zeroed slices of `per_layer` f32 values each.
    #[cfg(test)]
    pub(crate) fn new(layers: usize, per_layer: usize) -> Result<KvCache, Error> {
        Self::with_elem(layers, per_layer, KvPrecision::F32)
    }

    /// `layers` zeroed slices of `per_layer` values of `elem` each (quantized, a whole number
    /// of blocks: the backend refuses heads that are not).
    pub(crate) fn with_elem(
        layers: usize,
        per_layer: usize,
        elem: KvPrecision,
    ) -> Result<KvCache, Error> {
        assert!(
            elem.quant().is_none() || per_layer.is_multiple_of(BLOCK),
            "a {} cache of {per_layer} values a layer",
            elem.name()
        );
        let bytes = layers * elem.bytes(per_layer);
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

    /// Where layer `layer`'s first `values` values lie in the mapping, in bytes: the values
    /// themselves, and their block scales (quantized; empty otherwise). The one owner of the
    /// layout: every layer's values, then, quantized, every layer's scales.
    fn ranges(&self, layer: usize, values: usize) -> [Range<usize>; 2] {
        let per = self.per_layer;
        match self.elem.quant() {
            Some(kind) => {
                let bytes = |values: usize| kind.quant_bytes(values.div_ceil(BLOCK) * BLOCK);
                let quants = bytes(layer * per);
                let scales = self.layers * bytes(per) + 2 * (layer * per / BLOCK);
                [
                    quants..quants + bytes(values),
                    scales..scales + 2 * values.div_ceil(BLOCK),
                ]
            }
            None => {
                let size = self.elem.bytes(1);
                [layer * per * size..(layer * per + values) * size, 0..0]
            }
        }
    }

    /// Layer `layer` (< the cache's layers).
    pub(crate) fn layer(&self, layer: usize) -> Layer<'_> {
        assert!(layer < self.layers, "layer {layer} of {}", self.layers);
        // The mapping is page-aligned and every range starts on its element's size, so the
        // casts cannot fail on alignment.
        let [x, d] = self.ranges(layer, self.per_layer);
        let x = &self.map[x];
        match self.elem.quant() {
            Some(kind) => Layer::Quant(QuantValues {
                kind,
                q: x,
                d: bytemuck::cast_slice(&self.map[d]),
            }),
            None if self.elem == KvPrecision::F16 => Layer::F16(bytemuck::cast_slice(x)),
            None => Layer::F32(bytemuck::cast_slice(x)),
        }
    }

    /// Layer `layer` (< the cache's layers), to write.
    pub(crate) fn layer_mut(&mut self, layer: usize) -> LayerMut<'_> {
        assert!(layer < self.layers, "layer {layer} of {}", self.layers);
        let [x, d] = self.ranges(layer, self.per_layer);
        match self.elem.quant() {
            Some(kind) => {
                // The scales come after every layer's quants: two disjoint borrows.
                let (head, tail) = self.map.split_at_mut(d.start);
                LayerMut::Quant(
                    kind,
                    &mut head[x],
                    bytemuck::cast_slice_mut(&mut tail[..d.len()]),
                )
            }
            None if self.elem == KvPrecision::F16 => {
                LayerMut::F16(bytemuck::cast_slice_mut(&mut self.map[x]))
            }
            None => LayerMut::F32(bytemuck::cast_slice_mut(&mut self.map[x])),
        }
    }

    /// Copies the first `values` values of every layer of `from` (a cache of the same shape and
    /// element; quantized, a whole number of blocks) into this one.
    pub(crate) fn copy_prefix(&mut self, from: &KvCache, values: usize) {
        let values = values.min(self.per_layer);
        for il in 0..self.layers.min(from.layers) {
            for (to, src) in self
                .ranges(il, values)
                .into_iter()
                .zip(from.ranges(il, values))
            {
                self.map[to].copy_from_slice(&from.map[src]);
            }
        }
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
        assert_eq!(c.layers, 3);
        assert!((0..3).all(|l| f32s(&c, l).len() == 10 && f32s(&c, l).iter().all(|&x| x == 0.0)));
        f32s_mut(&mut c, 1)[9] = 2.5;
        f32s_mut(&mut c, 2)[0] = -1.0;
        let at = |l, i| f32s(&c, l)[i];
        assert_eq!(
            (at(0, 9), at(1, 9), at(2, 0), at(1, 0)),
            (0.0, 2.5, -1.0, 0.0)
        );
        let empty = KvCache::new(4, 0).unwrap();
        assert!(f32s(&empty, 3).is_empty());
    }

    fn f32s(c: &KvCache, l: usize) -> &[f32] {
        match c.layer(l) {
            Layer::F32(x) => x,
            _ => panic!("not f32"),
        }
    }

    fn f32s_mut(c: &mut KvCache, l: usize) -> &mut [f32] {
        match c.layer_mut(l) {
            LayerMut::F32(x) => x,
            _ => panic!("not f32"),
        }
    }

    #[test]
    fn an_f16_cache_takes_half_the_bytes_and_copies_its_prefix() {
        let mut a = KvCache::with_elem(2, 8, KvPrecision::F16).unwrap();
        let LayerMut::F16(l1) = a.layer_mut(1) else {
            panic!("not f16")
        };
        l1[..3].copy_from_slice(&[half::f16::from_f32(1.5); 3]);
        let mut b = KvCache::with_elem(2, 8, KvPrecision::F16).unwrap();
        b.copy_prefix(&a, 2);
        let Layer::F16(l1) = b.layer(1) else {
            panic!("not f16")
        };
        let got: Vec<f32> = l1.iter().map(|x| x.to_f32()).collect();
        assert_eq!(got, [1.5, 1.5, 0., 0., 0., 0., 0., 0.]);
        assert_eq!(a.map.len(), 2 * 8 * 2);
    }

    /// Each layer's quants and scales are its own (writing one layer leaves the others), a
    /// prefix copy takes both, and the cache is 34 bytes a block in q8_0, 18 in q4_0.
    #[test]
    fn a_quantized_cache_keeps_each_layers_quants_and_scales_apart_and_copies_its_prefix() {
        for (elem, block) in [(KvPrecision::Q8_0, 32), (KvPrecision::Q4_0, 16)] {
            let (layers, per) = (3, 96);
            let mut a = KvCache::with_elem(layers, per, elem).unwrap();
            assert_eq!(a.map.len(), layers * per / 32 * (block + 2));
            for il in 0..layers {
                let LayerMut::Quant(_, q, d) = a.layer_mut(il) else {
                    panic!("not quantized")
                };
                assert_eq!((q.len(), d.len()), (per / 32 * block, per / 32));
                q.iter_mut()
                    .enumerate()
                    .for_each(|(i, x)| *x = (il * 10 + i % 7) as u8);
                d.iter_mut()
                    .enumerate()
                    .for_each(|(b, x)| *x = half::f16::from_f32((il * 3 + b) as f32));
            }
            let mut b = KvCache::with_elem(layers, per, elem).unwrap();
            b.copy_prefix(&a, 64);
            for il in 0..layers {
                let Layer::Quant(v) = b.layer(il) else {
                    panic!("not quantized")
                };
                assert_eq!(v.kind, elem.quant().unwrap());
                let want_q: Vec<u8> = (0..per / 32 * block)
                    .map(|i| {
                        if i < 2 * block {
                            (il * 10 + i % 7) as u8
                        } else {
                            0
                        }
                    })
                    .collect();
                let want_d: Vec<f32> = (0..per / 32)
                    .map(|b| if b < 2 { (il * 3 + b) as f32 } else { 0.0 })
                    .collect();
                assert_eq!(v.q, &want_q[..], "{elem:?} layer {il}");
                assert_eq!(v.d.iter().map(|x| x.to_f32()).collect::<Vec<_>>(), want_d);
            }
        }
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
            f32s_mut(&mut c, 1)[..1 << 20].fill(1.0); // 4 MiB of the second layer
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
