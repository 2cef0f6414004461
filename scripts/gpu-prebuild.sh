#!/usr/bin/env bash
# Run here, before a GPU session, after the last change: builds the CUDA targets for Hopper (sm_90,
# the H100 and H200) on this machine and packs the programs and CTest's files into
# .gpu-deps/prebuilt.tar.xz (about 15 MB), so the device machine starts testing at once instead of
# building for 4-7 minutes of its 15 (396 s on 2026-11-28). gpu-check.sh uses the archive only when
# the sources it was built from are the ones the device received (source-hash.sh, computed here
# and there) and its CUDA probe passes with it; otherwise it builds there as before.
#
# The build differs from the device's own in two ways, both so that it runs there: the CPU code
# targets x86-64-v3 (AVX2), not -march=native, and oneDNN is left out (the device has no
# libdnnl). It links the Debian libraries gpu-bundle.sh carries, the CUDA toolkit's libraries
# (13.x on both machines), cuDNN 9 and NCCL 2 by soname, and Open MPI 4's libmpi.so.40.
#   scripts/gpu-bundle.sh && scripts/gpu-prebuild.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d .gpu-deps ] || { echo "gpu-prebuild: run scripts/gpu-bundle.sh first" >&2; exit 1; }
command -v nvcc > /dev/null || export PATH="/usr/local/cuda/bin:$PATH"
# The device machine's copy of the repository sits at the same path (CTest's files name it).
build="build-gpu"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DACCRUE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DACCRUE_NATIVE=OFF \
  -DCMAKE_CXX_FLAGS="-march=x86-64-v3" -DACCRUE_DNNL_LIBRARY=OFF > /dev/null
# A source saved while its compile runs leaves an object older than the source but newer on disk:
# the hash is taken before and after, and a difference stops here.
before=$(scripts/lib/source-hash.sh)
cmake --build "$build" -j"$(nproc)"
scripts/lib/source-hash.sh > "$build/source-hash"
if [ "$(cat "$build/source-hash")" != "$before" ]; then
  echo "gpu-prebuild: sources changed during the build; touch them and run it again" >&2
  exit 1
fi
# Programs, CTest's files and what the tests read beside them; no objects, archives or build.ninja
# (whose presence would make gpu-check.sh rebuild on the device).
pwd > "$build/source-root"
(find "$build" -type f \( -perm -u+x -o -name 'CTestTestfile.cmake' -o -name '*.cmake' \
  -o -name 'source-*' \) ! -name '*.o' ! -name '*.a' ! -path '*/CMakeFiles/*' -print0 |
  tar --null -cf - -T - | xz -9 -T1 > .gpu-deps/prebuilt.tar.xz.tmp)
mv .gpu-deps/prebuilt.tar.xz.tmp .gpu-deps/prebuilt.tar.xz
echo "gpu-prebuild: .gpu-deps/prebuilt.tar.xz ($(du -h .gpu-deps/prebuilt.tar.xz | cut -f1)," \
  "sources $(cut -c1-12 "$build/source-hash"))"
