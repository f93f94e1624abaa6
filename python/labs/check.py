"""The labs' checker for the PyTorch twins of labs 2, 3 and 5, under torchrun on Gloo: each
rank runs your function and torch.distributed's own collective (or, for lab 5, torch's
DistributedDataParallel) on the same inputs, every element is compared, and rank 0 says where
they differ, with both grids, as `cargo lab N` does for the Rust labs.

    torchrun --standalone --nproc_per_node=4 python/labs/check.py 3
    torchrun --standalone --nproc_per_node=4 python/labs/check.py 2 3 --solution

The cases run on the ranks torchrun started (run it with 2, 3, 5 or 8 too). --timeout (seconds,
20 unless given) ends a hang: Gloo's error then names the rank that waited and for whom.
"""

import argparse
import datetime
import gc
import importlib.util
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from course import cell, print_grid, say  # noqa: E402  (python/course.py, beside this folder)

LABS = {
    2: ("binomial-tree broadcast", "lab2_tree_broadcast"),
    3: ("ring all-reduce", "lab3_ring_all_reduce"),
    5: ("DDP by hand", "lab5_ddp"),
}
DTYPES = [(torch.float32, "float"), (torch.float64, "double"), (torch.int32, "int32"),
          (torch.int64, "int64")]
# Lab 5: the largest relative difference allowed between a loss and DDP's.
LOSS_TOLERANCE = 1e-5


class NotWritten(Exception):
    """The lab's function still raises NotImplementedError."""


