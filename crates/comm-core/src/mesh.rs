//! A 2-D mesh of ranks, data parallel × tensor parallel, laid out as torch's
//! `init_device_mesh("cuda", (dp, tp), mesh_dim_names=("dp", "tp"))` lays it out: the ranks
//! 0..dp·tp in a `dp × tp` grid, row-major, so the last dimension is the innermost. Rank
//! `r` sits at row `r / tp`, column `r % tp`:
//!
//! ```text
//!            tp rank 0   tp rank 1
//! dp rank 0   rank 0      rank 1      ← tp 0 (a row: consecutive ranks, one node)
//! dp rank 1   rank 2      rank 3      ← tp 1
//!               ↑ dp 0      ↑ dp 1      (a column: one rank of each node)
//! ```
//!
//! A row is a tensor-parallel group (`tp <row>`): consecutive ranks, which launchers place on
//! one node, where the links are fast; a column is a data-parallel group (`dp <column>`), one
//! rank per row, across nodes. Megatron-LM's `initialize_model_parallel` makes the same
//! groups. Each is a [`Communicator::split`] of the parent: color the row (or column), key the
//! place in it.
//!
//! [`Order::TpOuter`] swaps the dimensions, as `init_device_mesh(..., (tp, dp),
//! mesh_dim_names=("tp", "dp"))` does: then the data-parallel groups are the consecutive ranks
//! and each tensor-parallel group spans the nodes (what one should not do, measured in the book).

use crate::comm::Communicator;
use crate::error::{CommError, Result};
use crate::named::Named;

/// Which dimension of the mesh is the innermost (on consecutive ranks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// `(dp, tp)`: tensor-parallel groups of consecutive ranks (within a node), Megatron's.
    #[default]
    TpInner,
    /// `(tp, dp)`: data-parallel groups of consecutive ranks, tensor-parallel ones across them.
    TpOuter,
}

impl Named for Order {
    const ALL: &'static [Self] = &[Self::TpInner, Self::TpOuter];

    fn name(self) -> &'static str {
        match self {
            Order::TpInner => "dp,tp",
            Order::TpOuter => "tp,dp",
        }
    }
}

impl Order {
    /// Where rank `rank` of a `dp × tp` mesh in this order sits: (its row, i.e. its rank in its
    /// data-parallel group and the number of its tensor-parallel group; its column, its rank in
    /// its tensor-parallel group and the number of its data-parallel group).
    pub fn place(self, rank: usize, dp: usize, tp: usize) -> (usize, usize) {
        match self {
            Order::TpInner => (rank / tp, rank % tp),
            Order::TpOuter => (rank % dp, rank / dp),
        }
    }
}

/// This rank's two groups in a `dp × tp` mesh (see the module's documentation).
pub struct Mesh {
    /// Its data-parallel group: the ranks at its column, one per row (`dp <column>`).
    pub dp: Communicator,
    /// Its tensor-parallel group: the ranks of its row (`tp <row>`).
    pub tp: Communicator,
}

impl Mesh {
    /// Splits `parent` into a `dp × tp` mesh: every rank of it calls this with the same shape
    /// (ranks given different shapes fail at once, saying so). `dp · tp` must be its size.
    pub fn new(parent: &Communicator, dp: usize, tp: usize) -> Result<Mesh> {
        Mesh::ordered(parent, dp, tp, Order::TpInner)
    }

    /// [`Mesh::new`] with the dimensions in `order`, outermost first.
    pub fn ordered(parent: &Communicator, dp: usize, tp: usize, order: Order) -> Result<Mesh> {
        let n = parent.world_size();
        if dp == 0 || tp == 0 || dp * tp != n {
            return Err(CommError::Usage(format!(
                "a mesh of dp {dp} x tp {tp} needs {} ranks, and there are {n}: give a \
                 tensor-parallel size that divides {n}",
                dp * tp
            )));
        }
        let r = parent.rank();
        let (row, column) = order.place(r, dp, tp);
        let what = format!("a mesh of dp {dp} x tp {tp} ({})", order.name());
        let group = |dim: &str, color: usize, key: usize| {
            let split = parent.split_for(&what, dim, color as i32, key as i32)?;
            split.ok_or_else(|| CommError::Peer(format!("no {dim} group for rank {r}")))
        };
        let tp_group = group("tp", row, column)?;
        let dp_group = group("dp", column, row)?;
        Ok(Mesh {
            dp: dp_group,
            tp: tp_group,
        })
    }

    /// Where this rank sits: (its row, its column), i.e. (its rank in `dp`, its rank in `tp`).
    pub fn coordinates(&self) -> (usize, usize) {
        (self.dp.rank(), self.tp.rank())
    }
}
