//! Buffers that start on a 64-byte cache line.
//!
//! The allocator places a large `Vec<u8>` 16 bytes into a line, so every 64-byte row of a
//! buffer whose rows are a multiple of 64 bytes long straddles two lines. The AMX tiles load
//! rows of 32 and 64 bytes (activation blocks, weight blocks); a straddling row costs a second
//! access, which measured a sixth of the AMX path's time on SmolLM2's gate+up.

// Unsafe is needed only to view the lines as one slice of bytes.
#![allow(unsafe_code)]

use std::ops::{Deref, DerefMut};

/// A byte type a line can hold (`u8`, `i8`).
pub(crate) trait Byte: Copy + Default + std::fmt::Debug {}
impl Byte for u8 {}
impl Byte for i8 {}

#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Line<T: Byte>([T; 64]);

/// A buffer of whole cache lines, seen as a slice of bytes.
#[derive(Debug, Clone)]
pub(crate) struct Lines<T: Byte>(Vec<Line<T>>);

impl<T: Byte> Default for Lines<T> {
    fn default() -> Self {
        Lines(Vec::new())
    }
}

impl<T: Byte> Lines<T> {
    pub(crate) fn with_capacity(bytes: usize) -> Lines<T> {
        Lines(Vec::with_capacity(bytes.div_ceil(64)))
    }

    /// `bytes` (rounded up to a whole line) copies of `v`.
    pub(crate) fn filled(bytes: usize, v: T) -> Lines<T> {
        Lines(vec![Line([v; 64]); bytes.div_ceil(64)])
    }

    /// Makes the buffer `bytes` (rounded up to a whole line) long, keeping what it held (new
    /// bytes `T::default()`).
    pub(crate) fn set_len(&mut self, bytes: usize) {
        self.0.resize(bytes.div_ceil(64), Line([T::default(); 64]));
    }

    /// Makes the buffer `bytes` (rounded up to a whole line) long, every byte `T::default()`.
    pub(crate) fn zeroed(&mut self, bytes: usize) {
        self.0.clear();
        self.0.resize(bytes.div_ceil(64), Line([T::default(); 64]));
    }
}

impl<T: Byte> Deref for Lines<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `Line<T>` is 64 `T` with no padding (repr(C) over an array of a one-byte
        // type, 64 bytes, aligned to 64); the slice covers exactly the initialized lines.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr() as *const T, self.0.len() * 64) }
    }
}

impl<T: Byte> DerefMut for Lines<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as for `deref`, and the borrow is unique.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr() as *mut T, self.0.len() * 64) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_start_on_a_cache_line_and_read_as_bytes() {
        let mut l: Lines<u8> = Lines::filled(100, 7);
        assert_eq!(l.len(), 128);
        assert_eq!(l.as_ptr() as usize % 64, 0);
        assert!(l.iter().all(|&b| b == 7));
        l[127] = 1;
        l.set_len(192);
        assert_eq!((l[0], l[127], l[128]), (7, 1, 0));
        l.zeroed(64);
        assert_eq!(&*l, &[0u8; 64][..]);
        let m: Lines<i8> = Lines::with_capacity(10);
        assert!(m.is_empty());
    }
}
