# Shared by scripts/chat and scripts/test: a project venv with localchat installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
# llama-cpp-python builds llama.cpp from source. On x86-64 Linux we build for portable AVX2 unless
# the user says otherwise: a -march=native build also compiles AMX kernels, which die with
# "Illegal instruction" on VMs that report AMX but do not enable it. Set CMAKE_ARGS yourself for
# CUDA (-DGGML_CUDA=on), Vulkan (-DGGML_VULKAN=on) or a native build.
if [ -z "${CMAKE_ARGS:-}" ] && [ "$(uname -s)" = Linux ] && [ "$(uname -m)" = x86_64 ]; then
  export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
fi
python -m pip install -q --upgrade pip
