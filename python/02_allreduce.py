"""02 - all-reduce: every rank ends with the sum over all ranks.

    torchrun --standalone --nproc_per_node=4 python/02_allreduce.py

The Rust twin: examples/02-allreduce.rs.
"""

import torch
import torch.distributed as dist

from course import print_grid, say, setup

rank, world_size, local_rank, device = setup()
say(f"Rank {rank} using device: {device}")

tensor = torch.ones(4, device=device)
print_grid("Before reduce:", tensor)

# In place: the sum replaces each rank's ones.
dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
print_grid("After reduce:", tensor)
dist.destroy_process_group()
