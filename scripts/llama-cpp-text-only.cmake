# Included by CMake right after vendor/llama.cpp's project() call, through
# CMAKE_PROJECT_llama.cpp_INCLUDE (set by scripts/_env.sh when it builds llama-cpp-python).
#
# llama-cpp-python's CMakeLists forces LLAMA_BUILD_COMMON on, so every build compiles and installs
# libllama-common (argument parsing, chat parsers, sampling helpers for llama.cpp's own tools), which
# the Python package never loads: its Emscripten build turns it off the same way. Undoing the force
# here, inside llama.cpp's own scope, skips those sources; libllama and ggml are built as before.
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)
