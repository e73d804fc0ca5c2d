"""Real daemons for the Python suite: tessera-server processes on loopback
(the path in $TESSERA_SERVER_PATH, set by ctest), each serving its rank,
with a checkpoint root in a temporary directory."""

import os
import signal
import socket
import subprocess
import tempfile
import time

import pytest

SERVER = os.environ.get("TESSERA_SERVER_PATH", "tessera-server")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemons:
    """`world` daemons of one cluster; addresses[r] is rank r's."""

    def __init__(self, world=4, extra=()):
        self.world = world
        self.dir = tempfile.mkdtemp(prefix="tessera-py-")
        self.extra = list(extra)
        self.procs = [None] * world
        self.addresses = [None] * world
        # The store's port is free a moment before rank 0 binds it; when
        # another process took it in between, start again on a new one.
        for attempt in range(3):
            self.master_port = free_port()
            for rank in range(world):
                self.start(rank)
            try:
                self.wait(range(world))
                return
            except RuntimeError as e:
                if attempt == 2 or "(--master-port)" not in str(e):
                    self.stop()
                    raise
                self.stop()

    def start(self, rank):
        address_file = os.path.join(self.dir, f"rank{rank}.address")
        if os.path.exists(address_file):
            os.remove(address_file)
        log = open(os.path.join(self.dir, f"rank{rank}.log"), "ab")
        self.procs[rank] = subprocess.Popen(
            [SERVER, "--rank", str(rank), "--world-size", str(self.world),
             "--master-addr", "127.0.0.1", "--master-port",
             str(self.master_port), "--host", "127.0.0.1", "--port", "0",
             "--local-rank", str(rank), "--local-world-size", str(self.world),
             "--device", "cpu", "--address-file", address_file,
             "--checkpoint-root", self.dir, "--log-level", "warn",
             *self.extra],
            stdout=log, stderr=subprocess.STDOUT)

    def wait(self, ranks, timeout=60):
        deadline = time.monotonic() + timeout
        for rank in ranks:
            path = os.path.join(self.dir, f"rank{rank}.address")
            while True:
                if os.path.exists(path):
                    with open(path) as f:
                        text = f.read().strip()
                    if text:
                        self.addresses[rank] = text
                        break
                if self.procs[rank].poll() is not None:
                    raise RuntimeError(f"daemon {rank} exited: {self.log(rank)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"daemon {rank} did not serve: "
                                       f"{self.log(rank)}")
                time.sleep(0.01)

    def log(self, rank):
        with open(os.path.join(self.dir, f"rank{rank}.log"), "rb") as f:
            return f.read().decode(errors="replace")[-4000:]

    def kill(self, rank):
        self.procs[rank].kill()
        self.procs[rank].wait()

    def pause(self, rank, timeout=10):
        """SIGSTOP, then waits until every thread of the daemon is stopped:
        the signal is only queued when send_signal returns, and under load a
        thread could still answer for a moment (DaemonCluster::Stop)."""
        pid = self.procs[rank].pid
        self.procs[rank].send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = []
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    with open(f"/proc/{pid}/task/{tid}/stat") as f:
                        # "tid (comm) S ...": the state follows the last ")".
                        states.append(f.read().rpartition(")")[2].split()[0])
                except (FileNotFoundError, IndexError):
                    pass  # A thread that ended meanwhile.
            if states and all(state in ("T", "t") for state in states):
                return
            time.sleep(0.001)
        raise RuntimeError(f"daemon {rank}: not every thread stopped after "
                           f"SIGSTOP within {timeout} s")

    def resume(self, rank):
        self.procs[rank].send_signal(signal.SIGCONT)

    def stop(self):
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            if p is None:
                continue
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture(scope="session")
def daemons():
    cluster = Daemons()
    yield cluster
    cluster.stop()


@pytest.fixture()
def client(daemons):
    import tessera

    c = tessera.connect(daemons.addresses[0], timeout=30)
    yield c
    for t in c.list():
        c.delete(t.name)


@pytest.fixture()
def rows4():
    import tessera

    return tessera.chunk(0, [f"rank:{r}/cpu" for r in range(4)])
