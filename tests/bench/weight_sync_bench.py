#!/usr/bin/python3
"""Weight sync, side by side (docs/weight_sync.md): the example's model
(examples/weight_sync: GPT-2-small shape, 4 trainers holding row chunks, 2
readers of a TP=2 engine) moved every step by

- **tessera**: 4 daemons on this host; the trainers publish one version,
  both readers `plan.run()` (the transports the fetches pick: the local
  path for pieces of shards of 64 KiB or more, the data plane for pieces
  of smaller shards);
- **gloo**: no store: the trainer ranks all-gather each parameter and rank
  0 broadcasts the full state dict to the readers over Gloo
  (torch.distributed, TCP on loopback); the readers slice their boxes.

Per step: the time from the start of the publish (tessera) or of the
all-gather (gloo) to the last reader done. Tessera's bytes moved are the
daemons' read counters (tessera_transfer_bytes_total{direction="read"})
over the steps, against the bytes the readers' plans need.

Prints one JSON object per line; the last holds tessera_step_s, gloo_step_s
(medians), their ratio, bytes_moved and bytes_needed (per step), and the
plan build time (paid once).

With --hosts (root and iproute2; iperf3): the same Tessera run across two
network-namespace hosts joined by one veth pair, the daemons and trainers
on one, the readers on the other (every reader byte over the data plane
across the link), against `iperf3 -R -P 2` between the same two hosts
(the bytes flowing the same way, two streams as the two readers) and
against plain TCP moving as many bytes as both readers read from memory
into touched buffers, over 2 connections (bench_hosts.same_memory_tcp:
iperf3's buffers stay in the cache, the readers' bytes do not).

    python3 tests/bench/weight_sync_bench.py --build BUILD_DIR [--steps 5]
    python3 tests/bench/weight_sync_bench.py --build BUILD_DIR --hosts
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Steps of the run before the measured one: it creates the tensors and
# warms every path, the memory a daemon alternates between included (the
# latest version's and the one kept for reuse: docs/versions.md,
# "Memory"), as a training loop of many steps has.
WARM_STEPS = 3
ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLE = os.path.join(ROOT, "examples", "weight_sync")
sys.path.insert(0, HERE)
from bench_hosts import (Daemons, NetnsPair, free_port, iperf3,  # noqa: E402
                         same_memory_tcp)


def step_bytes(lines: list) -> int:
    """The bytes both readers' plans read in one step (each reader reads
    the same bytes every run)."""
    return sum({e["reader"]: e["bytes"] for e in lines
                if e["event"] == "read"}.values())


def read_bytes(client) -> int:
    """Bytes every daemon served to readers so far."""
    total = 0
    for entry in client.stats():
        for line in (entry["metrics"] or "").splitlines():
            if (line.startswith("tessera_transfer_bytes_total{") and
                    'direction="read"' in line):
                total += int(float(line.rsplit(" ", 1)[1]))
    return total


def tessera_run(args, build: str) -> dict:
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    os.environ.setdefault("TESSERA_SERVER_PATH",
                          os.path.join(build, "bin", "tessera-server"))
    import conftest  # the real daemons of the Python tests
    import tessera
    daemons = conftest.Daemons()
    try:
        client = tessera.connect(daemons.addresses[0], timeout=60)
        events = tempfile.NamedTemporaryFile(prefix="tessera-ws-",
                                             suffix=".jsonl", delete=False)
        events.close()
        # A first run (--warm-steps) creates the tensors and warms every
        # path; the measured one starts from there.
        command = [sys.executable, os.path.join(EXAMPLE, "weight_sync.py"),
                   "all", "--address", daemons.addresses[0],
                   "--interval", str(args.interval)] + (
                       ["--tiny"] if args.tiny else [])
        if args.warm_steps > 0:
            subprocess.run(command + ["--steps", str(args.warm_steps)],
                           check=True, stdout=subprocess.DEVNULL, timeout=900)
        before = read_bytes(client)
        subprocess.run(command + ["--steps", str(args.steps), "--events",
                                  events.name], check=True,
                       stdout=subprocess.DEVNULL, timeout=1800)
        after = read_bytes(client)
        with open(events.name) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        os.unlink(events.name)
    finally:
        daemons.stop()
    publishes = {e["version"]: e for e in lines if e["event"] == "publish"}
    reads: dict = {}
    for e in lines:
        if e["event"] == "read" and e["new"]:
            reads.setdefault(e["version"], []).append(e)
    steps = []
    for version, publish in sorted(publishes.items()):
        done = reads.get(version, [])
        if len(done) == 2:  # both readers read this very version
            steps.append(max(r["done"] for r in done) - publish["start"])
    runs = [r["run_s"] for rs in reads.values() for r in rs]
    needed = step_bytes(lines)
    read_count = sum(1 for e in lines if e["event"] == "read")
    return {"steps": steps, "runs": runs,
            "publish_s": [p["end"] - p["start"] for p in publishes.values()],
            "bytes_moved": (after - before) / max(1, read_count / 2),
            "bytes_needed": needed}


def hosts_run(args, build: str) -> dict:
    """Tessera across two netns hosts, and iperf3 between them."""
    server = os.path.join(build, "bin", "tessera-server")
    hosts = NetnsPair()
    daemons = None
    try:
        daemons = Daemons(server, 4, host=hosts.addresses[0],
                          prefix=hosts.exec(0), insecure=True)
        address = daemons.address
        scratch = daemons.scratch
        events = os.path.join(scratch, "events.jsonl")
        command = [sys.executable, os.path.join(EXAMPLE, "weight_sync.py"),
                   "all", "--address", address, "--interval",
                   str(args.interval), "--trainer-netns", hosts.names[0],
                   "--reader-netns", hosts.names[1]] + (
                       ["--tiny"] if args.tiny else [])
        if args.warm_steps > 0:
            subprocess.run(command + ["--steps", str(args.warm_steps)],
                           check=True, stdout=subprocess.DEVNULL, timeout=900)
        subprocess.run(command + ["--steps", str(args.steps), "--events",
                                  events], check=True,
                       stdout=subprocess.DEVNULL, timeout=1800)
        with open(events) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        # iperf3 between the same hosts: the server (with the daemons)
        # sends, the client (with the readers) receives, 2 streams.
        iperf_gbs = iperf3(hosts.addresses[0], streams=2, reverse=True,
                           seconds=5, server_prefix=hosts.exec(0),
                           client_prefix=hosts.exec(1))
        # Plain TCP moving what both readers read in one step, from memory
        # into touched buffers, the same way over 2 connections.
        same_gbs = same_memory_tcp(
            hosts.addresses[0], max(1, -(-step_bytes(lines) // (1 << 20))),
            streams=2, reverse=True, reps=3, server_prefix=hosts.exec(0),
            client_prefix=hosts.exec(1))
    finally:
        if daemons is not None:
            daemons.close()
        hosts.close()
    # Only the versions the trainers published during the measured run:
    # the one still kept from the warm-up run is read by each reader as
    # it starts, at its own time, not by both at once after a publish.
    published = {e["version"] for e in lines if e["event"] == "publish"}
    runs = [e for e in lines if e["event"] == "read" and e["new"] and
            e["version"] in published]
    per_reader = [e["bytes"] / e["run_s"] / 1e9 for e in runs]
    by_version: dict = {}
    for e in runs:
        by_version.setdefault(e["version"], []).append(e)
    both = []
    for rs in by_version.values():
        if len(rs) == 2:
            start = min(r["done"] - r["run_s"] for r in rs)
            both.append(sum(r["bytes"] for r in rs) /
                        (max(r["done"] for r in rs) - start) / 1e9)
    return {"reader_gbs": per_reader, "both_readers_gbs": both,
            "iperf3_gbs": iperf_gbs, "same_memory_gbs": same_gbs}


GLOO_WORKER = r'''
import datetime, os, sys, time, json
import torch, torch.distributed as dist
sys.path.insert(0, os.environ["EXAMPLE"])
import gpt2
rank, world = int(sys.argv[1]), 6
steps, tiny = int(sys.argv[3]), sys.argv[4] == "1"
s = gpt2.TINY if tiny else gpt2.GPT2_SMALL
# Every wait (the store, each collective) ends within the run's budget,
# not after torch's default 30 minutes.
dist.init_process_group("gloo", init_method=sys.argv[2], rank=rank,
                        world_size=world,
                        timeout=datetime.timedelta(seconds=float(sys.argv[5])))
trainers = dist.new_group([0, 1, 2, 3])
fanout = dist.new_group([0, 4, 5])
shapes = gpt2.shapes(s)
if rank < 4:
    torch.manual_seed(0)
    model = gpt2.GPT2(s)
    chunks = {}
    for name, value in model.state_dict().items():
        begin, rows = gpt2.row_chunk(value.shape, 4, rank)
        chunks[name] = value[begin:begin + rows].clone()
    del model
else:
    boxes = gpt2.reader_boxes(s, 2, rank - 4)
    outs = gpt2.reader_outs(boxes)
times = []
for step in range(steps + 1):  # the first one warms up
    dist.barrier()
    start = time.time()
    if rank < 4:
        for name, shape in shapes.items():
            parts = [torch.empty((shape[0] // 4,) + tuple(shape[1:]))
                     for _ in range(4)]
            dist.all_gather(parts, chunks[name].contiguous(), group=trainers)
            if rank == 0:
                dist.broadcast(torch.cat(parts), src=0, group=fanout)
    else:
        full = {}
        for name, shape in shapes.items():
            t = torch.empty(shape)
            dist.broadcast(t, src=0, group=fanout)
            full[name] = t
        for name, at, sizes, out, where in boxes:
            src = full[name][tuple(slice(a, a + n) for a, n in zip(at, sizes))]
            outs[out][tuple(slice(w, w + n)
                            for w, n in zip(where, sizes))].copy_(src)
    done = [None] * world
    dist.all_gather_object(done, time.time())
    if rank == 0 and step > 0:
        times.append(max(done[4:]) - start)
if rank == 0:
    print(json.dumps({"gloo_steps": times}))
dist.destroy_process_group()
'''


def gloo_run(args) -> list:
    """The Gloo baseline's step times. A run that fails or outlasts its
    budget (a worker waiting on a peer that will never come: seen once in
    CI, with other tests starting servers on ephemeral ports meanwhile) is
    killed whole and tried once more on a new port, saying so on stderr."""
    budget = (60 if args.tiny else 300) + (args.steps + 1) * (
        10 if args.tiny else 60)
    env = dict(os.environ, EXAMPLE=EXAMPLE)
    for attempt in (1, 2):
        rendezvous = f"tcp://127.0.0.1:{free_port()}"
        procs = [subprocess.Popen([sys.executable, "-c", GLOO_WORKER, str(r),
                                   rendezvous, str(args.steps),
                                   "1" if args.tiny else "0", str(budget)],
                                  stdout=subprocess.PIPE, text=True, env=env)
                 for r in range(6)]
        deadline = time.monotonic() + budget
        out, failure = "", None
        try:
            for rank, p in enumerate(procs):
                text, _ = p.communicate(
                    timeout=max(1.0, deadline - time.monotonic()))
                out += text
                if p.returncode != 0:
                    failure = f"rank {rank} exited with {p.returncode}"
                    break
        except subprocess.TimeoutExpired:
            failure = f"not done within {budget} s"
        if failure is None:
            return json.loads(re.findall(r"\{.*\}", out)[-1])["gloo_steps"]
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        print(f"weight_sync_bench: gloo baseline attempt {attempt} "
              f"({rendezvous}): {failure}", file=sys.stderr, flush=True)
    raise SystemExit("weight_sync_bench: the gloo baseline failed twice")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--interval", type=float, default=1.0,
                        help="seconds between the trainers' steps, so that "
                             "each step is measured alone")
    parser.add_argument("--hosts", action="store_true",
                        help="across two network-namespace hosts, against "
                             "iperf3 (needs root, iproute2 and iperf3)")
    parser.add_argument("--tiny", action="store_true",
                        help="the example's 2-layer model (a smoke run)")
    parser.add_argument("--warm-steps", type=int, default=WARM_STEPS,
                        help="steps of a first run before the measured one "
                             "(0: none, the measured run starts cold: a "
                             "smoke run)")
    args = parser.parse_args()
    build = os.path.abspath(args.build)
    sys.path.insert(0, os.path.join(build, "python"))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(build, "python")] +
        ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    model = "tiny" if args.tiny else "gpt2-small"
    if args.hosts:
        h = hosts_run(args, build)
        both = statistics.median(h["both_readers_gbs"]) if h[
            "both_readers_gbs"] else None
        print(json.dumps({
            "bench": "weight_sync_hosts", "model": model,
            "transport": "data plane across two netns hosts (one veth)",
            "reader_gbs": h["reader_gbs"],
            "both_readers_gbs": h["both_readers_gbs"],
            "both_readers_gbs_median": both,
            "iperf3_P2_gbs": h["iperf3_gbs"],
            "ratio": both / h["iperf3_gbs"] if both else None,
            "goal_ratio": 0.8,
            "tcp_same_memory_P2_gbs": h["same_memory_gbs"],
            "same_memory_ratio": (both / h["same_memory_gbs"]
                                  if both else None)}), flush=True)
        return
    t = tessera_run(args, build)
    print(json.dumps({"bench": "weight_sync_tessera", "model": model,
                      "transport": "local path / data plane (one host)",
                      "step_s": t["steps"], "plan_run_s": t["runs"],
                      "publish_s": t["publish_s"]}), flush=True)
    g = gloo_run(args)
    print(json.dumps({"bench": "weight_sync_gloo", "model": model,
                      "transport": "gloo tcp (loopback)", "step_s": g}),
          flush=True)
    tessera_step = statistics.median(t["steps"]) if t["steps"] else None
    gloo_step = statistics.median(g)
    print(json.dumps({
        "bench": "weight_sync", "model": model, "steps": args.steps,
        "tessera_step_s": tessera_step, "gloo_step_s": gloo_step,
        "ratio": (tessera_step / gloo_step) if tessera_step else None,
        "goal_ratio": 0.5,
        "bytes_moved": t["bytes_moved"], "bytes_needed": t["bytes_needed"],
        "bytes_ratio": (t["bytes_moved"] / t["bytes_needed"]
                        if t["bytes_needed"] else None),
        "goal_bytes_ratio": 1.05}), flush=True)


if __name__ == "__main__":
    main()
