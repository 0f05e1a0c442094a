#include "runtime/sampler.h"

#include <stdexcept>

#include "llama.h"

namespace skippy::runtime {

Sampler::Sampler(const Model& model, const SamplingParams& params) {
    chain_ = llama_sampler_chain_init(llama_sampler_chain_default_params());
    if (!params.grammar.empty()) {
        llama_sampler* grammar =
            llama_sampler_init_grammar(model.vocab(), params.grammar.c_str(), "root");
        if (grammar == nullptr) {
            llama_sampler_free(chain_);
            chain_ = nullptr;
            throw std::invalid_argument("grammar failed to parse");
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
