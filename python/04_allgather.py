"""04 - all-gather: every rank ends with every rank's block, in rank order.

    torchrun --standalone --nproc_per_node=4 python/04_allgather.py

The Rust twin: examples/04-allgather.rs.
"""

import torch
import torch.distributed as dist

from course import print_grid, say, setup

rank, world_size, local_rank, device = setup()
say(f"Rank {rank} using device: {device}")

# This rank's block, and room for everyone's.
mine = torch.full((2,), rank + 1.0, device=device)
everyone = torch.zeros(2 * world_size, device=device)
print_grid("Before all-gather (each rank's block):", mine)

dist.all_gather_into_tensor(everyone, mine)
print_grid("After all-gather:", everyone)
dist.destroy_process_group()
