#!/usr/bin/env bash
# Installs ztrain from the build tree into a temporary prefix, builds examples/custom_layer
# against the installed CMake package (find_package(ztrain)), and runs it.
set -euo pipefail
build_dir=$1
source_dir=$2
work=$(mktemp -d /tmp/ztrain_install_XXXXXX)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"
cmake -S "$source_dir/examples/custom_layer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
      -DCMAKE_BUILD_TYPE=Release > "$work/configure.log"
cmake --build "$work/build" -j2 > "$work/build.log" || { cat "$work/build.log"; exit 1; }
OMP_NUM_THREADS=2 "$work/build/custom_layer"
