"""Lab 2 with a bug planted on purpose: the tree is always rooted at rank 0 (a wrong root)."""

import torch.distributed as dist


def tree_broadcast(tensor, root):
    """The solution, but for the root."""
    n, me = dist.get_world_size(), dist.get_rank()
    reach = 1
    while reach < n:
        if me < reach and me + reach < n:
            dist.send(tensor, me + reach)
        elif reach <= me < 2 * reach:
            dist.recv(tensor, me - reach)
        reach *= 2
