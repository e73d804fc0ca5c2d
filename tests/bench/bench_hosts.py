"""Shared by the Python benchmarks that run daemons as real processes:
network-namespace hosts (one veth pair), daemons started on a host, and
iperf3 between two hosts (the limit a wire benchmark is compared with).

Needs root and iproute2 for the hosts, iperf3 for iperf3().
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
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
