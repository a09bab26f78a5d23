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
# Build only what localchat loads (issue 24: 547 s -> see README): libllama-common is loaded by
# nothing (scripts/llama-cpp-text-only.cmake; mtmd links only ggml and llama, not common). The image
# library (mtmd: clip and the vision models, ~1 minute on 2 cores) is built: images need it (issue
# 47). Added to the user's own CMAKE_ARGS (CUDA, Metal, Vulkan), never instead of them; a user who
# passes -DLLAVA_BUILD=OFF keeps a text-only build. These only matter when pip has to build: see
# ensure_image_library for an installed or cached wheel built without mtmd.
case " ${CMAKE_ARGS:-} " in
  *CMAKE_PROJECT_llama.cpp_INCLUDE*) ;;
  *) CMAKE_ARGS="${CMAKE_ARGS:-} '-DCMAKE_PROJECT_llama.cpp_INCLUDE=$PWD/scripts/llama-cpp-text-only.cmake'" ;;
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

# pip's wheel cache is keyed by the package's URL, not by CMAKE_ARGS: a venv made before issue 47,
# or a wheel cached by such a build, is text-only (no libmtmd in llama_cpp/lib) and pip would keep
# it forever. Called by scripts/test and scripts/chat after they install: rebuild that version once
# with mtmd, unless the user asked for a text-only build. A marker per version stops a build that
# still yields no mtmd (a platform llama-cpp-python skips it on) from rebuilding on every run.
ensure_image_library() {
  case " ${CMAKE_ARGS:-} " in *LLAVA_BUILD=OFF*|*LLAVA_BUILD=off*|*LLAVA_BUILD=0*) return 0 ;; esac
  local version marker
  version=$(python -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))' 2>/dev/null) || return 0
  python - <<'PY' && return 0
import importlib.util, pathlib, sys
spec = importlib.util.find_spec("llama_cpp")  # finds the package without loading its libraries
lib = pathlib.Path(spec.origin).parent / "lib" if spec and spec.origin else None
sys.exit(0 if lib and any(lib.glob("*mtmd*")) else 1)
PY
  marker=".venv/.mtmd-rebuilt-$version"
  if [ -e "$marker" ]; then
    echo "note: llama-cpp-python $version has no image library (libmtmd); images are unavailable" >&2
    return 0
  fi
  echo "llama-cpp-python $version was built without the image library (libmtmd): rebuilding it once" >&2
  # The text-only wheel leaves pip's cache first, so that the one built now is cached in its place
  # and the next venv on this machine takes it as it is. pip builds the new wheel before it
  # uninstalls the old one: a failed build (offline, no compiler) leaves the text-only install
  # working, and is tried again next time.
  python -m pip cache remove 'llama_cpp_python*' >/dev/null 2>&1 || true
  if ! python -m pip install -q --force-reinstall --no-deps "llama-cpp-python==$version"; then
    echo "note: the rebuild failed; images stay unavailable (localchat doctor says so)" >&2
    return 0
  fi
  touch "$marker"
}
