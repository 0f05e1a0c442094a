// Greedy probe: a small certification helper for tests. Loads a GGUF, tokenizes a prompt
// with the model's own vocabulary, decodes it and generates greedily (argmax), checking
// that every logit it looked at was finite.
//
//   auto r = skippy::runtime::greedy_probe("/tmp/tiny.gguf", "Hello world", 16);
//   EXPECT_TRUE(r.all_finite);
//
// It is deliberately independent of the rest of the runtime (it talks to llama.cpp
// directly) so it can certify models and other runtime code against the same reference.
// llama.cpp logging is silenced while it runs unless SKIPPY_LLAMA_LOG=1.
//
// Thread safety: each call loads its own model and context; calls may run concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace skippy::runtime {

struct GreedyProbeOptions {
    uint32_t n_ctx = 2048;
    uint32_t n_threads = 2;
    uint32_t n_batch = 512;  // prompt chunk size (also n_ubatch)
    int32_t n_gpu_layers = 0;
    bool stop_at_eog = false;  // stop early on an end-of-generation token
};

struct GreedyResult {
    std::vector<int32_t> prompt_tokens;  // tokenized with add_special=true, parse_special=true
    std::vector<int32_t> tokens;         // generated tokens (n_predict unless stop_at_eog hit)
    std::string text;                    // detokenized `tokens` (special tokens rendered)
    bool all_finite = true;              // every logit of every evaluated position was finite
    std::string arch;                    // general.architecture
    std::string name;                    // general.name
    bool is_recurrent = false;           // llama_model_is_recurrent
    bool is_hybrid = false;              // llama_model_is_hybrid
    int32_t n_vocab = 0;
    uint64_t n_params = 0;
    uint64_t model_size = 0;    // bytes of weights
    size_t seq_state_size = 0;  // llama_state_seq_get_size(ctx, 0) after generation
};

// Throws std::runtime_error when the model cannot be loaded, the prompt is empty after
// tokenization, prompt + n_predict exceeds n_ctx, or a decode fails.
GreedyResult greedy_probe(const std::string& model_path, const std::string& prompt_text,
                          int n_predict, const GreedyProbeOptions& options = {});

// greedy_probe(...).tokens
std::vector<int32_t> greedy_generate(const std::string& model_path, const std::string& prompt_text,
                                     int n_predict, const GreedyProbeOptions& options = {});

// Renders (role, content) messages with the model's chat template through llama.cpp's
// common chat code (common_chat_templates_init + common_chat_templates_apply, Jinja).
// Loads the vocabulary only. Throws std::runtime_error when the model has no usable
// template or rendering fails.
std::string render_chat_prompt(const std::string& model_path,
                               const std::vector<std::pair<std::string, std::string>>& messages,
                               bool add_generation_prompt = true);

// RAII: while alive, llama.cpp/ggml log output is dropped (errors still go to stderr)
// unless SKIPPY_LLAMA_LOG=1. Nests and may be used from several threads; the previous
// callback is restored when the last one ends.
class ScopedLlamaLogSilencer {
  public:
    ScopedLlamaLogSilencer();
    ~ScopedLlamaLogSilencer();
    ScopedLlamaLogSilencer(const ScopedLlamaLogSilencer&) = delete;
    ScopedLlamaLogSilencer& operator=(const ScopedLlamaLogSilencer&) = delete;

  private:
    bool active_ = false;
};

}  // namespace skippy::runtime
