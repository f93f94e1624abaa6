"""Lab 5 with a bug planted on purpose: the naive variant never divides by the number of ranks
(a missing step). The other two are the solution's."""

import importlib.util
import os

import torch.distributed as dist

_spec = importlib.util.spec_from_file_location(
    "lab5_solution", os.path.join(os.path.dirname(__file__), "..", "solutions", "lab5_ddp.py"))
_solution = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_solution)
flattened, bucketed = _solution.flattened, _solution.bucketed


def naive(model):
    """The solution, but the sums stay sums."""
    for p in model.parameters():
        dist.all_reduce(p.grad)

