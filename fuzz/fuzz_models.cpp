#include "fuzz_models.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "runtime/factory/model_factory.h"

namespace skippy::fuzz {

std::string tiny_model(const std::string& arch, const char* argv0) {
    std::filesystem::path dir;
    if (const char* env = std::getenv("SKIPPY_FUZZ_MODELS"); env != nullptr && *env != '\0') {
        dir = env;
    } else {
        dir = std::filesystem::absolute(argv0 != nullptr ? argv0 : ".").parent_path();
    }
    std::filesystem::create_directories(dir);
    const std::filesystem::path path = dir / ("fuzz-" + arch + "-tools.gguf");
    if (std::filesystem::exists(path)) {
        return path.string();
    }
    runtime::ModelSpec spec;
    spec.arch = arch;
    spec.n_layer = arch == "qwen35" ? 4 : 2;  // qwen35: 3 recurrent + 1 attention layer
    spec.n_embd = 64;
    spec.n_head = 2;
    spec.n_head_kv = 2;
    spec.n_ff = 128;
    spec.n_ctx_train = 512;
    spec.seed = 11;
    // Tool-capable, like the demo model: tools, tool_choice and tool messages render and
    // build lazy grammars in the fuzzed chat requests.
    spec.vocab = "qwen3";
    spec.chat_template = runtime::chat_template_text("Qwen-Qwen2.5-7B-Instruct");
    // Unique temporary name: several fuzzer processes may start at once.
    const std::string tmp = path.string() + ".tmp" + std::to_string(::getpid());
    runtime::make_random_model(spec, tmp);
    std::filesystem::rename(tmp, path);
    return path.string();
}

void fail(const std::string& what) {
    std::fprintf(stderr, "\n*** skippy fuzz invariant violated: %s\n", what.c_str());
    std::fflush(stderr);
    std::abort();
}

}  // namespace skippy::fuzz
