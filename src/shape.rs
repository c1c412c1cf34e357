//! Shapes and strided layouts.
//!
//! A [`Layout`] says how a tensor's elements sit inside its storage: a shape,
//! one stride per axis (in elements, possibly 0 for broadcast views) and an
//! element offset. Views (transpose, slice, expand, reshape of contiguous
//! data) are new layouts over the same storage; everything else produces a
//! fresh contiguous storage.

use smallvec::SmallVec;
use std::fmt;

/// The extent of each axis. Rank 0 is a scalar.
pub type Dims = SmallVec<[usize; 4]>;

/// Element strides of each axis.
pub type Strides = SmallVec<[usize; 4]>;

/// Shape + strides + offset of a tensor inside its storage, in elements.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    /// The extent of each axis.
    pub dims: Dims,
    /// The step between neighbours along each axis, in elements (0: broadcast).
    pub strides: Strides,
    /// The first element's index in the storage.
    pub offset: usize,
}

impl Layout {
    /// A row-major contiguous layout starting at element 0.
    pub fn contiguous(dims: &[usize]) -> Layout {
        let mut strides: Strides = SmallVec::from_elem(0, dims.len());
        let mut acc = 1usize;
        for axis in (0..dims.len()).rev() {
            strides[axis] = acc;
            acc *= dims[axis];
        }
        Layout {
            dims: dims.into(),
            strides,
            offset: 0,
        }
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    /// True when the elements are row-major and packed (offset may be nonzero).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1usize;
        for axis in (0..self.dims.len()).rev() {
            if self.dims[axis] != 1 && self.strides[axis] != expected {
                return false;
            }
            expected *= self.dims[axis];
        }
        true
    }

    /// One past the largest element index this layout touches (0 when empty).
    pub fn extent(&self) -> usize {
        if self.numel() == 0 {
            return self.offset;
        }
        self.offset
            + self
                .dims
                .iter()
                .zip(&self.strides)
                .map(|(d, s)| (d - 1) * s)
                .sum::<usize>()
            + 1
    }

    /// Calls `f` with the storage index of every element, in row-major order.
    pub fn for_each_index(&self, mut f: impl FnMut(usize)) {
        let n = self.numel();
        if n == 0 {
            return;
        }
        if self.is_contiguous() {
            (self.offset..self.offset + n).for_each(f);
            return;
        }
        let rank = self.rank();
        let mut counter: Dims = SmallVec::from_elem(0, rank);
        let mut index = self.offset;
        for _ in 0..n {
            f(index);
            // Increment the multi-index like an odometer, keeping `index` in step.
            for axis in (0..rank).rev() {
                counter[axis] += 1;
                index += self.strides[axis];
                if counter[axis] < self.dims[axis] {
                    break;
                }
                index -= self.strides[axis] * self.dims[axis];
                counter[axis] = 0;
            }
        }
    }
}

impl fmt::Debug for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.dims.as_slice())?;
        if !self.is_contiguous() || self.offset != 0 {
            write!(f, "/strides{:?}+{}", self.strides.as_slice(), self.offset)?;
        }
        Ok(())
    }
}

/// The element count of `dims`, or `None` if it (or its size in f32 bytes)
/// overflows. Dims from outside (traces, op attributes) go through this.
pub fn checked_numel(dims: &[usize]) -> Option<usize> {
    let numel = dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))?;
    numel.checked_mul(4)?;
    Some(numel)
}

/// Resolves a possibly negative axis (`-1` is the last) against `rank`.
pub fn resolve_axis(axis: isize, rank: usize) -> Option<usize> {
    let resolved = if axis < 0 { axis + rank as isize } else { axis };
    (0..rank as isize)
        .contains(&resolved)
        .then_some(resolved as usize)
}

/// NumPy broadcasting of two shapes, or `None` when they are incompatible.
pub fn broadcast_dims(a: &[usize], b: &[usize]) -> Option<Dims> {
    let rank = a.len().max(b.len());
    let mut out: Dims = SmallVec::from_elem(0, rank);
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// A view of `layout` broadcast to `dims` (stride 0 on stretched axes), or
/// `None` when `layout` cannot broadcast to `dims`.
pub fn broadcast_layout(layout: &Layout, dims: &[usize]) -> Option<Layout> {
    if layout.rank() > dims.len() {
        return None;
    }
    let lead = dims.len() - layout.rank();
    let mut strides: Strides = SmallVec::from_elem(0, dims.len());
    for (i, &d) in dims.iter().enumerate() {
        if i < lead {
            continue;
        }
        let (src_dim, src_stride) = (layout.dims[i - lead], layout.strides[i - lead]);
        strides[i] = match src_dim {
            x if x == d => src_stride,
            1 => 0,
            _ => return None,
        };
    }
    Some(Layout {
        dims: dims.into(),
        strides,
        offset: layout.offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_strides_and_iteration() {
        let l = Layout::contiguous(&[2, 3]);
        assert_eq!(l.strides.as_slice(), &[3, 1]);
        assert!(l.is_contiguous());
        let mut seen = vec![];
        l.for_each_index(|i| seen.push(i));
        assert_eq!(seen, vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn transposed_iteration_follows_strides() {
        let l = Layout {
            dims: Dims::from_slice(&[3, 2]),
            strides: Strides::from_slice(&[1, 3]),
            offset: 0,
        };
        assert!(!l.is_contiguous());
        let mut seen = vec![];
        l.for_each_index(|i| seen.push(i));
        assert_eq!(seen, vec![0, 3, 1, 4, 2, 5]);
        assert_eq!(l.extent(), 6);
    }

    #[test]
    fn broadcasting() {
        assert_eq!(
            broadcast_dims(&[2, 1, 3], &[4, 1]).unwrap().as_slice(),
            &[2, 4, 3]
        );
        assert!(broadcast_dims(&[2, 3], &[4]).is_none());
        let b = broadcast_layout(&Layout::contiguous(&[3]), &[2, 3]).unwrap();
        let mut seen = vec![];
        b.for_each_index(|i| seen.push(i));
        assert_eq!(seen, vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn negative_axes() {
        assert_eq!(resolve_axis(-1, 3), Some(2));
        assert_eq!(resolve_axis(3, 3), None);
        assert_eq!(resolve_axis(-4, 3), None);
    }
}
