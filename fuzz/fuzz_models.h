// Tiny generated models for the fuzz targets, made once per build-fuzz/ directory.
#pragma once

#include <string>

namespace skippy::fuzz {

// Path of a tiny random-weight model of `arch` ("llama", "qwen35", "mamba2"), generated
// with runtime::make_random_model if missing. Directory: $SKIPPY_FUZZ_MODELS, else the
// directory of the fuzzer binary (argv0).
std::string tiny_model(const std::string& arch, const char* argv0);

// Aborts with a message: the fuzzer reports it as a crash with its input saved.
[[noreturn]] void fail(const std::string& what);

}  // namespace skippy::fuzz
