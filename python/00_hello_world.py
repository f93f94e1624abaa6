"""00 - hello world: torchrun starts the processes, each joins the process group and says hello.

    torchrun --standalone --nproc_per_node=4 python/00_hello_world.py

The Rust twin: examples/00-hello-world.rs (it prints "cpu" for the backend where this prints
"gloo", and "cpu:RANK" for the device where torch has the one "cpu").
"""

import torch.distributed as dist

from course import say, setup

rank, world_size, local_rank, device = setup()
say(f"Hello from rank {rank} of {world_size} (local rank {local_rank}) on {device} "
    f"with the {dist.get_backend()} backend")
dist.destroy_process_group()
