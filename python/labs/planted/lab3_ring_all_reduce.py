"""Lab 3 with a bug planted on purpose: the reduce-scatter stops one step short (a missing
step)."""

import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    """The solution, but for the reduce-scatter's last step."""
    n, rank, length = dist.get_world_size(), dist.get_rank(), tensor.numel()
    nxt, prev = (rank + 1) % n, (rank - 1) % n

    def block(b):
        b %= n
        return tensor[b * length // n:(b + 1) * length // n]

    def step(out, into):
        requests = [dist.isend(out, nxt), dist.irecv(into, prev)]
        for request in requests:
            request.wait()

    for s in range(1, n - 1):
        mine = block(rank - s - 1)
        arrived = torch.empty_like(mine)
        step(block(rank - s), arrived)
        mine += arrived
    for s in range(1, n):
        step(block(rank + 1 - s), block(rank - s))
