"""pip installs the package into a fresh virtual environment
(--system-site-packages, offline: --no-build-isolation --no-index) and runs
the Python quick start with that environment's interpreter, from a
directory outside the source tree, against real daemons (conftest.py).

The install reuses the CMake build that ran this test instead of building
the C++ tree again: TESSERA_CMAKE_BUILD_DIR names it and
TESSERA_CMAKE_SKIP_BUILD=1 takes its _tessera as it is (ctest sets both,
and TESSERA_SOURCE_DIR). Run by its own ctest entry (python.install), not
by the pytest suite: its name does not start with test_."""

import os
import subprocess
import sys
import textwrap

SOURCE = os.environ.get("TESSERA_SOURCE_DIR", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", ".."))

QUICK_START = textwrap.dedent("""\
    import os, sys
    import numpy as np
    import tessera

    # The environment's own copy, typed, with its version's metadata.
    package = os.path.dirname(tessera.__file__)
    assert package.startswith(sys.prefix + os.sep), (package, sys.prefix)
    for name in ("py.typed", "_tessera.pyi"):
        assert os.path.exists(os.path.join(package, name)), name
    from importlib.metadata import version
    assert version("tessera") == tessera.__version__

    c = tessera.connect(sys.argv[1])
    print(c.world_size, c.health())
    spec = tessera.chunk(0, [f"rank:{r}/cpu" for r in range(4)])
    w = c.create("pw", (1000, 64), spec, dtype="float32", init="randn",
                 seed=7)
    a = w[100:200, 8:16]
    w[0:2, 0:8] = np.ones((2, 8), np.float32)
    assert a.shape == (100, 8) and (w[0:2, 0:8] == 1).all()
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        import tessera.torch
        out = torch.empty(1000, 64)
        assert w.read(out=out) is out
        assert torch.equal(out[0:2, 0:8], torch.ones(2, 8))
        c.put("b", torch.arange(8.0),
              tessera.parse_spec("chunk:dim=0:rank:0/cpu,rank:1/cpu"))
        print([t.name for t in c.list()], c.open("b")[2:5])
    for t in c.list():
        c.delete(t.name)
    print("quick start ok")
    """)


def _run(command, **kwargs):
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, (
        f"{command} exited {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


def test_pip_install_into_a_fresh_venv_then_quick_start(daemons, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
         timeout=120)
    python = str(venv / "bin" / "python")
    # Nothing of the source tree on the path: only the installed package.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PIP_NO_CACHE_DIR"] = "1"
    _run([python, "-m", "pip", "install", "--no-build-isolation",
          "--no-index", "--disable-pip-version-check", SOURCE],
         env=env, cwd=tmp_path, timeout=240)
    script = tmp_path / "quick_start.py"
    script.write_text(QUICK_START)
    done = _run([python, str(script), daemons.addresses[0]], env=env,
                cwd=tmp_path, timeout=120)
    assert "quick start ok" in done.stdout
