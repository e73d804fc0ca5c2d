#!/usr/bin/env bash
# Installs the Debian (bookworm) packages Tessera needs to build and test,
# and only those that are missing: running it twice installs nothing.
# Works as root or through sudo. CUDA/NCCL are optional and never installed
# here (TESSERA_WITH_CUDA=AUTO uses them when present).
set -euo pipefail

packages=(
  g++ cmake ninja-build pkg-config
  protobuf-compiler libprotobuf-dev
  protobuf-compiler-grpc libgrpc++-dev
  libabsl-dev
  libgtest-dev libgmock-dev
  libgloo-dev
  libcli11-dev nlohmann-json3-dev libxxhash-dev zlib1g-dev
  clang-format clang-14 libclang-rt-14-dev lld
  openssl libssl-dev
  libeigen3-dev libspdlog-dev
  prometheus-cpp-dev
  golang-etcd-server-dev etcd-server
  iproute2 iperf3
  slurm-wlm munge
  python3-dev pybind11-dev python3-numpy python3-pytest python3-torch
  python3-tqdm
  python3-setuptools python3-wheel python3-pip python3-venv python3-build
)
# Intel's ipsec-mb (x86-64 only): the data plane's AES-GCM over TLS
# (wire/record_sealer.h); elsewhere OpenSSL computes it.
if [[ "$(dpkg --print-architecture)" == amd64 ]]; then
  packages+=(libipsec-mb-dev)
fi

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

as_root=()
if ((EUID != 0)); then
  command -v sudo >/dev/null || {
    echo "install-deps: need root or sudo to install: ${missing[*]}" >&2
    exit 1
  }
  as_root=(sudo)
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
