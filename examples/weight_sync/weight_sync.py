#!/usr/bin/python3
"""Weight sync (docs/weight_sync.md): trainers change a GPT-2-shaped model
every step and publish it as one version; readers laid out as a TP=2
inference engine pull only their slices with a read plan made once, and
check every box they hold against the trainers' checksums.

    weight_sync.py all --address HOST:PORT [--steps 5] [--tiny]
    weight_sync.py trainer --rank R --address ... --rendezvous tcp://...
    weight_sync.py reader --rank R --address ...

`all` starts 4 trainer processes (a Gloo group among them to agree on each
version) and 2 reader processes, and exits 0 when both readers verified
the last step. The daemons are started by the caller (run.sh: `tessera
launch --nproc 4 --cpu`).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from typing import Dict, List

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2  # noqa: E402

import tessera  # noqa: E402
import tessera.torch as tt  # noqa: E402

TRAINERS = 4
TP = 2
PREFIX = "gpt2."
CHECK = "gpt2_check"  # checksums of every reader's boxes, and the step


def check_layout(s: gpt2.Shape) -> List[gpt2.Box]:
    """Every reader's boxes, in order: the rows of the checksum tensor."""
    return [box for r in range(TP) for box in gpt2.reader_boxes(s, TP, r)]


def trainer(args: argparse.Namespace) -> None:
    s = gpt2.TINY if args.tiny else gpt2.GPT2_SMALL
    rank = args.rank
    dist.init_process_group("gloo", init_method=args.rendezvous, rank=rank,
                            world_size=TRAINERS)
    client = tessera.connect(args.address, timeout=60)
    torch.manual_seed(0)  # every trainer builds the same model...
    model = gpt2.GPT2(s)
    shapes: Dict[str, tuple] = {}
    chunks: Dict[str, torch.Tensor] = {}
    offsets: Dict[str, tuple] = {}
    for name, value in model.state_dict().items():
        begin, rows = gpt2.row_chunk(value.shape, TRAINERS, rank)
        shapes[name] = tuple(value.shape)
        # ...and keeps only its row chunk of each parameter (as FSDP does).
        chunks[name] = value[begin:begin + rows].clone()
        offsets[name] = (begin,) + (0,) * (value.dim() - 1)
    del model
    boxes = check_layout(s)
    placements = [f"rank:{r}/cpu" for r in range(client.world_size)]

    def layout(name: str, tensor: object) -> tessera.ShardingSpec:
        # Trainer t's rows on daemon t (same host: the local path).
        if name == CHECK:
            return tessera.chunk(0, placements[:1])
        return tessera.chunk(0, placements[:TRAINERS])

    for step in range(args.steps):
        for value in chunks.values():  # a "training step"
            value.mul_(0.999).add_(0.001 * (step + 1))
        # This trainer's share of every reader box's checksum, summed over
        # the trainers: exactly what a reader computes over its box.
        partial = torch.zeros(len(boxes) + 1, dtype=torch.float64)
        for i, (name, at, sizes, _, _) in enumerate(boxes):
            mine = chunks[name]
            common = gpt2.intersect(offsets[name], mine.shape, at, sizes)
            if common is None:
                continue
            lo, n = common
            local = mine[tuple(slice(l - o, l - o + k) for l, o, k in
                               zip(lo, offsets[name], n))]
            partial[i] = gpt2.box_checksum(local, lo)
        dist.all_reduce(partial)
        partial[-1] = step
        parts = dict(chunks)
        if rank == 0:
            parts[CHECK] = partial
        started = time.perf_counter()
        wall_started = time.time()
        if rank == 0:
            group = tt.publish_state_dict(
                client, PREFIX, parts, layout,
                shapes={**shapes, CHECK: partial.shape},
                offsets={**offsets, CHECK: (0,)}, publish=False, empty=True,
                # The trainers' rows cover every element: the daemons need
                # not zero the memory of the version they reuse.
                skip_zeroing=True)
            ids = [group.id]
        else:
            ids = [None]
        dist.broadcast_object_list(ids, src=0)
        if rank != 0:
            tt.publish_state_dict(client, PREFIX, parts, layout,
                                  shapes=shapes, offsets=offsets,
                                  join=ids[0], publish=False)
        dist.barrier()  # every trainer wrote its rows
        if rank == 0:
            numbers = group.publish()
            version = max(numbers.values())
            print(f"trainers: step {step} published as version {version} "
                  f"in {time.perf_counter() - started:.3f} s", flush=True)
            event(args, event="publish", step=step, version=version,
                  start=wall_started, end=time.time())
        dist.barrier()
        time.sleep(args.interval)
    dist.destroy_process_group()


