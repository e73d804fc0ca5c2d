#!/usr/bin/env bash
# Builds Tessera and runs every test (unit, CLI, benchmark smoke runs and
# the formatting check) through ctest. Installs missing Debian packages
# first. Environment: TESSERA_BUILD_DIR (default build),
# TESSERA_WITH_CUDA (AUTO|ON|OFF, default AUTO).
set -euo pipefail
cd "$(dirname "$0")/.."

deploy/install-deps.sh
build_dir=${TESSERA_BUILD_DIR:-build}
jobs=$(nproc)
cmake -S . -B "$build_dir" -G Ninja \
  -DTESSERA_WITH_CUDA="${TESSERA_WITH_CUDA:-AUTO}"
cmake --build "$build_dir" -j "$jobs"
ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" --timeout 300
