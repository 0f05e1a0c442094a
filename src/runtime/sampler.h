// Sampler: llama.cpp's sampler chain built from OpenAI-style sampling parameters.
//
//   Sampler sampler(model, params);
//   Token t = sampler.sample(context, batch_index);  // also accepts t into the chain
//
// Thread safety: not thread-safe; used by the thread that owns the InferenceContext.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/inference_context.h"

struct llama_sampler;

namespace skippy::runtime {

struct SamplingParams {
    float temperature = 1.0f;  // <= 0: greedy
    float top_p = 1.0f;
    int32_t top_k = 0;  // 0: disabled
    float min_p = 0.0f;
    uint32_t seed = 0xFFFFFFFFu;  // LLAMA_DEFAULT_SEED: random
    float repeat_penalty = 1.0f;
    float presence_penalty = 0.0f;
    float frequency_penalty = 0.0f;
    int32_t penalty_last_n = 64;
    std::vector<std::pair<int32_t, float>> logit_bias;  // (token, bias) added to the logits
    std::string grammar;                                // GBNF, empty = none
    // Lazy grammar: unconstrained until a trigger (a token, or a regex over the generated
    // text) appears, constrained from there on.
    bool grammar_lazy = false;
    std::vector<std::string> grammar_trigger_patterns;
    std::vector<int32_t> grammar_trigger_tokens;
    // Tokens accepted into the grammar before the first sample (text the grammar expects
    // that the prompt already holds, e.g. a chat template's generation prompt).
    std::vector<int32_t> grammar_prefill;

    bool is_greedy() const { return temperature <= 0.0f; }
};

class Sampler {
  public:
    // Throws std::invalid_argument when the grammar does not parse or rejects its prefill.
    Sampler(const Model& model, const SamplingParams& params);
    ~Sampler();
    Sampler(const Sampler&) = delete;
    Sampler& operator=(const Sampler&) = delete;

    Token sample(InferenceContext& context, int32_t batch_index);
    // Feed prompt tokens to history-aware samplers (penalties).
    void accept(Token token);

  private:
    llama_sampler* chain_ = nullptr;
};

}  // namespace skippy::runtime
