//! A part of a buffer: a stretch of its elements that a send reads or a receive writes where it
//! lies, as `t[a:b]` is a view of a tensor in PyTorch. No copy is made: on the CPU backend a
//! part is a slice of the buffer's host memory; on NCCL it is the buffer's device pointer offset
//! by `a` elements, and NCCL reads or writes `b - a` elements from there.
//!
//! A ring algorithm is written with them: `comm.send_recv(data.part(out)?, next,
//! incoming.part_mut(..)?, prev)` sends one block of `data` while another block arrives, and
//! [`Communicator::reduce_local`] adds what arrived into a block of `data`.

use std::marker::PhantomData;
use std::ops::{Bound, Range, RangeBounds};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};

use super::buffer::{wrong_kind, Buffer, Repr};
use crate::dtype::Element;
use crate::error::{CommError, Result};

/// Elements `range` of a [`Buffer`], to send from ([`Buffer::part`]). A `&Buffer` is a part too:
/// the whole of it.
#[derive(Debug)]
pub struct Part<'a, T: Element> {
    pub(super) repr: PartRepr<'a, T>,
}

/// Elements `range` of a [`Buffer`], to receive into ([`Buffer::part_mut`]). A `&mut Buffer` is
/// one too: the whole of it.
#[derive(Debug)]
pub struct PartMut<'a, T: Element> {
    pub(super) repr: PartMutRepr<'a, T>,
}

#[derive(Debug)]
pub(super) enum PartRepr<'a, T: Element> {
    Host(&'a [T]),
    Device(DeviceRange<'a, T>),
}

#[derive(Debug)]
pub(super) enum PartMutRepr<'a, T: Element> {
    Host(&'a mut [T]),
    Device(DeviceRange<'a, T>),
}

/// Elements `range` of a device buffer, as NCCL is handed them: the buffer's pointer plus
/// `range.start` elements. Written through only when it came from a `&mut Buffer` (a
/// [`PartMut`]), whose borrow keeps every other part of that buffer out of the way.
#[derive(Debug)]
pub(crate) struct DeviceRange<'a, T> {
    slice: &'a CudaSlice<T>,
    range: Range<usize>,
    _elements: PhantomData<&'a [T]>,
}

impl<T> DeviceSlice<T> for DeviceRange<'_, T> {
    fn len(&self) -> usize {
        self.range.len()
    }
    fn stream(&self) -> &std::sync::Arc<CudaStream> {
        self.slice.stream()
    }
}

impl<T> DevicePtr<T> for DeviceRange<'_, T> {
    fn device_ptr<'b>(&'b self, stream: &'b CudaStream) -> (u64, SyncOnDrop<'b>) {
        let (base, sync) = self.slice.device_ptr(stream);
        (
            base + (self.range.start * std::mem::size_of::<T>()) as u64,
            sync,
        )
    }
}

impl<T> DevicePtrMut<T> for DeviceRange<'_, T> {
    // The NCCL backend turns cudarc's event tracking off (it orders the work on its one stream
    // itself), so reading the pointer as a read records nothing a write would need.
    fn device_ptr_mut<'b>(&'b mut self, stream: &'b CudaStream) -> (u64, SyncOnDrop<'b>) {
        self.device_ptr(stream)
    }
}

/// `bounds` as a range of a buffer of `len` elements, or a usage error naming both.
fn checked(bounds: impl RangeBounds<usize>, len: usize) -> Result<Range<usize>> {
    let start = match bounds.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match bounds.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    if start > end || end > len {
        return Err(CommError::Usage(format!(
            "part {start}..{end} of a buffer of {len} elements: a part must lie inside the \
             buffer, its start no later than its end"
        )));
    }
    Ok(start..end)
}

impl<T: Element> Buffer<T> {
    /// Elements `range` (`a..b`, `a..`, `..`), to send from, in place. A range past the end is a
    /// usage error naming it.
    pub fn part(&self, range: impl RangeBounds<usize>) -> Result<Part<'_, T>> {
        let range = checked(range, self.len())?;
        Ok(Part {
            repr: match &self.repr {
                Repr::Host(v) => PartRepr::Host(&v[range]),
                Repr::Device(d) => PartRepr::Device(DeviceRange::new(d, range)),
            },
        })
    }

    /// Elements `range`, to receive into (or reduce into), in place.
    pub fn part_mut(&mut self, range: impl RangeBounds<usize>) -> Result<PartMut<'_, T>> {
        let range = checked(range, self.len())?;
        Ok(PartMut {
            repr: match &mut self.repr {
                Repr::Host(v) => PartMutRepr::Host(&mut v[range]),
                Repr::Device(d) => PartMutRepr::Device(DeviceRange::new(d, range)),
            },
        })
    }

    /// Two parts of one buffer at once: `read` to send from while `write` receives, as a ring
    /// step of an in-place all-gather does. They must not overlap (a usage error says so).
    pub fn parts(
        &mut self,
        read: Range<usize>,
        write: Range<usize>,
    ) -> Result<(Part<'_, T>, PartMut<'_, T>)> {
        let (mut read, mut write) = (checked(read, self.len())?, checked(write, self.len())?);
        // An empty part lies anywhere: where it cannot be in the other's way.
        if read.is_empty() {
            read = write.start..write.start;
        } else if write.is_empty() {
            write = read.end..read.end;
        } else if read.start < write.end && write.start < read.end {
            return Err(CommError::Usage(format!(
                "parts {read:?} and {write:?} overlap: a receive must not write what is being sent"
            )));
        }
        Ok(match &mut self.repr {
            Repr::Host(v) => {
                let (r, w) = if read.end <= write.start {
                    let (low, high) = v.split_at_mut(write.start);
                    (&low[read], &mut high[..write.len()])
                } else {
                    let (low, high) = v.split_at_mut(read.start);
                    (&high[..read.len()], &mut low[write])
                };
                (part(PartRepr::Host(r)), part_mut(PartMutRepr::Host(w)))
            }
            Repr::Device(d) => (
                part(PartRepr::Device(DeviceRange::new(d, read))),
                part_mut(PartMutRepr::Device(DeviceRange::new(d, write))),
            ),
        })
    }
}

