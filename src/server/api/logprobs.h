// Log probabilities of generated tokens (OpenAI `logprobs` / `top_logprobs`): the
// log-softmax of the logits each token was sampled from (the model's distribution, before
// temperature, penalties or grammar, as llama-server reports it).
//
// Thread safety: on_logits/on_sampled run on the scheduler thread (GenerationRequest hooks);
// take() runs on the HTTP handler thread; `entries_` is guarded by a mutex. The logits span
// is only used between on_logits and the on_sampled call that follows it, on the scheduler
// thread, while llama.cpp's logits buffer is unchanged.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/model.h"

namespace skippy::server {

struct TokenLogprob {
    runtime::Token token = 0;
    float logprob = 0;
    std::vector<std::pair<runtime::Token, float>> top;  // most likely first
};

class LogprobCollector {
  public:
    explicit LogprobCollector(int top_n) : top_n_(top_n) {}

    // ---- scheduler thread ----
    void on_logits(std::span<const float> logits) { logits_ = logits; }
    void on_sampled(runtime::Token token);

    // ---- consumer ----
    // The next `n` entries (fewer if not recorded yet), in generation order.
    std::vector<TokenLogprob> take(size_t n);

  private:
    int top_n_;
    std::span<const float> logits_;
    std::mutex mutex_;
    std::vector<TokenLogprob> entries_;
    size_t taken_ = 0;
};

// OpenAI chat format: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}].
nlohmann::json chat_logprobs_content(const runtime::Model& model,
                                     const std::vector<TokenLogprob>& entries);
// OpenAI completions format: {tokens, token_logprobs, top_logprobs: [{text: logprob}],
// text_offset}, offsets counted from `offset`.
nlohmann::json completion_logprobs(const runtime::Model& model,
                                   const std::vector<TokenLogprob>& entries, size_t offset);

}  // namespace skippy::server
