# Shared by scripts/chat and scripts/test: a project venv with localchat installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
# llama-cpp-python builds llama.cpp from source. On x86-64 Linux we pass the CPU's own vector
# extensions explicitly instead of -march=native: a native build also compiles AMX kernels, which
# die with "Illegal instruction" on VMs that report AMX but do not enable it. Set CMAKE_ARGS
# yourself for CUDA (-DGGML_CUDA=on), Vulkan (-DGGML_VULKAN=on) or another CPU.
if [ -z "${CMAKE_ARGS:-}" ] && [ "$(uname -s)" = Linux ] && [ "$(uname -m)" = x86_64 ]; then
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  args="-DGGML_NATIVE=OFF"
  for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 \
              avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    case "$flags" in *" ${pair%%:*} "*) args="$args -DGGML_${pair#*:}=ON" ;; esac
  done
  export CMAKE_ARGS="$args"
fi
# Build only what localchat loads (issue 24: 547 s -> see README). The image library (mtmd, ~40
# sources: clip and the vision models) is for image chat, which localchat does not support yet, and
# libllama-common is loaded by nothing (scripts/llama-cpp-text-only.cmake). Added to the user's own
# CMAKE_ARGS (CUDA, Metal, Vulkan), never instead of them; a user who asks for LLAVA_BUILD keeps it.
# These only matter when pip has to build: an installed llama-cpp-python or a cached wheel is used
# as it is.
case " ${CMAKE_ARGS:-} " in
  *LLAVA_BUILD*) ;;
  *) CMAKE_ARGS="${CMAKE_ARGS:-} -DLLAVA_BUILD=OFF"
     CMAKE_ARGS="$CMAKE_ARGS '-DCMAKE_PROJECT_llama.cpp_INCLUDE=$PWD/scripts/llama-cpp-text-only.cmake'" ;;
esac
export CMAKE_ARGS="${CMAKE_ARGS# }"
# With ccache (ggml uses it by itself when it is on PATH), a second build (a version bump, another
# venv) compiles almost nothing, if the compile lines repeat: pip unpacks the source into a new
# random folder under the temp dir each time, so the build folder sits at a fixed place inside the
# source and ccache rewrites paths under the temp dir as relative ones. Never required.
if command -v ccache >/dev/null 2>&1; then
  [ -n "${SKBUILD_BUILD_DIR:-}" ] || export SKBUILD_BUILD_DIR='build/{wheel_tag}'
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-${TMPDIR:-/tmp}}"
  export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
fi
python -m pip install -q --upgrade pip
