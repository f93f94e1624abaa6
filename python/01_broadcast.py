"""01 - broadcast: rank 0's tensor is copied to every rank.

    torchrun --standalone --nproc_per_node=4 python/01_broadcast.py

The Rust twin: examples/01-broadcast.rs.
"""

import torch
import torch.distributed as dist

from course import print_grid, say, setup

rank, world_size, local_rank, device = setup()
say(f"Rank {rank} using device: {device}")

# The root holds the data; everyone else starts empty.
value = 42.0 if rank == 0 else 0.0
tensor = torch.full((4,), value, device=device)
print_grid("Before broadcast:", tensor)

dist.broadcast(tensor, src=0)
print_grid("After broadcast:", tensor)
dist.destroy_process_group()
