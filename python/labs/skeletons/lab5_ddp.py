"""Lab 5 in PyTorch: data-parallel training by hand, three ways. The page:
docs/src/lab5-ddp.md. Check them with

    torchrun --standalone --nproc_per_node=2 python/labs/check.py 5

Every rank has run forward and backward on its own share of the batch; each parameter's .grad
is its own. Make every .grad the mean over all ranks, on every rank; the checker then takes
torch.optim.SGD's step, and compares the loss with torch's DistributedDataParallel.
"""

import torch
import torch.distributed as dist


def naive(model):
    """One all-reduce per parameter: each p.grad summed over the ranks (dist.all_reduce), then
    divided by the number of ranks."""
    raise NotImplementedError("lab 5: write naive DDP")


def flattened(model):
    """One all-reduce of every gradient at once: torch.cat them into one flat tensor, all-reduce
    it, and copy the means back into each p.grad."""
    raise NotImplementedError("lab 5: write flattened DDP")


def bucketed(model, buckets, backward):
    """Bucketed and overlapped, as DDP: each bucket's all-reduce starts while backward goes on.
    `buckets` lists the buckets, each a list of parameters; `backward()` runs the backward pass.
    Before it, register on every parameter p.register_post_accumulate_grad_hook(hook): hook(p)
    runs once p.grad is complete. When every parameter of a bucket is, start its all-reduce with
    dist.all_reduce(flat, async_op=True), which returns at once with a work to .wait() on. After
    backward, wait for each bucket, and put the means into the .grads."""
    raise NotImplementedError("lab 5: write bucketed, overlapped DDP")
