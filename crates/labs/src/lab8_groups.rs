//! Lab 8: the data-parallel and tensor-parallel groups of a mesh, built with `split`. The page:
//! docs/src/lab8-groups.md. Check it with `cargo lab 8`.

use comm_core::{CommError, Communicator, Mesh, Result};

/// This rank's two groups in a `dp × tp` mesh of `comm`'s ranks, laid out as PyTorch's
/// `init_device_mesh("cuda", (dp, tp), mesh_dim_names=("dp", "tp"))` lays them out: a grid of
/// `dp` rows and `tp` columns, filled row by row, so rank r sits at row `r / tp`, column `r % tp`.
///
/// - `tp`, its **tensor-parallel group**: the ranks of its row, `tp` consecutive ranks, in order
///   (on 8 ranks as dp 2 × tp 4: ranks 0 1 2 3, and 4 5 6 7; rank 5 is rank 1 of the second);
/// - `dp`, its **data-parallel group**: the ranks of its column, one from each row, in order
///   (ranks 0 4, 1 5, 2 6 and 3 7; rank 5 is rank 1 of `1 5`).
///
/// When `dp × tp` is not the rank count, no mesh fits: return an error on every rank, before any
/// split, saying why: `return Err(CommError::Usage(format!("...")));`.
///
/// Use only `comm.rank()`, `comm.world_size()` and `comm.split(color, key)?`, which every rank
/// must call, the same splits in the same order: the ranks that give the same color (an `i32`,
/// 0 or more) form a group, ranked by their keys. It returns an `Option<Communicator>`, `None`
/// only for the color `NO_COLOR`, which you do not need here. Return `Ok(Mesh { dp, tp })`. (The
/// library's `Mesh::new` builds the same groups: the checker compares yours with its.)
pub fn mesh_groups(comm: &Communicator, dp: usize, tp: usize) -> Result<Mesh> {
    todo!("lab 8: build the two groups with split")
}