def reader(args: argparse.Namespace) -> None:
    s = gpt2.TINY if args.tiny else gpt2.GPT2_SMALL
    client = tessera.connect(args.address, timeout=60)
    boxes = gpt2.reader_boxes(s, TP, args.rank)
    first = sum(len(gpt2.reader_boxes(s, TP, r)) for r in range(args.rank))
    outs = gpt2.reader_outs(boxes)
    check = torch.empty(len(check_layout(s)) + 1, dtype=torch.float64)
    deadline = time.monotonic() + args.timeout
    while True:  # until the trainers created the tensors
        try:
            client.open(PREFIX + CHECK)
            break
        except tessera.NotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    by_out: Dict[str, list] = {}
    for name, at, sizes, out, where in boxes:
        by_out.setdefault(out, []).append((PREFIX + name, at, sizes, where))
    items = [(sources, outs[out]) for out, sources in by_out.items()]
    items.append((PREFIX + CHECK, (0,), tuple(check.shape), check))
    started = time.perf_counter()
    plan = client.plan_reads(items)
    print(f"reader {args.rank}: plan of {plan.pieces} pieces "
          f"({plan.bytes / 2**20:.1f} MiB a run) in "
          f"{time.perf_counter() - started:.3f} s", flush=True)
    last = 0
    # Every version after the empty one the tensors were created as: those
    # still kept first, then each one as it is published.
    for _ in client.watch(PREFIX + CHECK, timeout=args.timeout, after=1):
        started = time.perf_counter()
        version = plan.run()
        took = time.perf_counter() - started
        event(args, event="read", reader=args.rank, version=version,
              run_s=took, done=time.time(), bytes=plan.bytes,
              new=version > last)
        if version <= last:
            continue
        last = version
        step = int(check[-1])
        bad = []
        for i, (name, at, sizes, out, where) in enumerate(boxes):
            region = outs[out][tuple(slice(w, w + n)
                                     for w, n in zip(where, sizes))]
            mine = gpt2.box_checksum(region, at)
            want = float(check[first + i])
            if abs(mine - want) > 1e-9 * max(1.0, abs(want)):
                bad.append(f"{name} {at}: {mine!r} != {want!r}")
        if bad:
            print(f"reader {args.rank}: version {version} (step {step}): "
                  f"{len(bad)} boxes differ: {bad[:3]}", flush=True)
            sys.exit(1)
        print(f"reader {args.rank}: version {version} (step {step}) read in "
              f"{took:.3f} s: {len(boxes)} boxes match", flush=True)
        if step == args.steps - 1:
            return
    print(f"reader {args.rank}: no version of step {args.steps - 1} within "
          f"{args.timeout} s", flush=True)
    sys.exit(1)


def event(args: argparse.Namespace, **fields: object) -> None:
    """One JSON line for a benchmark (--events FILE), appended."""
    if args.events:
        with open(args.events, "a") as f:
            f.write(json.dumps(fields) + "\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_all(args: argparse.Namespace) -> None:
    me = os.path.abspath(__file__)
    common = ["--address", args.address, "--steps", str(args.steps),
              "--timeout", str(args.timeout),
              "--interval", str(args.interval)] + (
                  ["--tiny"] if args.tiny else []) + (
                  ["--events", args.events] if args.events else [])
    rendezvous = f"tcp://127.0.0.1:{free_port()}"

    def inside(netns: str) -> List[str]:
        return ["ip", "netns", "exec", netns] if netns else []

    procs = [subprocess.Popen(inside(args.reader_netns) +
                              [sys.executable, me, "reader", "--rank", str(r)]
                              + common) for r in range(TP)]
    procs += [subprocess.Popen(inside(args.trainer_netns) +
                               [sys.executable, me, "trainer", "--rank",
                                str(r), "--rendezvous", rendezvous] + common)
              for r in range(TRAINERS)]
    failed = 0
    for p in procs:
        try:
            failed += p.wait(timeout=args.timeout) != 0
        except subprocess.TimeoutExpired:
            failed += 1
    for p in procs:
        if p.poll() is None:
            p.kill()
    if failed:
        sys.exit(f"{failed} of {len(procs)} processes failed")
    print("weight sync: every reader verified every parameter of every "
          "version it read")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("role", choices=["all", "trainer", "reader"])
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--address",
                        default=os.environ.get("TESSERA_ADDRESS",
                                               "127.0.0.1:29600"))
    parser.add_argument("--rendezvous", default="")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--interval", type=float, default=0.0,
                        help="seconds the trainers wait between steps")
    parser.add_argument("--events", default="",
                        help="append JSON events (publishes, reads) here")
    parser.add_argument("--trainer-netns", default="",
                        help="all: run the trainers in this network "
                             "namespace (ip netns exec)")
    parser.add_argument("--reader-netns", default="",
                        help="all: run the readers in this one")
    parser.add_argument("--tiny", action="store_true",
                        help="a 2-layer model of the same structure")
    args = parser.parse_args()
    {"all": run_all, "trainer": trainer, "reader": reader}[args.role](args)


if __name__ == "__main__":
    main()
