"""Builds the Python package `tessera` (pyproject.toml has its metadata):
the pure-Python files of python/tessera/ and the native module
tessera._tessera, which this repository's CMake build makes (the `_tessera`
target only; tests and benchmarks off) and which is then copied into the
package.

    python3 -m venv --system-site-packages venv
    venv/bin/python -m pip install --no-build-isolation --no-index .

or a wheel: python3 -m build --no-isolation --wheel (both offline, with
Debian's python3-setuptools, python3-wheel, python3-pip or python3-build).
The installed package needs nothing from this tree at run time: the module
links the C++ libraries statically (system libraries aside), and the daemons
it talks to are started apart from it (tessera-server, tessera launch).

Environment:
  TESSERA_CMAKE_BUILD_DIR   a CMake build directory to build `_tessera` in
                            and take it from, e.g. the tree's own `build`,
                            so that an install builds only what changed; it
                            is configured first when it has no CMakeCache.txt.
                            Default: build/python-package/temp.*/cmake/.
  TESSERA_CMAKE_ARGS        more arguments for a new directory's configure
                            step, such as "-DTESSERA_WITH_CUDA=OFF"
                            (CMakeLists.txt lists the options).
  TESSERA_CMAKE_SKIP_BUILD  "1": build nothing, take `_tessera` as
                            TESSERA_CMAKE_BUILD_DIR holds it (a test whose
                            build already made it).
  CMAKE_BUILD_PARALLEL_LEVEL  CMake's own: how many compile jobs.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
# setuptools' own scratch files (lib..., temp..., bdist..., the egg-info)
# go to python-package/ in the CMake build directory named, else in build/:
# never among the sources, never among CMake's own files.
BUILD_BASE = os.path.join(
    os.path.abspath(os.environ.get("TESSERA_CMAKE_BUILD_DIR") or
                    os.path.join(ROOT, "build")), "python-package")


def project_version():
    """The version in CMakeLists.txt's project(), the one source of it."""
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        match = re.search(r"project\(\s*tessera\s+VERSION\s+([0-9.]+)",
                          f.read())
    if match is None:
        raise RuntimeError("CMakeLists.txt has no project(tessera VERSION x)")
    return match.group(1)


class CMakeBuild(build_ext):
    """build_ext for the one extension, tessera._tessera: CMake builds it,
    this copies it into the package."""

    def build_extension(self, ext):
        build_dir = os.environ.get("TESSERA_CMAKE_BUILD_DIR")
        build_dir = (os.path.abspath(build_dir) if build_dir else
                     os.path.join(os.path.abspath(self.build_temp), "cmake"))
        if os.environ.get("TESSERA_CMAKE_SKIP_BUILD", "0") in ("", "0"):
            if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
                self.configure(build_dir)
            command = ["cmake", "--build", build_dir, "--target", "_tessera"]
            if self.parallel:
                command += ["--parallel", str(self.parallel)]
            self.spawn(command)
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        built = os.path.join(build_dir, "python", "tessera",
                             "_tessera" + suffix)
        if not os.path.exists(built):
            raise RuntimeError(
                f"{built} is missing: {build_dir} has no Python module for "
                f"this interpreter ({sys.executable}); configure it with "
                f"-DTESSERA_WITH_PYTHON=ON -DPython3_EXECUTABLE=... or unset "
                f"TESSERA_CMAKE_BUILD_DIR")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(built, target)
        # A RelWithDebInfo build's module is ten times its code: the package
        # takes the code (the build tree keeps the symbols for a debugger).
        strip = shutil.which("strip")
        if strip is not None:
            subprocess.run([strip, "--strip-debug", target], check=True)

    def configure(self, build_dir):
        command = [
            "cmake", "-S", ROOT, "-B", build_dir,
            "-DCMAKE_BUILD_TYPE=Release",
            "-DTESSERA_BUILD_TESTS=OFF",
            "-DTESSERA_BUILD_BENCH=OFF",
            "-DTESSERA_WITH_PYTHON=ON",
            f"-DPython3_EXECUTABLE={sys.executable}",
        ]
        if shutil.which("ninja") is not None:
            command += ["-G", "Ninja"]
        command += shlex.split(os.environ.get("TESSERA_CMAKE_ARGS", ""))
        self.spawn(command)


os.makedirs(BUILD_BASE, exist_ok=True)
setup(
    version=project_version(),
    packages=["tessera"],
    package_dir={"": "python"},
    package_data={"tessera": ["py.typed", "*.pyi"]},
    ext_modules=[Extension("tessera._tessera", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": BUILD_BASE},
             "egg_info": {"egg_base": BUILD_BASE}},
    zip_safe=False,
)
