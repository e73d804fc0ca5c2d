#!/usr/bin/env python3
"""PyTorch 1.13 and Tessera on the same workloads, in one run, as JSON
lines: several interleaved rounds of each, then the medians and the ratio
Tessera/PyTorch per row (throughput ratio; for latency and time rows,
PyTorch's time over Tessera's, so that above 1 always means Tessera wins).

    /usr/bin/python3 tests/bench/compare_torch.py --build build [--rounds 3]

PyTorch side: 4 processes on loopback with gloo and TensorPipe RPC, the
pieces ShardedTensor is made of (torch.distributed._shard itself does not
import under Debian's Python 3.11, a dataclass error in torch 1.13):
  to_here    rank 0 fetches a tensor held by each of ranks 1-3 through an
             RRef (rpc.remote + to_here, what a remote shard is)
  gather     dist.gather of one tensor per rank to rank 0 (gloo)
  write      rank 0 sends a quarter of a tensor to each of ranks 1-3
             (rpc_async, TensorPipe over TCP) and copies its own
  latency    p50 and p99 of a 4 KiB RRef to_here (2000 after 50 warm-ups)
Tessera side: fetch_bench (to_here, gather, 4 KiB to_here p50 and p99
quiet, and with 8 threads spinning in the fetching process: no PyTorch
row, its RPC needs the GIL such threads would contend for) and client_bench (client writes and data-plane reads)
from the build. init_from_local_shards has no PyTorch row here (it needs
torch.distributed._shard); fetch_bench's own figure is printed.

A benchmark, not a test: nothing is asserted; --quick runs one tiny round
(the ctest smoke run).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time


def emit(line):
    print(json.dumps(line), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- PyTorch: one process per rank.

_kept = {}


def _store(key, tensor):
    """Runs on the receiving rank: the write lands in a kept tensor."""
    target = _kept.get(key)
    if target is None or target.shape != tensor.shape:
        target = _kept[key] = tensor.clone()
    else:
        target.copy_(tensor)
    return True


def _seconds(call, reps):
    call()  # warm up
    start = time.perf_counter()
    for _ in range(reps):
        call()
    return (time.perf_counter() - start) / reps


def torch_rank(rank, world, ports, mibs, write_mibs, reps, latency_iters,
               queue):
    try:
        _torch_rank(rank, world, ports, mibs, write_mibs, reps, latency_iters,
                    queue)
    except BaseException as e:  # the parent stops waiting at once
        queue.put(f"rank {rank}: {type(e).__name__}: {e}")
        raise


def _torch_rank(rank, world, ports, mibs, write_mibs, reps, latency_iters,
                queue):
    import torch
    import torch.distributed as dist
    import torch.distributed.rpc as rpc

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(ports[0])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(
                     init_method=f"tcp://127.0.0.1:{ports[1]}",
                     num_worker_threads=8, rpc_timeout=300))
    figures = {}
    for mib in mibs:
        n = mib * (1 << 20) // 4
        if rank == 0:
            rrefs = [rpc.remote(f"w{r}", torch.ones, args=([n],))
                     for r in range(1, world)]
            seconds = _seconds(lambda: [r.to_here() for r in rrefs], reps)
            figures[f"to_here/{mib}"] = (world - 1) * n * 4 / seconds / 1e9
            del rrefs
        dist.barrier()
        mine = torch.ones(n)
        outs = [torch.empty(n) for _ in range(world)] if rank == 0 else None
        seconds = _seconds(lambda: dist.gather(mine, outs, dst=0), reps)
        if rank == 0:
            figures[f"gather/{mib}"] = world * n * 4 / seconds / 1e9
        dist.barrier()
    for mib in write_mibs:
        if rank == 0:
            data = torch.ones(mib * (1 << 20) // 4)
            parts = data.chunk(world)
            local = torch.empty_like(parts[0])

            def write():
                futures = [rpc.rpc_async(f"w{r}", _store,
                                         args=(f"w{mib}", parts[r]))
                           for r in range(1, world)]
                local.copy_(parts[0])
                for f in futures:
                    f.wait()

            seconds = _seconds(write, reps)
            figures[f"write/{mib}"] = data.numel() * 4 / seconds / 1e9
        dist.barrier()
    if rank == 0:
        small = rpc.remote("w1", torch.ones, args=([1024],))  # 4 KiB
        micros = []
        for i in range(latency_iters + 50):
            start = time.perf_counter()
            small.to_here()
            if i >= 50:
                micros.append((time.perf_counter() - start) * 1e6)
        figures["latency/4096"] = statistics.median(micros)
        micros.sort()
        figures["latency_p99/4096"] = micros[int(0.99 * (len(micros) - 1))]
        del small
    dist.barrier()
    rpc.shutdown()
    dist.destroy_process_group()
    if rank == 0:
        queue.put(figures)


def torch_round(mibs, write_mibs, reps, latency_iters, timeout=600):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    ports = (free_port(), free_port())
    procs = [ctx.Process(target=torch_rank,
                         args=(r, 4, ports, mibs, write_mibs, reps,
                               latency_iters, queue))
             for r in range(4)]
    for p in procs:
        p.start()
    try:
        figures = queue.get(timeout=timeout)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    if isinstance(figures, str):
        raise RuntimeError(f"PyTorch side failed: {figures}")
    for p in procs:
        if p.exitcode != 0:
            raise RuntimeError(f"a PyTorch rank exited with {p.exitcode}")
    return figures


# ---- Tessera: the benchmarks of the build.

def run_lines(command):
    out = subprocess.run(command, capture_output=True, text=True,
                         timeout=900)
    if out.returncode != 0:
        sys.exit(f"{' '.join(command)} exited with {out.returncode}:\n"
                 f"{out.stdout}\n{out.stderr}")
    return [json.loads(l) for l in out.stdout.splitlines()
            if l.startswith("{")]


def tessera_round(build, mibs, write_mibs, reps, quick):
    bench = os.path.join(build, "tests", "bench")
    figures = {}
    fetch = [os.path.join(bench, "fetch_bench"), "--shard-mib",
             *map(str, mibs), "--scale-shards", "1000"]
    client = [os.path.join(bench, "client_bench"), "--mib",
              *map(str, write_mibs), "--reps", str(reps)]
    if quick:
        fetch.append("--quick")
        client.append("--quick")
    for line in run_lines(fetch):
        kind = line["bench"]
        if kind == "fetch" and line["mode"] == "to_here":
            figures[f"to_here/{line['shard_mib']}"] = line["gbps"]
        elif kind == "gather":
            figures[f"gather/{line['shard_mib']}"] = line["gbps"]
        elif kind == "fetch_latency" and line["mode"] == "to_here":
            suffix = "" if line["busy_threads"] == 0 else "_busy"
            figures[f"latency/4096{suffix}"] = line["p50_us"]
            figures[f"latency_p99/4096{suffix}"] = line["p99_us"]
        elif kind == "create" and line["op"] == "init_from_local_shards":
            figures["init_from_local_shards/1"] = line["p50_us"]
    for line in run_lines(client):
        if line["bench"] == "client_write" and line["replicas"] == 1:
            figures[f"write/{line['mib']}"] = line["gbps"]
        elif (line["bench"] == "client_read"
              and line["transport"] == "data_plane"):
            figures[f"data_plane_read/{line['mib']}"] = line["gbps"]
    return figures


# Rows: (key, unit, higher is better).
def rows(mibs, write_mibs):
    for mib in mibs:
        yield f"to_here/{mib}", "gbps", True
    for mib in mibs:
        yield f"gather/{mib}", "gbps", True
    for mib in write_mibs:
        yield f"write/{mib}", "gbps", True
    yield "latency/4096", "p50_us", False
    yield "latency_p99/4096", "p99_us", False
    yield "latency/4096_busy", "p50_us", False
    yield "latency_p99/4096_busy", "p99_us", False
    yield "init_from_local_shards/1", "p50_us", False
    for mib in write_mibs:
        yield f"data_plane_read/{mib}", "gbps", True


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--write-mib", type=int, nargs="+",
                        default=[64, 256])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    latency_iters = 2000
    if args.quick:
        args.rounds, args.mib, args.write_mib, args.reps = 1, [1], [4], 1
        latency_iters = 50
    try:
        import torch  # noqa: F401
    except ImportError:
        emit({"bench": "compare_torch", "skipped": "torch is not installed"})
        return 77
    runs = {"pytorch": [], "tessera": []}
    for round_ in range(args.rounds):  # interleaved
        for side in ("pytorch", "tessera"):
            if side == "pytorch":
                got = torch_round(args.mib, args.write_mib, args.reps,
                                  latency_iters)
            else:
                got = tessera_round(args.build, args.mib, args.write_mib,
                                    args.reps, args.quick)
            runs[side].append(got)
            emit({"bench": "compare_torch_round", "round": round_,
                  "side": side, "figures": got})
    for key, unit, higher in rows(args.mib, args.write_mib):
        line = {"bench": "compare_torch", "row": key, "unit": unit}
        medians = {}
        for side in ("pytorch", "tessera"):
            values = [r[key] for r in runs[side] if key in r]
            if values:
                medians[side] = statistics.median(values)
                line[side] = medians[side]
                line[f"{side}_range"] = [min(values), max(values)]
        if len(medians) == 2:
            ratio = (medians["tessera"] / medians["pytorch"] if higher else
                     medians["pytorch"] / medians["tessera"])
            line["tessera_over_pytorch"] = ratio
        emit(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
