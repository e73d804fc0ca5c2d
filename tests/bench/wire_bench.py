#!/usr/bin/python3
"""The wire against its limit (docs/benchmarks.md, "The wire"): one
client reading and writing one daemon's shard over the data plane with 1,
2 and 4 lanes (client/lanes.h), and over gRPC (`tessera bench`), next to
iperf3 between the same two ends on the same run.

- loopback (always): the client and one daemon on this host; the client
  takes the data plane (its local path off, so that every byte crosses a
  socket), against `iperf3 -l 1M` with 1 stream and with 4.
- --hosts (root, iproute2): the daemon on one network-namespace host, the
  client on another, one veth pair between them; reads against
  `iperf3 -R -P N` (the daemon's side sends), writes against
  `iperf3 -P N`, N = 1, 2, 4.

Each Tessera row is the median of --reps transfers of a --mib MiB float32
tensor held whole by the daemon, into (or from) one preallocated buffer;
each ratio is against the limit measured in the same run, named in the
row. Each row also has `same_memory_ratio`: against plain TCP moving the
same --mib MiB from a memory file into a touched buffer over as many
connections as the row's lanes (1 for gRPC) between the same two ends
(bench_hosts.same_memory_tcp, rows "tcp_same_memory"): iperf3's 1 MiB
buffers stay in the cache, a transfer's bytes are read from and written to
memory. Prints one JSON object per line.

    python3 tests/bench/wire_bench.py --build BUILD_DIR [--hosts] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_hosts import (Daemons, NetnsPair, iperf3,  # noqa: E402
                         same_memory_tcp)

COLUMNS = 1024


def client_role(args) -> None:
    """Runs in the client's host: prints one JSON list of measurements."""
    import numpy
    import tessera
    rows = args.mib * (1 << 20) // (4 * COLUMNS)
    setup = tessera.connect(args.address, local_path=False)
    spec = tessera.chunk(0, ["rank:0/cpu"])
    name = f"wire_bench_{os.getpid()}"
    t = setup.create(name, (rows, COLUMNS), spec)
    data = numpy.arange(rows * COLUMNS, dtype=numpy.float32).reshape(
        rows, COLUMNS)
    t.write((0, 0), data)
    out = numpy.zeros_like(data)
    results = []
    for lanes in args.lanes:
        c = tessera.connect(args.address, local_path=False, data_lanes=lanes)
        view = c.open(name)
        for op in ("read", "write"):
            seconds = []
            for rep in range(-1, args.reps):  # rep -1 warms up
                start = time.perf_counter()
                if op == "read":
                    view.read_region((0, 0), (rows, COLUMNS), out=out)
                else:
                    view.write((0, 0), data)
                if rep >= 0:
                    seconds.append(time.perf_counter() - start)
            if op == "read" and not numpy.array_equal(out, data):
                raise SystemExit(f"lanes {lanes}: the bytes read differ")
            median = statistics.median(seconds)
            results.append({"op": op, "lanes": lanes, "seconds": median,
                            "best_s": min(seconds),
                            "gbs": data.nbytes / median / 1e9})
    setup.delete(name)
    print(json.dumps(results))