fn part<T: Element>(repr: PartRepr<'_, T>) -> Part<'_, T> {
    Part { repr }
}

fn part_mut<T: Element>(repr: PartMutRepr<'_, T>) -> PartMut<'_, T> {
    PartMut { repr }
}

impl<'a, T> DeviceRange<'a, T> {
    fn new(slice: &'a CudaSlice<T>, range: Range<usize>) -> DeviceRange<'a, T> {
        DeviceRange {
            slice,
            range,
            _elements: PhantomData,
        }
    }
}

impl<T: Element> Part<'_, T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.repr {
            PartRepr::Host(v) => v.len(),
            PartRepr::Device(d) => d.range.len(),
        }
    }

    /// Whether it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn host(&self) -> Result<&[T]> {
        match &self.repr {
            PartRepr::Host(v) => Ok(v),
            PartRepr::Device(_) => Err(wrong_kind()),
        }
    }

    pub(super) fn device(&self) -> Result<&DeviceRange<'_, T>> {
        match &self.repr {
            PartRepr::Device(d) => Ok(d),
            PartRepr::Host(_) => Err(wrong_kind()),
        }
    }
}

impl<'a, T: Element> PartMut<'a, T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.repr {
            PartMutRepr::Host(v) => v.len(),
            PartMutRepr::Device(d) => d.range.len(),
        }
    }

    /// Whether it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn host(&mut self) -> Result<&mut [T]> {
        match &mut self.repr {
            PartMutRepr::Host(v) => Ok(v),
            PartMutRepr::Device(_) => Err(wrong_kind()),
        }
    }

    pub(super) fn device(&mut self) -> Result<&mut DeviceRange<'a, T>> {
        match &mut self.repr {
            PartMutRepr::Device(d) => Ok(d),
            PartMutRepr::Host(_) => Err(wrong_kind()),
        }
    }
}

impl<'a, T: Element> From<&'a Buffer<T>> for Part<'a, T> {
    /// The whole buffer.
    fn from(buf: &'a Buffer<T>) -> Part<'a, T> {
        buf.part(..).expect("the whole buffer is a part of it")
    }
}

impl<'a, T: Element> From<&'a mut Buffer<T>> for PartMut<'a, T> {
    /// The whole buffer.
    fn from(buf: &'a mut Buffer<T>) -> PartMut<'a, T> {
        buf.part_mut(..).expect("the whole buffer is a part of it")
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::cpu::ChannelTransport;
    use crate::comm::Communicator;
    use crate::dtype::ReduceOp;

    fn comm() -> Communicator {
        let transport = ChannelTransport::mesh(1, std::time::Duration::from_secs(5));
        Communicator::cpu(Box::new(transport.into_iter().next().unwrap()), 0)
    }

    #[test]
    fn parts_are_the_buffers_own_elements() {
        let comm = comm();
        let mut buf = comm.buffer(&[1.0f32, 2.0, 3.0, 4.0, 5.0]).unwrap();
        assert_eq!(buf.part(1..3).unwrap().host().unwrap(), &[2.0, 3.0]);
        assert_eq!(buf.part(..).unwrap().len(), 5);
        // Empty parts overlap nothing, wherever they start.
        assert!(buf.parts(1..1, 0..5).is_ok() && buf.parts(0..5, 2..2).is_ok());
        let (read, mut write) = buf.parts(3..5, 0..2).unwrap();
        write.host().unwrap().copy_from_slice(read.host().unwrap());
        assert_eq!(comm.to_host(&buf).unwrap(), [4.0, 5.0, 3.0, 4.0, 5.0]);
        let ones = comm.buffer(&[1.0f32; 2]).unwrap();
        comm.reduce_local(buf.part_mut(3..5).unwrap(), &ones, ReduceOp::Sum)
            .unwrap();
        comm.copy_local(ones.part(..1).unwrap(), buf.part_mut(2..3).unwrap())
            .unwrap();
        assert_eq!(comm.to_host(&buf).unwrap(), [4.0, 5.0, 1.0, 5.0, 6.0]);
    }

    #[test]
    fn a_part_outside_the_buffer_or_overlapping_is_a_usage_error() {
        let comm = comm();
        let mut buf = comm.zeros::<i32>(4).unwrap();
        let e = buf.part(2..6).unwrap_err().to_string();
        assert!(e.contains("part 2..6 of a buffer of 4 elements"), "{e}");
        let e = buf.parts(0..2, 1..3).unwrap_err().to_string();
        assert!(e.contains("overlap"), "{e}");
        let short = comm.zeros::<i32>(3).unwrap();
        let e = comm
            .reduce_local(&mut buf, &short, ReduceOp::Sum)
            .unwrap_err()
            .to_string();
        assert!(e.contains("a part of 4 elements and one of 3"), "{e}");
    }
}
