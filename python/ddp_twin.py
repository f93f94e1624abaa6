"""The PyTorch twin of example 06: the same model trained by torch's DistributedDataParallel on
Gloo, from the same initial weights on the same batches, which the Rust run wrote with --dump.

    target/release/06-ddp-training -n 2 --iters 30 --dump target/ddp-twin
    torchrun --standalone --nproc_per_node=2 python/ddp_twin.py target/ddp-twin

Rank 0 compares torch's loss curve with ours step by step, and the final weights, and exits
with 1 when they differ by more than the tolerance (see TOLERANCE).
"""

import gc
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# Two implementations of the same float32 arithmetic (torch's matmul and tanh vs matrixmultiply
# and Rust's), summing in different orders: their losses differ in the last bits, and 30 steps
# of SGD with momentum carry that a little further. Measured: 1.3e-7 relative over 30 steps on
# 2 ranks; allowed 1e-5, far below what one wrong sample or a missed bucket would move (1e-2).
TOLERANCE = 1e-5


class ByteMLP(torch.nn.Module):
    """Example 06's model: parameters in the same order and layout ([in, out], x @ w + b)."""

    def __init__(self, cfg, flat):
        super().__init__()
        c, d, h = cfg["context"], cfg["embed"], cfg["hidden"]
        shapes = [("emb", (256, d)), ("w1", (c * d, h)), ("b1", (h,)), ("w2", (h, h)),
                  ("b2", (h,)), ("w3", (h, 256)), ("b3", (256,))]
        at = 0
        for name, shape in shapes:
            n = torch.Size(shape).numel()
            self.register_parameter(name, torch.nn.Parameter(flat[at:at + n].reshape(shape).clone()))
            at += n
        assert at == flat.numel(), "init.bin is not this shape's parameters"

    def forward(self, x):
        e = self.emb[x].reshape(x.shape[0], -1)  # the context bytes' rows, side by side
        h1 = torch.tanh(e @ self.w1 + self.b1)
        h2 = torch.tanh(h1 @ self.w2 + self.b2)
        return h2 @ self.w3 + self.b3


def floats(path):
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.float32)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: torchrun --standalone --nproc_per_node=N python/ddp_twin.py DIR "
                 "(DIR: what 06-ddp-training --dump DIR wrote)")
    run = sys.argv[1]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    with open(os.path.join(run, "config.json")) as f:
        cfg = json.load(f)
    if world != cfg["world"]:
        sys.exit(f"{run} was written by {cfg['world']} ranks: run {cfg['world']}, not {world}")
    c, b, steps = cfg["context"], cfg["batch"], cfg["iters"]
    with open(os.path.join(run, f"batches-rank{rank}.bin"), "rb") as f:
        batches = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
    batches = batches.long().reshape(steps, b, c + 1)

    # DDP broadcasts rank 0's weights at construction, buckets the gradients (one bucket in the
    # first step, then rebuilt in the order they became ready, bucket_cap_mb as ours) and
    # all-reduces each bucket during backward.
    model = DDP(ByteMLP(cfg, floats(os.path.join(run, "init.bin"))),
                bucket_cap_mb=cfg["bucket_bytes"] / 2**20)
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
    losses = []
    for step in range(steps):
        x, y = batches[step, :, :c], batches[step, :, c]
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()  # DDP's hooks all-reduce the buckets here
        opt.step()
        mean = loss.detach() / world  # the global batch's loss, as ours prints it
        dist.all_reduce(mean)
        losses.append(mean.item())

    ok = True
    if rank == 0:
        with open(os.path.join(run, "losses.txt")) as f:
            ours = [float(line) for line in f]
        worst = max(abs(t - o) / abs(o) for t, o in zip(losses, ours))
        for step in range(0, steps, max(1, steps // 6)):
            print(f"step {step:>4}  loss: ours {ours[step]:.6f}  torch {losses[step]:.6f}")
        final = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
        weights = (final - floats(os.path.join(run, "final.bin"))).abs().max().item()
        ok = len(ours) == steps and worst < TOLERANCE
        print(f"twin: {steps} steps on {world} ranks (torch {torch.__version__}, DDP on gloo): "
              f"worst relative loss difference {worst:.1e}, largest weight difference "
              f"{weights:.1e} (tolerance {TOLERANCE:g}): {'same curve' if ok else 'DIFFERENT'}")
    # Every rank is done before any tears down, and DDP (whose reducer holds the process group
    # and its threads) goes first: destroyed after the group, at the interpreter's exit, it can
    # end the process in std::terminate ("terminate called without an active exception").
    dist.barrier()
    del opt, model
    gc.collect()
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