def run_client(args, address: str, prefix: list) -> list:
    command = prefix + [sys.executable, os.path.abspath(__file__),
                        "--role", "client", "--address", address,
                        "--mib", str(args.mib), "--reps", str(args.reps),
                        "--lanes", *[str(n) for n in args.lanes]]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(args.build, "python") + (
        ":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    result = subprocess.run(command, capture_output=True, text=True,
                            env=env, timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"the client failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_grpc(args, address: str, prefix: list) -> list:
    """The same transfer over gRPC, measured by `tessera bench` (the CLI,
    whose process keeps freed heap memory: io/heap.h) in the client's
    host: its median read and write of one --mib box."""
    cli = os.path.join(args.build, "bin", "tessera")
    result = subprocess.run(
        prefix + [cli, "bench", "-a", address, "--rank", "0", "--lanes", "1",
                  "--sizes", f"{args.mib}MiB", "--reps", str(args.reps),
                  "--json"],
        capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"tessera bench failed:\n{result.stderr}")
    measured = []
    for row in json.loads(result.stdout)["daemons"][0]["rows"]:
        if row["transport"] != "grpc":
            continue
        point = row["points"][0]
        measured.append({"op": row["op"], "lanes": "-",
                         "seconds": point["p50_s"],
                         "gbs": point["bytes"] / point["p50_s"] / 1e9})
    return measured


def print_limits(where: str, limits: dict) -> None:
    """Prints iperf3's rate per direction and stream count."""
    for (op, streams), gbs in sorted(limits.items()):
        print(json.dumps({"bench": "iperf3", "where": where, "direction": op,
                          "streams": streams, "gbs": round(gbs, 3)}))


def measure_same_memory(args, where: str, address: str, streams: list,
                        server_prefix: list = None,
                        client_prefix: list = None) -> dict:
    """same_memory_tcp per direction and stream count, printed; reads: the
    daemon's side (the listener) sends."""
    same = {}
    for n in sorted(set(streams)):
        for op, reverse in (("read", True), ("write", False)):
            same[(op, n)] = same_memory_tcp(
                address, args.mib, streams=n, reverse=reverse,
                reps=args.reps, server_prefix=server_prefix,
                client_prefix=client_prefix)
            print(json.dumps({"bench": "tcp_same_memory", "where": where,
                              "direction": op, "streams": n,
                              "mib": args.mib,
                              "gbs": round(same[(op, n)], 3)}))
    return same


def report(where: str, transport: str, measured: list, limits: dict,
           same: dict, mib: int) -> None:
    """Prints each Tessera row with its ratio against the best limit of its
    direction (reads: the daemon's side sends), and against plain TCP over
    the same memory with as many streams as its lanes."""
    for row in measured:
        direction = {k: v for k, v in limits.items() if k[0] == row["op"]}
        best = max(direction, key=direction.get)
        streams = row["lanes"] if isinstance(row["lanes"], int) else 1
        same_gbs = same[(row["op"], streams)]
        print(json.dumps({
            "bench": f"tessera_{row['op']}", "where": where,
            "transport": transport, "lanes": row["lanes"], "mib": mib,
            "p50_s": round(row["seconds"], 4), "gbs": round(row["gbs"], 3),
            "limit": f"iperf3 {best[1]} stream(s)",
            "limit_gbs": round(direction[best], 3),
            "ratio": round(row["gbs"] / direction[best], 3),
            "same_memory_gbs": round(same_gbs, 3),
            "same_memory_ratio": round(row["gbs"] / same_gbs, 3)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default=os.path.join(
        os.path.dirname(os.path.dirname(HERE)), "build"))
    parser.add_argument("--hosts", action="store_true",
                        help="also across two network-namespace hosts")
    parser.add_argument("--quick", action="store_true",
                        help="a small smoke run for ctest")
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--lanes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--role", choices=["main", "client"], default="main")
    parser.add_argument("--address", default="")
    args = parser.parse_args()
    if args.role == "client":
        client_role(args)
        return
    if args.quick:
        args.mib, args.reps = 32, 1
    seconds = 1 if args.quick else 4
    server = os.path.join(args.build, "bin", "tessera-server")

    daemons = Daemons(server, 1)
    try:
        measured = run_client(args, daemons.address, [])
        grpc = run_grpc(args, daemons.address, [])
    finally:
        daemons.close()
    limits = {("read", n): iperf3("127.0.0.1", streams=n, length="1M",
                                  seconds=seconds) for n in (1, 4)}
    limits.update({("write", n): v for (_, n), v in limits.items()})
    print_limits("loopback", limits)
    same = measure_same_memory(args, "loopback", "127.0.0.1",
                               [1] + args.lanes)
    report("loopback", "data plane (local path off)", measured, limits,
           same, args.mib)
    report("loopback", "grpc (tessera bench)", grpc, limits, same, args.mib)

    if not args.hosts:
        return
    hosts = NetnsPair()
    try:
        daemons = Daemons(server, 1, host=hosts.addresses[0],
                          prefix=hosts.exec(0), insecure=True)
        try:
            measured = run_client(args, daemons.address, hosts.exec(1))
            grpc = run_grpc(args, daemons.address, hosts.exec(1))
        finally:
            daemons.close()
        limits = {}
        for n in (1, 2, 4):
            for op, reverse in (("read", True), ("write", False)):
                limits[(op, n)] = iperf3(
                    hosts.addresses[0], streams=n, reverse=reverse,
                    seconds=seconds, server_prefix=hosts.exec(0),
                    client_prefix=hosts.exec(1))
        where = "two netns hosts, one veth"
        print_limits(where, limits)
        same = measure_same_memory(args, where, hosts.addresses[0],
                                   [1] + args.lanes, hosts.exec(0),
                                   hosts.exec(1))
        report(where, "data plane", measured, limits, same, args.mib)
        report(where, "grpc (tessera bench)", grpc, limits, same, args.mib)
    finally:
        hosts.close()


if __name__ == "__main__":
    main()
