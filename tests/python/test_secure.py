"""The tessera package against daemons with mutual TLS and tokens, as
`tessera launch --secure` starts them (a throwaway CA; real TLS on gRPC and
on the data plane, a token on every call). TLS and tokens are settings of
the whole process, so each client runs in a child process of its own."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import SERVER, free_port

CLI = os.environ.get("TESSERA_CLI_PATH") or os.path.join(
    os.path.dirname(SERVER), "tessera")

CHILD = r"""
import json, sys
import numpy as np
import tessera

mode, creds = sys.argv[1], json.loads(sys.argv[2])
address = creds["TESSERA_ADDRESS"]
tls = dict(tls_ca=creds["TESSERA_TLS_CA"], tls_cert=creds["TESSERA_TLS_CERT"],
           tls_key=creds["TESSERA_TLS_KEY"])
out = {}

def outcome(call):
    try:
        call()
        return "ok"
    except tessera.Error as e:
        return type(e).__name__

if mode == "arguments":
    out["plaintext"] = outcome(lambda: tessera.connect(address, timeout=5))
    out["wrong token"] = outcome(
        lambda: tessera.connect(address, timeout=5, token="not-the-token",
                                **tls).list())
    # A device is refused before it is read (it never ends), not read
    # until memory runs out.
    out["token file /dev/zero"] = outcome(
        lambda: tessera.connect(address, timeout=5, token_file="/dev/zero",
                                **tls))
    # Read as the CLI's --token-file is: comments and blank lines skipped.
    import tempfile
    with open(creds["TESSERA_TOKEN_FILE"]) as f:
        token = f.read().split()[0]
    commented = tempfile.NamedTemporaryFile("w", suffix=".token")
    commented.write("# the token of this cluster\n\n" + token + "\n")
    commented.flush()
    c = tessera.connect(address, timeout=30, token_file=commented.name, **tls)
else:  # everything from the environment, as the ready line exports it
    c = tessera.connect(timeout=30)
values = np.arange(2048 * 256, dtype=np.float32).reshape(2048, 256)
w = c.put("secure_" + mode, values,
          tessera.chunk(0, ["rank:0/cpu", "rank:1/cpu"]))
out["read"] = bool(np.array_equal(w.read(), values))  # 2 MiB
out["box"] = bool(np.array_equal(w[1000:1030, 5:9], values[1000:1030, 5:9]))
out["health"] = [ok for _, _, ok in c.health()]
c.delete(w.name)
# 8 MiB per daemon: the coordinating daemon pulls its peer's shard from
# that peer's shard server, which takes the same TLS and tokens.
big = np.arange(4096 * 1024, dtype=np.float32).reshape(4096, 1024)
g = c.put("secure_big_" + mode, big,
          tessera.chunk(0, ["rank:0/cpu", "rank:1/cpu"]))
out["gather"] = bool(np.array_equal(c.gather(g.name), big))
c.delete(g.name)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def secure():
    """`tessera launch --nproc 2 --cpu --secure`; yields what its ready
    line exports."""
    launch = subprocess.Popen(
        [CLI, "launch", "--nproc", "2", "--cpu", "--secure", "--base-port",
         "0", "--master-port", str(free_port()), "--server", SERVER],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 60
        creds = None
        while creds is None and time.monotonic() < deadline:
            line = launch.stdout.readline()
            if not line:
                break
            if line.startswith("ready: export "):
                creds = dict(word.split("=", 1)
                             for word in line.split()[2:])
        assert creds is not None, "tessera launch --secure did not serve"
        yield creds
    finally:
        launch.send_signal(signal.SIGINT)
        try:
            launch.wait(timeout=30)
        except subprocess.TimeoutExpired:
            launch.kill()
            launch.wait()


def run_child(mode, creds, env):
    child_env = {k: v for k, v in os.environ.items()
                 if not k.startswith("TESSERA_")}
    child_env.update(env)
    done = subprocess.run([sys.executable, "-c", CHILD, mode,
                           json.dumps(creds)],
                          env=child_env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_tls_and_token_as_arguments(secure):
    out = run_child("arguments", secure, {})
    # Without TLS or with a wrong token: an exception, at once.
    assert out["plaintext"] == "UnavailableError"
    assert out["wrong token"] == "UnauthenticatedError"
    assert out["token file /dev/zero"] == "InvalidArgumentError"
    assert out["read"] and out["box"] and out["gather"]
    assert out["health"] == [True, True]


def test_tls_and_token_from_the_environment(secure):
    out = run_child("environment", secure, secure)
    assert out["read"] and out["box"] and out["gather"]
    assert out["health"] == [True, True]
