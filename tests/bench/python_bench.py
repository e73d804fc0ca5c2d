#!/usr/bin/env python3
"""Python against the C++ client on the same workloads, in one run (JSON
lines): 64 and 256 MiB whole-tensor reads (into a preallocated array) and
writes, and the p50 latency of a 4 KiB box, from the tessera package
against 4 daemons, then client_bench's figures and the ratios.

    PYTHONPATH=build/python /usr/bin/python3 tests/bench/python_bench.py \
        --build build [--mib 64 256] [--reps 5]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))


def emit(line):
    print(json.dumps(line), flush=True)


def python_figures(build, mibs, reps, iterations):
    os.environ.setdefault("TESSERA_SERVER_PATH",
                          os.path.join(build, "bin", "tessera-server"))
    import conftest  # the test suite's daemons
    import tessera

    daemons = conftest.Daemons(world=4)
    figures = {}
    try:
        client = tessera.connect(daemons.addresses[0])
        spec = tessera.chunk(0, [f"rank:{r}/cpu" for r in range(4)])
        for mib in mibs:
            rows = mib * (1 << 20) // (1024 * 4)
            data = (np.arange(rows * 1024) % 1000003).astype(
                np.float32).reshape(rows, 1024)
            w = client.create(f"w{mib}", (rows, 1024), spec)
            writes, reads = [], []
            out = np.empty_like(data)
            # In client_bench's order: every write, then every read (reads
            # alternated with writes measured ~15% slower here).
            for _ in range(reps):
                start = time.perf_counter()
                w.write((0, 0), data)
                writes.append(time.perf_counter() - start)
            for _ in range(reps):
                start = time.perf_counter()
                w.read(out=out)
                reads.append(time.perf_counter() - start)
            assert np.array_equal(out, data)
            for op, seconds in (("write", writes), ("read", reads)):
                median = statistics.median(seconds)
                gbps = data.nbytes / median / 1e9
                figures[(op, mib)] = gbps
                emit({"bench": f"python_{op}", "mib": mib,
                      "p50_ms": median * 1e3, "gbps": gbps})
            client.delete(w.name)
        small = client.create("small", (256, 1024), spec, init="ones")
        latencies = []
        for _ in range(iterations):
            start = time.perf_counter()
            small[3:4, 0:1024]  # 4 KiB
            latencies.append(time.perf_counter() - start)
        latencies.sort()
        p50 = latencies[len(latencies) // 2] * 1e6
        figures[("latency", 4096)] = p50
        emit({"bench": "python_region_latency", "bytes": 4096,
              "p50_us": p50,
              "p99_us": latencies[int(len(latencies) * 0.99)] * 1e6})
    except BaseException:
        for rank in range(daemons.world):
            print(f"--- daemon {rank}'s log:\n{daemons.log(rank)}",
                  file=sys.stderr)
        raise
    finally:
        daemons.stop()
    return figures


def cpp_figures(build, mibs, reps, iterations):
    """client_bench's lines for the same transports the Python client takes
    by default (local path for big reads, data plane for a 4 KiB box)."""
    command = [os.path.join(build, "tests", "bench", "client_bench"),
               "--mib", *[str(m) for m in mibs], "--reps", str(reps),
               "--latency-iterations", str(iterations)]
    figures = {}
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(command)} exited with {out.returncode}:\n"
                 f"{out.stdout}\n{out.stderr}")
    for text in out.stdout.splitlines():
        line = json.loads(text)
        if line["bench"] == "client_write" and line["mib"] in mibs:
            figures[("write", line["mib"])] = line["gbps"]
        elif (line["bench"] == "client_read" and line["transport"] == "local"
              and line["mib"] in mibs):
            figures[("read", line["mib"])] = line["gbps"]
        elif (line["bench"] == "client_region_latency"
              and line["transport"] == "data_plane"
              and line["bytes"] == 4096):
            figures[("latency", 4096)] = line["p50_us"]
        else:
            continue
        emit(line)
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--mib", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=2000)
    args = parser.parse_args()
    py = python_figures(args.build, args.mib, args.reps, args.iterations)
    cpp = cpp_figures(args.build, args.mib, args.reps, args.iterations)
    for key in sorted(py, key=str):
        if key not in cpp:
            continue
        op, size = key
        if op == "latency":
            emit({"bench": "python_vs_cpp", "op": "region_latency",
                  "bytes": size, "python_over_cpp": py[key] / cpp[key]})
        else:
            emit({"bench": "python_vs_cpp", "op": op, "mib": size,
                  "python_over_cpp": py[key] / cpp[key]})


if __name__ == "__main__":
    main()
