#!/usr/bin/env bash
# Packs what bench/device_check.sh runs into one file, for a GPU machine that cannot build
# ztrain: the `device` tool's H200 image has CUDA, CMake and PyTorch but none of ztrain's
# Debian dependencies (OpenMPI, OpenBLAS, oneDNN, spdlog, liburing, ...) and no package
# registry. So the CUDA targets are built here, on Debian, for a CPU any GPU host has
# (-march=x86-64-v4, AVX-512; this machine may be an AMD EPYC and that one an Intel Xeon),
# and carried there with the shared libraries they load, OpenMPI's launcher and plugins
# included. On the GPU machine `PREBUILT=1 bash bench/device_check.sh` unpacks it
# (bench/device_env.sh) and runs the same tests and benches.
#   ZTRAIN_ARCH=x86-64-v4 BUILD_ONLY=1 bash bench/device_check.sh   # build-device, here
#   bash bench/device_bundle.sh                                      # -> .device/bundle.tar.xz
# Then `run` with carry [".device"] and command "PREBUILT=1 OUT=$OUT bash bench/device_check.sh".
# Not carried: libcuda (the GPU machine's driver), cuBLAS and NCCL (opened lazily, found on
# the GPU machine by bench/device_env.sh), glibc and libstdc++ (the GPU machine's are newer).
set -euo pipefail
build=${1:-build-device}
out_dir=.device
stage=$out_dir/b
[ -x "$build/ztrain" ] || { echo "no $build/ztrain: build it first (see the usage above)" >&2; exit 1; }
grep -q 'ZTRAIN_ARCH:STRING=native' "$build/CMakeCache.txt" &&
  echo "warning: $build was built with -march=native; the GPU machine's CPU may lack some of its instructions" >&2
rm -rf "$stage"
mkdir -p "$stage/lib" "$stage/bin"

# The build tree without objects and static archives: executables, CTest files, test data.
tar -C "$build" --exclude='*.o' --exclude='*.a' --exclude='.ninja_*' --exclude='*.ninja' \
  --exclude='CMakeFiles' -cf - . | (mkdir -p "$stage/build" && tar -C "$stage/build" -xf -)

# OpenMPI's and PMIx's files, at their own paths under root/ (relocated by OPAL_PREFIX).
mkdir -p "$stage/root"
for pkg in openmpi-bin libopenmpi3 openmpi-common libpmix2; do dpkg -L "$pkg"; done |
  grep -v -e '/share/doc/' -e '/share/man/' -e '/include/' -e 'lintian' |
  while read -r f; do if [ -L "$f" ] || [ -f "$f" ]; then echo "$f"; fi; done |
  tar -cf - --no-recursion -T - 2> /dev/null | tar -C "$stage/root" -xf -

# Every shared library the executables, OpenMPI's programs and their plugins load, except
# the ones the GPU machine must supply itself.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libstdc\+\+|libgcc_s|libcuda\.so|libnvidia)'
elves() { find "$stage/build" "$stage/root" -type f \( -perm -u+x -o -name '*.so*' \) -print0 |
            xargs -0 file -L | grep -E 'ELF 64-bit' | cut -d: -f1; }
elves | while read -r elf; do ldd "$elf" 2> /dev/null; done |
  awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
  while read -r name path; do
    [[ $name =~ $skip ]] && continue
    [ -e "$stage/lib/$name" ] || cp -L "$path" "$stage/lib/$name"
  done
missing=$(elves | while read -r elf; do ldd "$elf" 2> /dev/null; done | grep 'not found' | sort -u || true)
[ -z "$missing" ] || echo "note: not resolvable here either: $missing" >&2

pwd > "$stage/origin.txt"        # the absolute path build-device's CTest files name
grep -m1 'CMAKE_CUDA_ARCHITECTURES:' "$build/CMakeCache.txt" > "$stage/build_info.txt" || true
grep -m1 'ZTRAIN_ARCH:' "$build/CMakeCache.txt" >> "$stage/build_info.txt" || true
git rev-parse HEAD >> "$stage/build_info.txt" 2> /dev/null || true
XZ_OPT="-6 -T2" tar -C "$out_dir" -cJf "$out_dir/bundle.tar.xz" b
rm -rf "$stage"
echo "$out_dir/bundle.tar.xz: $(du -h "$out_dir/bundle.tar.xz" | cut -f1)"
