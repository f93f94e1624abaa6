"""05 - reduce-scatter: the sum over all ranks, cut in blocks; block r lands on rank r.

    torchrun --standalone --nproc_per_node=4 python/05_reduce_scatter.py

The Rust twin: examples/05-reduce-scatter.rs.
"""

import torch
import torch.distributed as dist

from course import print_grid, say, setup

rank, world_size, local_rank, device = setup()
say(f"Rank {rank} using device: {device}")

# world_size blocks of 2 on every rank: 1, 2, 3, ... so each block is told apart.
everything = torch.arange(1, 2 * world_size + 1, dtype=torch.float32, device=device)
mine = torch.zeros(2, device=device)
print_grid("Before reduce-scatter:", everything)

dist.reduce_scatter_tensor(mine, everything, op=dist.ReduceOp.SUM)
print_grid("After reduce-scatter (block r on rank r):", mine)
dist.destroy_process_group()
