# Sourced by `PREBUILT=1 bash bench/device_check.sh` on the GPU machine, from the repo root:
# unpacks .device/bundle.tar.xz (made here by bench/device_bundle.sh) into build-device and
# .device/b, makes the path the build was made under name this checkout (its CTest files and
# test data are named by absolute paths), points the MPI tests at the carried OpenMPI and
# exports what its programs need to load: the carried libraries first, then the GPU machine's
# own cuBLAS and NCCL (CUDA toolkit or PyTorch's wheels), which ztrain opens lazily.
# Returns non-zero, saying why, when the bundle cannot be used.
device_env() {
  local bundle=.device/bundle.tar.xz b=$PWD/.device/b
  [ -f "$bundle" ] || { echo "no $bundle: make it with bench/device_bundle.sh and carry .device"; return 1; }
  rm -rf "$b" build-device
  tar -C .device -xJf "$bundle" || return 1
  mv "$b/build" build-device
  local origin
  origin=$(cat "$b/origin.txt")
  if ! [ "$origin" -ef "$PWD" ]; then
    if [ -e "$origin" ] && [ ! -L "$origin" ]; then
      echo "the bundle was built under $origin, which exists here and is not this checkout"
      return 1
    fi
    mkdir -p "$(dirname "$origin")" && ln -sfn "$PWD" "$origin"
  fi
  local root=$origin/.device/b/root
  mkdir -p "$b/bin"
  printf '#!/bin/sh\nexec %s/usr/bin/orterun "$@"\n' "$root" > "$b/bin/mpiexec"
  chmod +x "$b/bin/mpiexec"
  find build-device -name CTestTestfile.cmake -print0 |
    xargs -0 sed -i "s#/usr/bin/mpiexec#$origin/.device/b/bin/mpiexec#g"
  local gpu_libs="" lib found
  for lib in libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    found=$(find /usr/local/cuda/ /usr/local/cuda/lib64/ /usr/lib/x86_64-linux-gnu /opt /usr/local/lib \
              -name "$lib" 2> /dev/null | head -n 1)
    if [ -n "$found" ]; then
      gpu_libs="$gpu_libs:$(dirname "$found")"
      echo "device_env: $lib from $found"
    else
      echo "device_env: no $lib found on this machine"
    fi
  done
  export LD_LIBRARY_PATH="$b/lib${gpu_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export OPAL_PREFIX=$root/usr
  export PMIX_INSTALL_PREFIX=$root/usr/lib/x86_64-linux-gnu/pmix2
  export PMIX_MCA_mca_base_component_path=$root/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
  export OMPI_MCA_mca_base_component_show_load_errors=0
  export PATH="$b/bin:$PATH"
  echo "device_env: $(cat "$b/build_info.txt" | tr '\n' ' ')"
  local unresolved
  unresolved=$(ldd build-device/ztrain "$root/usr/bin/orterun" | grep 'not found' || true)
  [ -z "$unresolved" ] || { echo "device_env: unresolved libraries: $unresolved"; return 1; }
}
