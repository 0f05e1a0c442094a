#include "runtime/sampler.h"

#include <stdexcept>
#include <vector>

#include "llama.h"

namespace skippy::runtime {

Sampler::Sampler(const Model& model, const SamplingParams& params) {
    chain_ = llama_sampler_chain_init(llama_sampler_chain_default_params());
    if (!params.logit_bias.empty()) {
        std::vector<llama_logit_bias> biases;
        for (const auto& [token, bias] : params.logit_bias) {
            biases.push_back(llama_logit_bias{token, bias});
        }
        llama_sampler_chain_add(
            chain_, llama_sampler_init_logit_bias(
                        model.n_vocab(), static_cast<int32_t>(biases.size()), biases.data()));
    }
    if (!params.grammar.empty()) {
        llama_sampler* grammar = nullptr;
        if (params.grammar_lazy) {
            std::vector<const char*> patterns;
            for (const auto& p : params.grammar_trigger_patterns) {
                patterns.push_back(p.c_str());
            }
            grammar = llama_sampler_init_grammar_lazy_patterns(
                model.vocab(), params.grammar.c_str(), "root", patterns.data(), patterns.size(),
                params.grammar_trigger_tokens.data(), params.grammar_trigger_tokens.size());
        } else {
            grammar = llama_sampler_init_grammar(model.vocab(), params.grammar.c_str(), "root");
        }
        if (grammar == nullptr) {
            llama_sampler_free(chain_);
            chain_ = nullptr;
            throw std::invalid_argument("grammar failed to parse");
        }
        try {
            for (const Token token : params.grammar_prefill) {
                llama_sampler_accept(grammar, token);
            }
        } catch (const std::exception& e) {
            llama_sampler_free(grammar);
            llama_sampler_free(chain_);
            chain_ = nullptr;
            throw std::invalid_argument(std::string("grammar rejects its prefill: ") + e.what());
        }
        llama_sampler_chain_add(chain_, grammar);
    }
    if (params.repeat_penalty != 1.0f || params.presence_penalty != 0.0f ||
        params.frequency_penalty != 0.0f) {
        llama_sampler_chain_add(
            chain_, llama_sampler_init_penalties(model.n_vocab(), params.penalty_last_n,
                                                 params.repeat_penalty, params.frequency_penalty,
                                                 params.presence_penalty));
    }
    if (params.is_greedy()) {
        llama_sampler_chain_add(chain_, llama_sampler_init_greedy());
        return;
    }
    if (params.top_k > 0) {
        llama_sampler_chain_add(chain_, llama_sampler_init_top_k(params.top_k));
    }
    if (params.top_p < 1.0f) {
        llama_sampler_chain_add(chain_, llama_sampler_init_top_p(params.top_p, 1));
    }
    if (params.min_p > 0.0f) {
        llama_sampler_chain_add(chain_, llama_sampler_init_min_p(params.min_p, 1));
    }
    llama_sampler_chain_add(chain_, llama_sampler_init_temp(params.temperature));
    llama_sampler_chain_add(chain_, llama_sampler_init_dist(params.seed));
}

Sampler::~Sampler() {
    if (chain_ != nullptr) {
        llama_sampler_free(chain_);
    }
}

Token Sampler::sample(InferenceContext& context, int32_t batch_index) {
    // llama_sampler_sample also accepts the sampled token into the chain.
    return llama_sampler_sample(chain_, context.raw(), batch_index);
}

void Sampler::accept(Token token) { llama_sampler_accept(chain_, token); }

}  // namespace skippy::runtime
