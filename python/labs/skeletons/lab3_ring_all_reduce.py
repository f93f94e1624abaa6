"""Lab 3 in PyTorch: the ring all-reduce, from send and recv. The page: docs/src/lab3-ring-all-reduce.md.
Check it with

    torchrun --standalone --nproc_per_node=4 python/labs/check.py 3
"""

import torch.distributed as dist


def ring_all_reduce(tensor):
    """Sums `tensor` (1-D) over all ranks, in place, as a ring does. Cut it into n blocks
    (block b: elements b*len//n to (b+1)*len//n, some empty when it is shorter than n); n-1
    steps of reduce-scatter, each sending one block to the next rank while the block before it
    arrives from the previous one, and adding it in; then n-1 steps of all-gather.

    Use only dist.get_rank(), dist.get_world_size(), and dist.isend(view, dst) with
    dist.irecv(view, src) (each returns a request: .wait() on both), on views of the tensor
    (tensor[a:b]: a view, sent and received where it lies), and torch.empty_like for a block to
    receive into."""
    raise NotImplementedError("lab 3: write the ring all-reduce")