def load(lab, code):
    """The lab's module from python/labs/ (yours), or its solutions/, skeletons/ or planted/."""
    folder = HERE if code == "yours" else os.path.join(HERE, code + "s" if code != "planted" else code)
    path = os.path.join(folder, LABS[lab][1] + ".py")
    spec = importlib.util.spec_from_file_location(f"{code}_{LABS[lab][1]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def first_hint(lab):
    """The first hint of the lab's page in the book, as `cargo lab` prints it."""
    with open(os.path.join(ROOT, "docs", "src", LABS[lab][1].replace("_", "-") + ".md")) as f:
        page = f.read()
    body = page.split("<summary>Hint", 1)[1].split("</summary>", 1)[1].split("</details>", 1)[0]
    return "\n".join(" ".join(p.split()) for p in body.strip().split("\n\n"))


def yours(function, *args):
    """Runs your function. NotImplementedError: not written yet. Any other error ends this rank
    (torchrun then stops the others), saying where."""
    try:
        return function(*args)
    except NotImplementedError as e:
        raise NotWritten() from e
    except Exception:
        sys.stderr.write(f"error: rank {dist.get_rank()}: your code raised:\n{traceback.format_exc()}")
        sys.stderr.flush()
        os._exit(1)


def agree(got, want, same, headline, element, titles):
    """Compares this rank's `got` with `want` and agrees with every rank; if some rank is wrong,
    rank 0 prints the first wrong rank and element, the two values, and both grids. Whether
    some rank is wrong."""
    world = dist.get_world_size()
    wrong = ~same(got, want)
    count = int(wrong.sum())
    first = int(wrong.nonzero()[0, 0]) if count else -1
    numbers = [torch.zeros(2, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(numbers, torch.tensor([first, count]))
    at = max(first, 0)
    pair = torch.tensor([float(want[at]), float(got[at])] if got.numel() else [0.0, 0.0],
                        dtype=torch.float64)
    values = [torch.zeros(2, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(values, pair)
    bad = [r for r in range(world) if int(numbers[r][0]) >= 0]
    if not bad:
        return False
    if dist.get_rank() == 0:
        r = bad[0]
        ranks = "rank" if len(bad) == 1 else "ranks"
        say(headline)
        say(f"rank {r}, {element} {int(numbers[r][0])}: expected {cell(values[r][0].item())}, "
            f"got {cell(values[r][1].item())} ({int(numbers[r][1])} of {got.numel()} wrong on "
            f"rank {r}; wrong on {ranks} {', '.join(map(str, bad))})")
    print_grid(titles[0], got)
    print_grid(titles[1], want)
    return True


def exactly(got, want):
    return got == want


def collective_cases(lab, module):
    """Labs 2 and 3: every case on these ranks, until one is wrong. Returns (wrong case or None,
    cases in all)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    lengths = {2: [1, 5, 1001], 3: [1, 3, 10, 1001]}[lab]
    roots = range(world) if lab == 2 else [0]
    cases = [(n, root, dtype) for n in lengths for root in roots for dtype in DTYPES]
    for k, (length, root, (dtype, name)) in enumerate(cases):
        generator = torch.Generator().manual_seed(k * 7919 + rank + 1)
        inputs = torch.randint(-50, 50, (length,), generator=generator).to(dtype)
        library, mine = inputs.clone(), inputs.clone()
        if lab == 2:
            dist.broadcast(library, root)
            yours(module.tree_broadcast, mine, root)
        else:
            dist.all_reduce(library)
            yours(module.ring_all_reduce, mine)
        s = "" if length == 1 else "s"
        where = f", root {root}" if lab == 2 else ""
        headline = (f"case {k + 1} of {len(cases)} is wrong: {world} ranks, {length} {name} "
                    f"element{s}, in place{where}")
        if agree(mine, library, exactly, headline, "element", ["Yours:", "The library's:"]):
            return k, len(cases)
    return None, len(cases)


class Net(torch.nn.Module):
    """A small model of three layers, enough for several buckets."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                          torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                          torch.nn.Linear(64, 10))

    def forward(self, x):
        return self.layers(x)


STEPS, LR, MOMENTUM, BUCKET_BYTES = 3, 0.1, 0.9, 8 << 10


def batch(step):
    """This rank's share of step `step`'s batch: 8 samples."""
    generator = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    return torch.randn(8, 32, generator=generator), torch.randint(0, 10, (8,), generator=generator)


def buckets_of(model):
    """DDP's buckets: the parameters last first, a bucket closed once it holds BUCKET_BYTES."""
    buckets, open_bucket, size = [], [], 0
    for p in reversed(list(model.parameters())):
        open_bucket.append(p)
        size += p.numel() * p.element_size()
        if size >= BUCKET_BYTES:
            buckets.append(open_bucket)
            open_bucket, size = [], 0
    return buckets + ([open_bucket] if open_bucket else [])


def mean_loss(loss):
    """The global batch's mean loss, as DDP's runs print it."""
    mean = loss.detach() / dist.get_world_size()
    dist.all_reduce(mean)
    return mean.item()


def ddp_losses():
    """torch's DistributedDataParallel on these ranks: each step's loss."""
    torch.manual_seed(0)
    model = DDP(Net(), bucket_cap_mb=BUCKET_BYTES / 2**20)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(mean_loss(loss))
    dist.barrier()
    del opt, model
    gc.collect()
    return losses


def ddp_variant(name, function, ddp, label):
    """One of lab 5's variants for STEPS steps; whether it is wrong."""
    world = dist.get_world_size()
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    buckets = buckets_of(model)
    for step in range(STEPS):
        x, y = batch(step)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        params = list(model.parameters())
        local = torch.autograd.grad(loss, params, retain_graph=True)
        want = torch.cat([g.reshape(-1) for g in local])
        dist.all_reduce(want)
        want /= world
        if name == "bucketed":
            yours(function, model, buckets, loss.backward)
        else:
            loss.backward()
            yours(function, model)
        got = torch.cat([p.grad.reshape(-1) for p in params])
        scale = float(want.abs().max())
        close = lambda g, w: (g - w).abs() <= 1e-5 * (scale + w.abs())  # noqa: E731
        headline = f"{label} is wrong: {name} on {world} ranks, step {step}: the gradients after your code"
        if agree(got, want, close, headline, "gradient",
                 ["Your mean gradients:", "The mean gradients:"]):
            return True
        opt.step()
        loss = mean_loss(loss)
        relative = abs(loss - ddp[step]) / abs(ddp[step])
        if relative > LOSS_TOLERANCE:
            if dist.get_rank() == 0:
                say(f"{label} is wrong: {name} on {world} ranks, step {step}: loss {loss}, torch's "
                    f"DDP {ddp[step]} (relative difference {relative:.1e}, more than "
                    f"{LOSS_TOLERANCE:.0e})")
            return True
    return False


def ddp_cases(module):
    """Lab 5: each variant against torch's DDP. Returns (wrong case or None, cases in all)."""
    ddp = ddp_losses()
    variants = [("naive", module.naive), ("flattened", module.flattened),
                ("bucketed", module.bucketed)]
    for k, (name, function) in enumerate(variants):
        if ddp_variant(name, function, ddp, f"case {k + 1} of {len(variants)}"):
            return k, len(variants)
    return None, len(variants)


def check(lab, code):
    """Checks one lab; whether it is right."""
    title, stem = LABS[lab]
    module = load(lab, code)
    try:
        wrong, total = (ddp_cases if lab == 5 else lambda m: collective_cases(lab, m))(module)
    except NotWritten:
        if dist.get_rank() == 0:
            say(f"lab {lab} is not written yet: open python/labs/{stem}.py")
            page = LABS[lab][1].replace("_", "-") + ".md"
            say(f"hint 1 (more on the lab's page, docs/src/{page}): {first_hint(lab)}")
        return False
    if wrong is not None:
        if dist.get_rank() == 0:
            say(f"Fix python/labs/{stem}.py and run the check again.")
        return False
    if dist.get_rank() == 0:
        say(f"lab {lab}: {title} — {total} of {total} cases right ({dist.get_world_size()} ranks)")
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("labs", type=int, nargs="+", choices=sorted(LABS), metavar="LAB",
                        help="the labs to check: 2, 3 or 5")
    parser.add_argument("--solution", action="store_true", help="check the reference solution")
    parser.add_argument("--code", choices=["yours", "solution", "skeleton", "planted"],
                        default="yours", help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=20.0,
                        help="seconds a rank waits for another before the check fails")
    args = parser.parse_args()
    code = "solution" if args.solution else args.code
    torch.set_num_threads(1)  # ranks share the cores: one thread each
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    right = all([check(lab, code) for lab in args.labs])
    dist.barrier()
    dist.destroy_process_group()
    # Leave without the interpreter's teardown: a gloo thread still winding down there can end
    # a rank with "terminate called without an active exception" (SIGABRT) after every case
    # passed (seen once in CI). The verdict is printed; flush it and go.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if right else 1)


if __name__ == "__main__":
    main()
