#include "server/api/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace skippy::server {

using nlohmann::json;

void LogprobCollector::on_sampled(runtime::Token token) {
    TokenLogprob entry;
    entry.token = token;
    if (!logits_.empty()) {
        const float max = *std::max_element(logits_.begin(), logits_.end());
        double sum = 0;
        for (const float l : logits_) {
            sum += std::exp(static_cast<double>(l - max));
        }
        const auto lse = static_cast<float>(max + std::log(sum));
        if (token >= 0 && static_cast<size_t>(token) < logits_.size()) {
            entry.logprob = logits_[static_cast<size_t>(token)] - lse;
        }
        const size_t k = std::min<size_t>(static_cast<size_t>(std::max(top_n_, 0)), logits_.size());
        if (k > 0) {
            std::vector<int32_t> ids(logits_.size());
            std::iota(ids.begin(), ids.end(), 0);
            const auto better = [&](int32_t a, int32_t b) {
                const float la = logits_[static_cast<size_t>(a)];
                const float lb = logits_[static_cast<size_t>(b)];
                return la != lb ? la > lb : a < b;
            };
            std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                              better);
            for (size_t i = 0; i < k; ++i) {
                entry.top.emplace_back(ids[i], logits_[static_cast<size_t>(ids[i])] - lse);
            }
        }
    }
    logits_ = {};
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.push_back(std::move(entry));
}

std::vector<TokenLogprob> LogprobCollector::take(size_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t end = std::min(entries_.size(), taken_ + n);
    std::vector<TokenLogprob> out(entries_.begin() + static_cast<std::ptrdiff_t>(taken_),
                                  entries_.begin() + static_cast<std::ptrdiff_t>(end));
    taken_ = end;
    return out;
}

namespace {

json bytes_of(const std::string& text) {
    json bytes = json::array();
    for (const char c : text) {
        bytes.push_back(static_cast<int>(static_cast<unsigned char>(c)));
    }
    return bytes;
}

double finite(float logprob) {
    // JSON has no -inf: a token the model gives no chance at all reports the lowest double.
    return std::isfinite(logprob) ? static_cast<double>(logprob)
                                  : -std::numeric_limits<double>::max();
}

}  // namespace

json chat_logprobs_content(const runtime::Model& model, const std::vector<TokenLogprob>& entries) {
    json content = json::array();
    for (const auto& entry : entries) {
        const std::string text = model.token_to_piece(entry.token, true);
        json top = json::array();
        for (const auto& [token, logprob] : entry.top) {
            const std::string t = model.token_to_piece(token, true);
            top.push_back(json{{"token", t}, {"logprob", finite(logprob)}, {"bytes", bytes_of(t)}});
        }
        content.push_back(json{{"token", text},
                               {"logprob", finite(entry.logprob)},
                               {"bytes", bytes_of(text)},
                               {"top_logprobs", top}});
    }
    return content;
}

json completion_logprobs(const runtime::Model& model, const std::vector<TokenLogprob>& entries,
                         size_t offset) {
    json tokens = json::array();
    json token_logprobs = json::array();
    json top_logprobs = json::array();
    json text_offset = json::array();
    for (const auto& entry : entries) {
        const std::string text = model.token_to_piece(entry.token, true);
        tokens.push_back(text);
        token_logprobs.push_back(finite(entry.logprob));
        json top = json::object();
        for (const auto& [token, logprob] : entry.top) {
            top[model.token_to_piece(token, true)] = finite(logprob);
        }
        top_logprobs.push_back(top);
        text_offset.push_back(offset);
        offset += text.size();
    }
    return json{{"tokens", tokens},
                {"token_logprobs", token_logprobs},
                {"top_logprobs", top_logprobs},
                {"text_offset", text_offset}};
}

}  // namespace skippy::server
