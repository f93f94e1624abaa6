//! Lab 8's solution: two splits of the job's ranks, one colored by row (the tensor-parallel
//! groups), one by column (the data-parallel groups), each keyed by the rank's place in its group.

use comm_core::{CommError, Communicator, Mesh, Result};

/// This rank's groups in a `dp × tp` mesh, rows of consecutive ranks (`init_device_mesh`'s order).
pub fn mesh_groups(comm: &Communicator, dp: usize, tp: usize) -> Result<Mesh> {
    let n = comm.world_size();
    // Refused before any split: every rank reaches the same answer, so none waits in a split.
    if dp * tp != n {
        return Err(CommError::Usage(format!(
            "a mesh of dp {dp} × tp {tp} needs {} ranks, and there are {n}",
            dp * tp
        )));
    }
    let rank = comm.rank();
    let (row, column) = (rank / tp, rank % tp);
    let group = |color: usize, key: usize| {
        let group = comm.split(color as i32, key as i32)?;
        group.ok_or_else(|| CommError::Usage("split gives no group only for NO_COLOR".into()))
    };
    // The same splits in the same order on every rank: rows first, then columns.
    let tp_group = group(row, column)?;
    let dp_group = group(column, row)?;
    Ok(Mesh {
        dp: dp_group,
        tp: tp_group,
    })
}
