"""The PyTorch twin of example 07: the same model, its MLP split over tensor-parallel groups by
hand (a column-parallel first layer and a row-parallel second, Megatron's f and g as autograd
functions), each shard trained by torch's DistributedDataParallel over its data-parallel group,
the groups made by init_device_mesh on Gloo, from the shards, batches and losses the Rust run
wrote with --dump.

    target/release/07-tensor-parallel -n 4 --tp 2 --iters 30 --dump target/tp-twin
    torchrun --standalone --nproc_per_node=4 python/tp_twin.py target/tp-twin

Rank 0 compares torch's loss curve with ours step by step, and each shard's final weights, and
exits with 1 when they differ by more than the tolerance (see TOLERANCE).
"""

import gc
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

# As python/ddp_twin.py's: two implementations of the same float32 arithmetic, summing in
# different orders (here also the tensor-parallel partial sums). Allowed 1e-5 relative, far
# below what a wrong shard, a missed all-reduce or one wrong sample would move (1e-2).
TOLERANCE = 1e-5


class CopyToTensorParallel(torch.autograd.Function):
    """Megatron's f: the identity forward; backward, the sum over the group of each rank's term
    of the gradient at the input (every rank's columns of w1 see the whole input)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's g: forward, the sum over the group of each rank's term of h1 @ w2 (its rows);
    the identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class TensorParallelByteMLP(torch.nn.Module):
    """One shard of example 07's model: emb, w1's and b1's columns, w2's rows, b2, w3, b3 (the
    order and layout of the Rust shard: [in, out], x @ w + b)."""

    def __init__(self, cfg, tp, flat, group):
        super().__init__()
        c, d, h = cfg["context"], cfg["embed"], cfg["hidden"]
        w = h // tp
        shapes = [("emb", (256, d)), ("w1", (c * d, w)), ("b1", (w,)), ("w2", (w, h)),
                  ("b2", (h,)), ("w3", (h, 256)), ("b3", (256,))]
        at = 0
        for name, shape in shapes:
            n = torch.Size(shape).numel()
            self.register_parameter(name, torch.nn.Parameter(flat[at:at + n].reshape(shape).clone()))
            at += n
        assert at == flat.numel(), "init.bin is not this shard's parameters"
        self.group = group

    def forward(self, x):
        e = self.emb[x].reshape(x.shape[0], -1)
        e = CopyToTensorParallel.apply(e, self.group)
        h1 = torch.tanh(e @ self.w1 + self.b1)  # column-parallel: my slice of the layer
        z2 = ReduceFromTensorParallel.apply(h1 @ self.w2, self.group)  # row-parallel
        h2 = torch.tanh(z2 + self.b2)
        return h2 @ self.w3 + self.b3


def floats(path):
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.float32)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: torchrun --standalone --nproc_per_node=N python/tp_twin.py DIR "
                 "(DIR: what 07-tensor-parallel --dump DIR wrote)")
    run = sys.argv[1]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    with open(os.path.join(run, "tp0", "config.json")) as f:
        cfg = json.load(f)
    tp = len([d for d in os.listdir(run) if d.startswith("tp")])
    dp = cfg["world"]
    if world != dp * tp:
        sys.exit(f"{run} was written by {dp * tp} ranks (dp {dp} x tp {tp}): run that many")
    # The ranks in a dp x tp grid, row-major: tp groups of consecutive ranks, as the Rust mesh.
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    i, j = mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank()
    shard_dir = os.path.join(run, f"tp{j}")
    c, b, steps = cfg["context"], cfg["batch"], cfg["iters"]
    with open(os.path.join(shard_dir, f"batches-rank{i}.bin"), "rb") as f:
        batches = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
    batches = batches.long().reshape(steps, b, c + 1)

    shard = TensorParallelByteMLP(cfg, tp, floats(os.path.join(shard_dir, "init.bin")),
                                  mesh["tp"].get_group())
    model = DDP(shard, process_group=mesh["dp"].get_group(),
                bucket_cap_mb=cfg["bucket_bytes"] / 2**20)
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
    losses = []
    for step in range(steps):
        x, y = batches[step, :, :c], batches[step, :, c]
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()  # tp's all-reduce of the input gradient, dp's buckets
        opt.step()
        mean = loss.detach() / dp
        dist.all_reduce(mean, group=mesh["dp"].get_group())
        losses.append(mean.item())

    # Each shard's final weights against the Rust run's (dp rank 0 of each tp rank wrote them).
    final = torch.cat([p.detach().reshape(-1) for p in shard.parameters()])
    weights = torch.tensor((final - floats(os.path.join(shard_dir, "final.bin"))).abs().max().item())
    dist.all_reduce(weights, op=dist.ReduceOp.MAX)
    ok = True
    if dist.get_rank() == 0:
        with open(os.path.join(run, "tp0", "losses.txt")) as f:
            ours = [float(line) for line in f]
        worst = max(abs(t - o) / abs(o) for t, o in zip(losses, ours))
        for step in range(0, steps, max(1, steps // 6)):
            print(f"step {step:>4}  loss: ours {ours[step]:.6f}  torch {losses[step]:.6f}")
        ok = len(ours) == steps and worst < TOLERANCE
        print(f"twin: {steps} steps on dp {dp} x tp {tp} (torch {torch.__version__}, "
              f"init_device_mesh, column/row-parallel MLP, DDP over dp, gloo): worst relative "
              f"loss difference {worst:.1e}, largest weight difference {weights.item():.1e} "
              f"(tolerance {TOLERANCE:g}): {'same curve' if ok else 'DIFFERENT'}")
    # As ddp_twin.py: every rank done, DDP gone before the process groups.
    dist.barrier()
    del opt, model
    gc.collect()
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
