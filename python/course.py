"""What the course's scripts share: joining the job torchrun started, one device per rank, and
the grids rank 0 prints, laid out as our Rust examples print them (comm_core::grid).

    Before broadcast:
           ---------------------
    Gpu 0  | 42 | 42 | 42 | 42 |
           ---------------------

On GPUs the backend is NCCL and rank r uses cuda:{r % GPUs}, as the course writes it; without
CUDA it is Gloo on CPU tensors.
"""

import os
import sys

import torch
import torch.distributed as dist

# Longer rows show their first and last cells around "...", as ours do.
MAX_CELLS = 8
END_CELLS = 3


def setup():
    """Joins the job (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from torchrun) and picks this
    rank's device; returns (rank, world_size, local_rank, device)."""
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if torch.cuda.is_available():
        device = f"cuda:{rank % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    else:
        device = "cpu"
        torch.set_num_threads(1)  # ranks share the cores: one thread each
        dist.init_process_group("gloo")
    return rank, dist.get_world_size(), local_rank, device


def say(line):
    """Prints a line in one write: the workers of a node share torchrun's stdout, and print()
    writes the newline apart, so another rank's line could land between the two."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def cell(value):
    """42.0 as "42", 1.5 as "1.5": as Rust prints an f32."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def cells(values):
    if len(values) <= MAX_CELLS:
        return [cell(v) for v in values]
    ends = values[:END_CELLS], values[-END_CELLS:]
    return [cell(v) for v in ends[0]] + ["..."] + [cell(v) for v in ends[1]]


def render(title, rows):
    """The grid as text: the title, a small table per rank labelled "Gpu r", a blank line."""
    shown = [cells(r) for r in rows]
    width = max([2] + [len(c) for r in shown for c in r])
    label_width = len(f"Gpu {len(rows) - 1}") + 2
    out = [title]
    for rank, (row, row_cells) in enumerate(zip(rows, shown)):
        line = "|" + "|".join(f" {c:<{width}} " for c in row_cells) + "|"
        if len(row) > MAX_CELLS:
            line += f"  ({len(row)} elements)"
        rule = " " * label_width + "-" * (len(row_cells) * (width + 3) + 1)
        out += [rule, f"{f'Gpu {rank}':<{label_width}}{line}", rule]
    return "\n".join(out) + "\n\n"


def print_grid(title, tensor):
    """Every rank calls it: rank 0 gathers every rank's tensor and prints the grid in one write."""
    rows = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, tensor)
    if dist.get_rank() == 0:
        say(render(title, [r.tolist() for r in rows]).rstrip("\n") + "\n")
