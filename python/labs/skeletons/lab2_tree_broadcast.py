"""Lab 2 in PyTorch: broadcast as a binomial tree, from send and recv. The page:
docs/src/lab2-tree-broadcast.md. Check it with

    torchrun --standalone --nproc_per_node=4 python/labs/check.py 2
"""

import torch.distributed as dist


def tree_broadcast(tensor, root):
    """Copies `root`'s `tensor` into every rank's `tensor`, in place, as a binomial tree: in
    round 1 the root sends to one rank; in each later round every rank that has the data sends
    it to one rank that has not. Any root, any number of ranks.

    Use only dist.get_rank(), dist.get_world_size(), dist.send(tensor, dst) and
    dist.recv(tensor, src)."""
    raise NotImplementedError("lab 2: write the tree broadcast")
