#include "test_models.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/factory/model_factory.h"
#include "runtime/sampler.h"

namespace skippy::testing {

std::string tiny_model(const std::string& arch, const std::string& tag, uint64_t seed,
                       const std::string& type) {
    const auto dir = std::filesystem::temp_directory_path() / ("skippy-" + tag);
    std::filesystem::create_directories(dir);
    const auto path = dir / ("tiny-" + arch + "-" + std::to_string(seed) +
                             (type.empty() ? "" : "-" + type) + ".gguf");
    if (!std::filesystem::exists(path)) {
        runtime::ModelSpec spec;
        spec.arch = arch;
        spec.n_layer = arch == "qwen35" ? 4 : 2;
        spec.n_embd = 128;
        spec.n_head = 2;
        spec.n_head_kv = 2;
        spec.n_ff = 256;
        spec.seed = seed;
        if (!type.empty()) {
            spec.type = type;
            spec.n_embd = 256;
            spec.n_ff = 512;
        }
        // Unique temporary name: test processes may run in parallel.
        const auto tmp = path.string() + ".tmp." + std::to_string(::getpid());
        runtime::make_random_model(spec, tmp);
        std::filesystem::rename(tmp, path);
    }
    return path.string();
}

namespace {

// A tiny dense model (1 layer, f16) with `vocab` and `chat_template` (empty: the default),
// generated once as `file` under `tag`.
std::string tiny_dense_model(const std::string& tag, const std::string& file,
                             const std::string& vocab, const std::string& chat_template) {
    const auto dir = std::filesystem::temp_directory_path() / ("skippy-" + tag);
    std::filesystem::create_directories(dir);
    const auto path = dir / file;
    if (!std::filesystem::exists(path)) {
        runtime::ModelSpec spec;
        spec.arch = "llama";
        spec.n_layer = 1;
        spec.n_embd = 64;
        spec.n_head = 2;
        spec.n_head_kv = 2;
        spec.n_ff = 64;
        spec.f16 = true;
        spec.vocab = vocab;
        spec.chat_template = chat_template;
        const auto tmp = path.string() + ".tmp." + std::to_string(::getpid());
        runtime::make_random_model(spec, tmp);
        std::filesystem::rename(tmp, path);
    }
    return path.string();
}

}  // namespace

std::string tiny_tool_model(const std::string& tag) {
    return tiny_dense_model(tag, "tiny-tools-qwen3-v1.gguf", "qwen3",
                            runtime::chat_template_text("Qwen-Qwen2.5-7B-Instruct"));
}

std::vector<std::filesystem::path> shipped_chat_templates() {
    const auto dir =
        std::filesystem::path(runtime::vocab_gguf_path("llama-spm")).parent_path() / "templates";
    std::vector<std::filesystem::path> out;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        if (entry.path().extension() == ".jinja") {
            out.push_back(entry.path());
        }
    }
    std::sort(out.begin(), out.end());
    return out;
}

std::string read_text_file(const std::filesystem::path& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::string tiny_chatml_spm_model(const std::string& tag) {
    return tiny_dense_model(tag, "tiny-llama-spm-chatml-v1.gguf", "llama-spm-chatml", "");
}

int32_t prefill(runtime::InferenceContext& ctx, runtime::SeqId seq,
                const std::vector<runtime::Token>& tokens, size_t from, size_t to, size_t chunk) {
    int32_t last = -1;
    size_t pos = from;
    while (pos < to) {
        const size_t end = chunk == 0 ? to : std::min(to, (pos / chunk + 1) * chunk);
        ctx.batch_clear();
        for (size_t i = pos; i < end; ++i) {
            last = ctx.batch_add(tokens[i], static_cast<runtime::Pos>(i), seq, i + 1 == end);
        }
        EXPECT_EQ(ctx.decode(), 0);
        pos = end;
    }
    return last;
}

std::vector<runtime::Token> continue_greedy(runtime::InferenceContext& ctx, runtime::SeqId seq,
                                            runtime::Pos next_pos, int32_t logits_index, int n) {
    runtime::SamplingParams greedy;
    greedy.temperature = 0;
    runtime::Sampler sampler(ctx.model(), greedy);
    std::vector<runtime::Token> out;
    for (int i = 0; i < n; ++i) {
        const runtime::Token t = sampler.sample(ctx, logits_index);
        out.push_back(t);
        ctx.batch_clear();
        logits_index = ctx.batch_add(t, next_pos++, seq, true);
        EXPECT_EQ(ctx.decode(), 0);
    }
    return out;
}

}  // namespace skippy::testing
