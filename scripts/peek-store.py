#!/usr/bin/env python3
"""peek-store.py - look inside a running job's rendezvous store with PyTorch's own client.

Our ranks meet at a store that speaks c10d's TCPStore protocol, so torch.distributed.TCPStore
can read it like any PyTorch job's. This prints what the job keeps there: its run id and world
size, which process holds each rank, and every key a rank set (the job's index, `job/keys`), with
who set it and what it holds now.

Usage:
  python scripts/peek-store.py HOST PORT [--wait-for N] [--prefix PREFIX]

  HOST PORT     where the store is (MASTER_ADDR and MASTER_PORT of the job)
  --wait-for N  first wait (up to --timeout) until ranks 0..N-1 have joined
  --prefix P    the job's namespace: /worker/attempt_<n> under torchrun's agent store
                (its TORCHELASTIC_RESTART_COUNT), none when rank 0 serves the store

Needs torch (scripts/torch-env.sh install, then source its bin/activate).
"""

import argparse
import string
import sys
from datetime import timedelta


def shown(value: bytes) -> str:
    """A value as text when it is text, else its size and first bytes (an NCCL Id is 128 bytes
    of binary)."""
    text = value.decode("utf-8", errors="replace")
    if all(c in string.printable for c in text) and "\ufffd" not in text:
        return repr(text) if len(text) <= 60 else repr(text[:57] + "...")
    return f"{len(value)} bytes: {value[:8].hex()}..."


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--wait-for", type=int, default=0, metavar="N")
    parser.add_argument("--prefix", default="")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS")
    args = parser.parse_args()

    import warnings

    warnings.filterwarnings("ignore")  # torch's import warns of a missing numpy, which we need not
    import torch.distributed as dist

    timeout = timedelta(seconds=args.timeout)
    try:
        store = dist.TCPStore(args.host, args.port, is_master=False, timeout=timeout)
    except Exception as e:  # torch raises several kinds; all mean "no store there"
        print(f"peek-store: no store at {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    if args.prefix:
        store = dist.PrefixStore(args.prefix, store)

    def value(key):
        return store.get(key) if store.check([key]) else None

    if args.wait_for:
        store.wait([f"job/rank/{r}" for r in range(args.wait_for)], timeout)

    world = value("job/world_size")
    if world is None:
        print("peek-store: no job/world_size here: not one of our jobs, or another --prefix",
              file=sys.stderr)
        return 1
    world = int(world)
    print(f"store at {args.host}:{args.port}{' under ' + args.prefix if args.prefix else ''}: "
          f"{store.num_keys()} keys in all")
    run_id = value("job/run_id")
    print(f"  job/run_id         {shown(run_id) if run_id is not None else '(none: ranks started by hand)'}")
    print(f"  job/world_size     {world}")
    for rank in range(world):
        holder = value(f"job/rank/{rank}")
        print(f"  job/rank/{rank:<9} {shown(holder) if holder is not None else '(not joined yet)'}")
    aborted = value("job/abort")
    if aborted is not None:
        print(f"  job/abort          {shown(aborted)}")

    index = value("job/keys") or b""
    print("keys the ranks set (job/keys), oldest first:")
    seen = set()
    for line in index.decode().splitlines():
        rank, key = line.split(" ", 1)
        if key in seen:
            continue
        seen.add(key)
        now = value(key)
        print(f"  {key:<32} by rank {rank}: {shown(now) if now is not None else '(deleted since)'}")
    nccl_ids = sorted(k for k in seen if k.endswith("/nccl/id"))
    if nccl_ids:
        print(f"NCCL's unique Id: {', '.join(nccl_ids)}")
    else:
        print("NCCL's unique Id: none yet (it is comm<N>/nccl/id once a rank 0 on NCCL sets it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
