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
python -m pip install -q --upgrade pip
