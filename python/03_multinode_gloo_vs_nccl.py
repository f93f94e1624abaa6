"""03 - the course's multi-node lesson: the same all-reduce over Gloo (CPU-mediated) and over
NCCL (GPU-direct), timed. The course has two scripts, before_multinode_gloo.py and
after_multinode_nccl.py; this is both in one run, as examples/03-multinode-gloo-vs-nccl.rs is.

    torchrun --standalone --nproc_per_node=2 python/03_multinode_gloo_vs_nccl.py --size-mb 8

or one process per node, started by hand with the course's flags:

    python python/03_multinode_gloo_vs_nccl.py --world_size 2 --rank 0 --master_addr 10.0.0.1 --master_port 29502

Rank 0 prints the course's line for each half, "Rank 0 (Gloo): all-reduce 100 MB took ... ms",
with the median of the timed iterations and the bus bandwidth, as the Rust example does. An
iteration counts as long as the slowest rank took. Without CUDA the NCCL half is skipped.
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist


def arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=int, default=100, help="megabytes (10^6 bytes) of float32")
    parser.add_argument("--iters", type=int, default=10, help="timed iterations")
    parser.add_argument("--warmup", type=int, default=3, help="untimed iterations first")
    # The course's flags, to start each rank by hand (under torchrun its variables say this).
    parser.add_argument("--world_size", "--world-size", type=int)
    parser.add_argument("--rank", type=int)
    parser.add_argument("--master_addr", "--master-addr", default="127.0.0.1")
    parser.add_argument("--master_port", "--master-port", type=int, default=29502)
    return parser.parse_args()


def timed(args, group, gloo, device):
    """Median seconds of one all-reduce, each iteration counting as the slowest rank's."""
    data = torch.ones(args.size_mb * 250_000, device=device)
    times = []
    for i in range(args.warmup + args.iters):
        dist.barrier(group=gloo)  # not timed: every rank starts the iteration together
        start = time.perf_counter()
        dist.all_reduce(data, group=group)  # on Gloo a CUDA tensor goes to the host and back
        if data.is_cuda:
            torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=gloo)
    return statistics.median(slowest.tolist()), data.numel() * 4


def report(args, label, seconds, nbytes):
    """Rank 0 prints the course's line, with the median and the bus bandwidth."""
    n = dist.get_world_size()
    busbw = nbytes / seconds * 2 * (n - 1) / n / 1e9
    if dist.get_rank() == 0:
        print(f"Rank 0 ({label}): all-reduce {args.size_mb} MB took {seconds * 1e3:.2f} ms "
              f"(median of {args.iters}, busbw {busbw:.2f} GB/s)", flush=True)


def main():
    args = arguments()
    if args.rank is not None:  # by hand, as the course starts its scripts
        init = dict(init_method=f"tcp://{args.master_addr}:{args.master_port}",
                    rank=args.rank, world_size=args.world_size)
    else:  # under torchrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
        init = {}
    cuda = torch.cuda.is_available()
    if cuda:
        rank = args.rank if args.rank is not None else int(os.environ["RANK"])
        device = f"cuda:{rank % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", **init)
        gloo = dist.new_group(backend="gloo")  # the same ranks, the CPU way
    else:
        device = "cpu"
        torch.set_num_threads(1)
        dist.init_process_group("gloo", **init)
        gloo = dist.group.WORLD

    gloo_time, nbytes = timed(args, gloo, gloo, device)  # before_multinode_gloo.py
    report(args, "Gloo", gloo_time, nbytes)
    if cuda:
        nccl_time, nbytes = timed(args, None, gloo, device)  # after_multinode_nccl.py
        report(args, "NCCL", nccl_time, nbytes)
        if dist.get_rank() == 0:
            print(f"NCCL was {gloo_time / nccl_time:.1f}x faster than the CPU path")
    elif dist.get_rank() == 0:
        print("Rank 0 (NCCL): skipped: torch.cuda.is_available() is False")
    dist.barrier(group=gloo)  # every rank is done before any tears its groups down
    dist.destroy_process_group()


# In a function, so that no process group outlives destroy_process_group in a global: one left
# for the interpreter's exit to destroy aborted the process now and then ("terminate called").
if __name__ == "__main__":
    main()
