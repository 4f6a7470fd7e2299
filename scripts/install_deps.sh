#!/usr/bin/env bash
# Installs ztrain's build and test dependencies from Debian's registry (run as root).
set -euo pipefail
packages=(build-essential cmake pkg-config libspdlog-dev nlohmann-json3-dev libcli11-dev
          libopenblas-openmp-dev libdnnl-dev libgtest-dev googletest libbenchmark-dev
          libopenmpi-dev openmpi-bin liburing-dev fio python3-torch libpcre2-dev
          libsentencepiece-dev sentencepiece python3-sentencepiece
          slurmctld slurmd slurm-client munge)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}"
fi
