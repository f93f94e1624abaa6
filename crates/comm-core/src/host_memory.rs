//! Where a CPU buffer's elements live: on the heap (a `Vec`), or in registered memory, shared
//! memory every rank of the host maps, where a collective's peers read them in place (the
//! shared-memory transport's pool). Both read and write as a slice.

use std::fmt;
use std::ops::{Deref, DerefMut};

use bytemuck::{cast_slice, cast_slice_mut};

use crate::backend::cpu::shm::Region;
use crate::backend::cpu::Window;
use crate::dtype::Element;
use crate::error::Result;

/// A CPU buffer's elements.
pub(crate) enum HostMemory<T: Element> {
    /// On the heap: collectives move them by messages.
    Heap(Vec<T>),
    /// In the registered pool: `len` elements at the start of `region`.
    Registered { region: Region, len: usize },
}

impl<T: Element> HostMemory<T> {
    /// `len` elements, each set by `fill`: in registered memory where `window` has room for
    /// them (the memory may hold an earlier buffer's bytes until filled), else `heap()`'s.
    pub(crate) fn new(
        window: Option<Box<dyn Window + '_>>,
        len: usize,
        fill: impl FnOnce(&mut [T]),
        heap: impl FnOnce() -> Vec<T>,
    ) -> Result<Self> {
        let bytes = len * std::mem::size_of::<T>();
        let region = match window {
            Some(window) if len > 0 => window.allocate(bytes)?,
            _ => None,
        };
        let Some(region) = region else {
            return Ok(HostMemory::Heap(heap()));
        };
        let mut memory = HostMemory::Registered { region, len };
        fill(&mut memory);
        Ok(memory)
    }
}

impl<T: Element> Deref for HostMemory<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            HostMemory::Heap(v) => v,
            // The region starts 64-byte aligned, so it holds elements of any type.
            HostMemory::Registered { region, len } => &cast_slice(region.bytes())[..*len],
        }
    }
}

impl<T: Element> DerefMut for HostMemory<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            HostMemory::Heap(v) => v,
            HostMemory::Registered { region, len } => {
                &mut cast_slice_mut(region.bytes_mut())[..*len]
            }
        }
    }
}

impl<T: Element> fmt::Debug for HostMemory<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self {
            HostMemory::Heap(_) => "heap",
            HostMemory::Registered { .. } => "registered",
        };
        write!(f, "{kind} {:?}", &self[..self.len().min(8)])
    }
}
