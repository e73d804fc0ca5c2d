"""Shared by the Python benchmarks that run daemons as real processes:
network-namespace hosts (one veth pair), daemons started on a host, and
the limits a wire benchmark is compared with: iperf3 between two hosts,
and plain sockets moving the same bytes between the same kinds of memory
(same_memory_tcp).

Needs root and iproute2 for the hosts, iperf3 for iperf3().

    python3 bench_hosts.py tcp ...   (a role of same_memory_tcp)
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NetnsPair:
    """Two network namespaces joined by one veth pair (10.214.N.1 and .2),
    loopback up in each; removed by close()."""

    def __init__(self) -> None:
        n = os.getpid() % 200 + 20
        self.names = [f"tws{os.getpid()}a", f"tws{os.getpid()}b"]
        self.addresses = [f"10.214.{n}.1", f"10.214.{n}.2"]
        ends = [f"twsa{os.getpid() % 100000}", f"twsb{os.getpid() % 100000}"]
        self._ip("link", "add", ends[0], "type", "veth", "peer", "name",
                 ends[1])
        for ns, end, address in zip(self.names, ends, self.addresses):
            self._ip("netns", "add", ns)
            self._ip("link", "set", end, "netns", ns)
            self._ip("-n", ns, "addr", "add", f"{address}/24", "dev", end)
            self._ip("-n", ns, "link", "set", end, "up")
            self._ip("-n", ns, "link", "set", "lo", "up")

    @staticmethod
    def _ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    def exec(self, host: int) -> list:
        return ["ip", "netns", "exec", self.names[host]]

    def close(self) -> None:
        for ns in self.names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


class Daemons:
    """`world` tessera-server processes on one host (`prefix`: the command
    that runs a process there, [] for this one), listening on `host`;
    insecure (open) when `insecure`, else in the default per-user token
    mode. address is rank 0's; scratch holds their address files and is
    their checkpoint root. close() stops them and removes scratch."""

    def __init__(self, server: str, world: int, host: str = "127.0.0.1",
                 prefix: Optional[list] = None, insecure: bool = False,
                 extra: Optional[list] = None) -> None:
        self.scratch = tempfile.mkdtemp(prefix="tessera-bench-")
        self.procs = []
        master = free_port()
        for rank in range(world):
            self.procs.append(subprocess.Popen(
                (prefix or []) + [
                    server, "--rank", str(rank), "--world-size", str(world),
                    "--master-addr", host, "--master-port", str(master),
                    "--host", host, "--port", "0", "--local-rank", str(rank),
                    "--local-world-size", str(world), "--device", "cpu",
                    "--log-level", "warn",
                    "--address-file", os.path.join(self.scratch, f"rank{rank}"),
                    "--checkpoint-root", self.scratch] +
                (["--insecure"] if insecure else []) + (extra or []),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        for rank in range(world):
            path = os.path.join(self.scratch, f"rank{rank}")
            while not (os.path.exists(path) and open(path).read().strip()):
                if time.monotonic() > deadline:
                    self.close()
                    raise SystemExit("the daemons did not start")
                time.sleep(0.1)
        self.address = open(os.path.join(self.scratch, "rank0")).read().strip()

    def close(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.scratch, ignore_errors=True)


def iperf3(address: str, streams: int = 1, reverse: bool = False,
           seconds: float = 4, length: Optional[str] = None,
           server_prefix: Optional[list] = None,
           client_prefix: Optional[list] = None) -> float:
    """GB/s received by `streams` iperf3 streams between a server on
    `address` (run under server_prefix) and a client (under client_prefix);
    with `reverse` the server sends (-R), as a daemon does to a reader."""
    port = str(free_port())
    server = subprocess.Popen((server_prefix or []) +
                              ["iperf3", "-s", "-1", "-p", port],
                              stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.4)
        command = (client_prefix or []) + [
            "iperf3", "-c", address, "-p", port, "-P", str(streams),
            "-t", str(seconds), "-J"]
        if reverse:
            command.append("-R")
        if length:
            command += ["-l", length]
        result = subprocess.run(command, check=True, capture_output=True,
                                text=True, timeout=seconds + 30)
        return json.loads(result.stdout)["end"]["sum_received"][
            "bits_per_second"] / 8e9
    finally:
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


# The bytes of one send or receive call of same_memory_tcp (iperf3 -l 1M).
_PIECE_BYTES = 1 << 20


def same_memory_tcp(address: str, mib: int, streams: int = 1,
                    reverse: bool = False, reps: int = 5,
                    server_prefix: Optional[list] = None,
                    client_prefix: Optional[list] = None) -> float:
    """GB/s (median of `reps`) of plain TCP moving `mib` MiB from a memory
    file (as a daemon's shard is held) into a touched buffer of the same
    size (as a reader's `out`), cut into `streams` connections, between a
    listener on `address` (under server_prefix) and a client (under
    client_prefix); with `reverse` the listener sends, as a daemon does to
    a reader. The ceiling of a transfer of those bytes over those sockets:
    unlike iperf3, whose 1 MiB buffers stay in the cache, every byte here
    is read from and written to memory, as Tessera's are."""
    port = str(free_port())
    common = ["--mib", str(mib), "--streams", str(streams),
              "--reps", str(reps), "--port", port, "--address", address]
    me = [sys.executable, os.path.abspath(__file__), "tcp"]
    listener = subprocess.Popen(
        (server_prefix or []) + me + common +
        ["--listen", "--send" if reverse else "--recv"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if listener.stdout.readline().strip() != "listening":
            raise RuntimeError("same_memory_tcp: the listener failed: " +
                               listener.stderr.read())
        client = subprocess.run(
            (client_prefix or []) + me + common +
            ["--recv" if reverse else "--send"],
            capture_output=True, text=True, timeout=600)
        if client.returncode != 0:
            raise RuntimeError(f"same_memory_tcp: {client.stderr}")
        out, err = listener.communicate(timeout=600)
        if listener.returncode != 0:
            raise RuntimeError(f"same_memory_tcp: {err}")
        lines = (client.stdout if reverse else out).strip().splitlines()
        return json.loads(lines[-1])["gbs"]
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.wait()


def _tcp_role(argv: list) -> None:
    """One end of same_memory_tcp: connects `streams` sockets (or accepts
    them), then per rep the receiver asks every stream for its part and
    times until every byte landed; it prints {"gbs": median}."""
    import numpy
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, required=True)
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--reps", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--listen", action="store_true")
    side = parser.add_mutually_exclusive_group(required=True)
    side.add_argument("--send", action="store_true")
    side.add_argument("--recv", action="store_true")
    args = parser.parse_args(argv)
    size = args.mib << 20
    if args.send:
        fd = os.memfd_create("same_memory_tcp")
        os.ftruncate(fd, size)
        buffer = mmap.mmap(fd, size)
        os.close(fd)
        buffer.write(b"\x01" * size)
    else:
        buffer = numpy.ones(size, dtype=numpy.uint8)
    view = memoryview(buffer)
    parts = [(k * size // args.streams, (k + 1) * size // args.streams)
             for k in range(args.streams)]
    sockets = [None] * args.streams
    if args.listen:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((args.address, args.port))
        server.listen(args.streams)
        print("listening", flush=True)
        for _ in range(args.streams):
            connection, _ = server.accept()
            sockets[connection.recv(1)[0]] = connection
        server.close()
    else:
        for k in range(args.streams):
            sockets[k] = socket.create_connection((args.address, args.port))
            sockets[k].sendall(bytes([k]))

    def send(k: int) -> None:
        begin, end = parts[k]
        if sockets[k].recv(1) != b"g":
            raise SystemExit("same_memory_tcp: the receiver went away")
        for piece in range(begin, end, _PIECE_BYTES):
            sockets[k].sendall(view[piece:min(piece + _PIECE_BYTES, end)])

    def receive(k: int) -> None:
        begin, end = parts[k]
        while begin < end:
            got = sockets[k].recv_into(view[begin:min(begin + _PIECE_BYTES, end)])
            if got == 0:
                raise SystemExit("same_memory_tcp: the sender went away")
            begin += got

    seconds = []
    for rep in range(-1, args.reps):  # rep -1 warms up
        start = time.perf_counter()
        if args.recv:
            for s in sockets:
                s.sendall(b"g")
        threads = [threading.Thread(target=send if args.send else receive,
                                    args=(k,)) for k in range(args.streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if rep >= 0:
            seconds.append(time.perf_counter() - start)
    for s in sockets:
        s.close()
    if args.recv:
        print(json.dumps({"gbs": size / statistics.median(seconds) / 1e9}))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "tcp":
        _tcp_role(sys.argv[2:])
    else:
        raise SystemExit(__doc__)
