//! Lab 8 with a bug planted on purpose, to show that the checker catches it and says where: the
//! tensor-parallel groups are strided (every dp-th rank, as `init_device_mesh(..., (tp, dp))`
//! would lay them out) instead of consecutive, and the data-parallel groups with them. On 1 × n
//! and n × 1 the two layouts agree; the first square one, 2 × 2 on 4 ranks, tells them apart.

use comm_core::{CommError, Communicator, Mesh, Result};

/// The solution, but for where the rank sits: row `rank % dp`, column `rank / dp`.
pub fn mesh_groups(comm: &Communicator, dp: usize, tp: usize) -> Result<Mesh> {
    let n = comm.world_size();
    if dp * tp != n {
        return Err(CommError::Usage(format!(
            "a mesh of dp {dp} × tp {tp} needs {} ranks, and there are {n}",
            dp * tp
        )));
    }
    let rank = comm.rank();
    let (row, column) = (rank % dp, rank / dp);
    let group = |color: usize, key: usize| {
        let group = comm.split(color as i32, key as i32)?;
        group.ok_or_else(|| CommError::Usage("split gives no group only for NO_COLOR".into()))
    };
    let tp_group = group(row, column)?;
    let dp_group = group(column, row)?;
    Ok(Mesh {
        dp: dp_group,
        tp: tp_group,
    })
}
