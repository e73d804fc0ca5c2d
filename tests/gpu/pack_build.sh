#!/usr/bin/env bash
# Carries a built tree to a GPU machine that lacks the build's dependencies
# (gRPC, protobuf, Abseil, Gloo, ...): packs the test and server binaries
# (without debug info), CTest's files (with the label lists that
# tests/CMakeLists.txt's tessera_add_test writes) and every shared library
# they load except the C runtime, the CUDA driver and NCCL, which the GPU
# machine has.
#
#   tests/gpu/pack_build.sh pack BUNDLE.tar.xz     (here, after a CUDA build)
#   tests/gpu/pack_build.sh run BUNDLE.tar.xz [RESULTS_DIR]   (there)
#
# `run` unpacks into this checkout's build directory, makes the source path
# the build was configured in point at this checkout (CTest's files name it;
# needs root when that path is outside the user's reach), puts the libraries
# and NCCL on LD_LIBRARY_PATH and runs tests/gpu/run_gpu_tests.sh on the
# unpacked tree. Environment: TESSERA_BUILD_DIR (default build).
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=${1:?pack or run}
bundle=${2:?bundle path}
build_dir=${TESSERA_BUILD_DIR:-build}

case $mode in
pack)
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  (cd "$build_dir" &&
    find . -path '*/CMakeFiles' -prune -o -type f \( -perm -u+x -o \
      -name CTestTestfile.cmake -o -name '*_include.cmake' -o \
      -name '*_tests.cmake' -o -name '*_labels.cmake' -o \
      -name CMakeCache.txt \) -print) |
    grep -v '\.so' |
    while read -r f; do
      mkdir -p "$stage/build/$(dirname "$f")"
      if [[ -x $build_dir/$f && $(head -c 4 "$build_dir/$f") == $'\x7fELF' ]]; then
        strip --strip-debug -o "$stage/build/$f" "$build_dir/$f"
      else
        cp "$build_dir/$f" "$stage/build/$f"
      fi
    done
  mkdir -p "$stage/lib"
  find "$stage/build" -type f -perm -u+x -exec ldd {} \; 2>/dev/null |
    awk '/=>/ && $3 ~ /^\// {print $3}' | sort -u |
    grep -vE '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s|libnccl|libcuda)\.so' |
    xargs -r -I{} cp -L {} "$stage/lib/"
  if command -v etcd >/dev/null; then cp "$(command -v etcd)" "$stage/lib/"; fi
  sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build_dir/CMakeCache.txt" \
    >"$stage/source_dir"
  # One xz stream with a dictionary larger than the tree: the test
  # binaries share most of their code, which a small dictionary (or xz's
  # parallel blocks) cannot see: 63 MB at xz -6, 44 MB so (about 5
  # minutes on 2 cores; unpacking needs 384 MiB of memory).
  tar cf - -C "$stage" . | xz -T1 --lzma2=preset=9,dict=384MiB >"$bundle"
  echo "packed $(du -h "$bundle" | cut -f1) into $bundle"
  ;;
run)
  root=$PWD
  unpacked=$(mktemp -d)
  tar xJf "$bundle" -C "$unpacked"
  rm -rf "${root:?}/$build_dir"
  mv "$unpacked/build" "$root/$build_dir"
  source_dir=$(cat "$unpacked/source_dir")
  if [[ $source_dir != "$root" ]]; then
    if [[ -e $source_dir && ! -L $source_dir ]]; then
      echo "$source_dir (where the build was configured) exists here and is" \
        "not this checkout: run from a checkout at that path" >&2
      exit 2
    fi
    mkdir -p "$(dirname "$source_dir")"
    ln -sfn "$root" "$source_dir"
  fi
  nccl=$(find /usr /opt -name 'libnccl.so.2' 2>/dev/null | head -n 1 || true)
  export LD_LIBRARY_PATH="$unpacked/lib${nccl:+:${nccl%/*}}:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$unpacked/lib:$PATH"  # etcd
  TESSERA_SKIP_BUILD=1 TESSERA_BUILD_DIR=$build_dir \
    exec tests/gpu/run_gpu_tests.sh "${3:-./gpu-results}"
  ;;
*)
  echo "usage: $0 pack|run BUNDLE.tar.xz [RESULTS_DIR]" >&2
  exit 2
  ;;
esac
