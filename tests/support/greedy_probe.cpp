#include "greedy_probe.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "chat.h"
#include "llama.h"
#include "runtime/model.h"

namespace skippy::runtime {
namespace {

struct ModelDeleter {
    void operator()(llama_model* m) const { llama_model_free(m); }
};
struct ContextDeleter {
    void operator()(llama_context* c) const { llama_free(c); }
};
using ModelPtr = std::unique_ptr<llama_model, ModelDeleter>;
using ContextPtr = std::unique_ptr<llama_context, ContextDeleter>;

[[noreturn]] void fail(const std::string& what) {
    throw std::runtime_error("greedy probe: " + what);
}

// ----- log silencing (process-global llama.cpp state, so reference counted) -----

std::mutex g_log_mutex;
int g_log_depth = 0;
ggml_log_callback g_prev_cb = nullptr;
void* g_prev_ud = nullptr;

void quiet_log_callback(ggml_log_level level, const char* text, void* /*user_data*/) {
    if (level == GGML_LOG_LEVEL_ERROR && text != nullptr) {
        std::fputs(text, stderr);
    }
}

bool llama_log_wanted() {
    const char* env = std::getenv("SKIPPY_LLAMA_LOG");
    return env != nullptr && std::strcmp(env, "1") == 0;
}

std::string meta_str(const llama_model* model, const char* key) {
    char buf[512];
    const int32_t n = llama_model_meta_val_str(model, key, buf, sizeof(buf));
    if (n < 0) {
        return {};
    }
    if (static_cast<size_t>(n) < sizeof(buf)) {
        return std::string(buf, static_cast<size_t>(n));
    }
    std::string big(static_cast<size_t>(n) + 1, '\0');
    llama_model_meta_val_str(model, key, big.data(), big.size());
    big.resize(static_cast<size_t>(n));
    return big;
}

ModelPtr load_model(const std::string& path, int32_t n_gpu_layers, bool vocab_only) {
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = n_gpu_layers;
    mp.vocab_only = vocab_only;
    mp.progress_callback = silent_load_progress;
    ModelPtr model(llama_model_load_from_file(path.c_str(), mp));
    if (!model) {
        fail("cannot load model " + path + " (set SKIPPY_LLAMA_LOG=1 for llama.cpp's reason)");
    }
    return model;
}

std::vector<llama_token> tokenize(const llama_vocab* vocab, const std::string& text) {
    const auto len = static_cast<int32_t>(text.size());
    int32_t n = llama_tokenize(vocab, text.data(), len, nullptr, 0, true, true);
    if (n == INT32_MIN) {
        fail("prompt too long to tokenize");
    }
    std::vector<llama_token> tokens(static_cast<size_t>(n < 0 ? -n : n));
    n = llama_tokenize(vocab, text.data(), len, tokens.data(), static_cast<int32_t>(tokens.size()),
                       true, true);
    if (n < 0) {
        fail("tokenization failed");
    }
    tokens.resize(static_cast<size_t>(n));
    return tokens;
}

std::string piece(const llama_vocab* vocab, llama_token token) {
    char buf[256];
    const int32_t n = llama_token_to_piece(vocab, token, buf, sizeof(buf), 0, true);
    if (n < 0) {
        std::string big(static_cast<size_t>(-n), '\0');
        const int32_t m = llama_token_to_piece(vocab, token, big.data(),
                                               static_cast<int32_t>(big.size()), 0, true);
        big.resize(static_cast<size_t>(m < 0 ? 0 : m));
        return big;
    }
    return std::string(buf, static_cast<size_t>(n));
}

}  // namespace

ScopedLlamaLogSilencer::ScopedLlamaLogSilencer() {
    if (llama_log_wanted()) {
        return;
    }
    const std::lock_guard<std::mutex> lock(g_log_mutex);
    if (g_log_depth++ == 0) {
        llama_log_get(&g_prev_cb, &g_prev_ud);
        llama_log_set(quiet_log_callback, nullptr);
    }
    active_ = true;
}

ScopedLlamaLogSilencer::~ScopedLlamaLogSilencer() {
    if (!active_) {
        return;
    }
    const std::lock_guard<std::mutex> lock(g_log_mutex);
    if (--g_log_depth == 0) {
        llama_log_set(g_prev_cb, g_prev_ud);
    }
}

GreedyResult greedy_probe(const std::string& model_path, const std::string& prompt_text,
                          int n_predict, const GreedyProbeOptions& options) {
    if (n_predict < 0) {
        fail("n_predict must be >= 0");
    }
    if (options.n_ctx == 0 || options.n_batch == 0 || options.n_threads == 0) {
        fail("n_ctx, n_batch and n_threads must be > 0");
    }
    ensure_backend_initialized();  // before the silencer, so it restores our logger
    ScopedLlamaLogSilencer quiet;

    ModelPtr model = load_model(model_path, options.n_gpu_layers, false);
    const llama_vocab* vocab = llama_model_get_vocab(model.get());

    GreedyResult r;
    r.arch = meta_str(model.get(), "general.architecture");
    r.name = meta_str(model.get(), "general.name");
    r.is_recurrent = llama_model_is_recurrent(model.get());
    r.is_hybrid = llama_model_is_hybrid(model.get());
    r.n_vocab = llama_vocab_n_tokens(vocab);
    r.n_params = llama_model_n_params(model.get());
    r.model_size = llama_model_size(model.get());

    std::vector<llama_token> prompt = tokenize(vocab, prompt_text);
    if (prompt.empty()) {
        fail("prompt tokenizes to nothing");
    }
    if (prompt.size() + static_cast<size_t>(n_predict) > options.n_ctx) {
        fail("prompt (" + std::to_string(prompt.size()) + " tokens) + n_predict (" +
             std::to_string(n_predict) + ") exceeds n_ctx " + std::to_string(options.n_ctx));
    }
    r.prompt_tokens.assign(prompt.begin(), prompt.end());

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = options.n_ctx;
    cp.n_batch = options.n_batch;
    cp.n_ubatch = options.n_batch;
    cp.n_seq_max = 1;
    cp.n_threads = static_cast<int32_t>(options.n_threads);
    cp.n_threads_batch = static_cast<int32_t>(options.n_threads);
    cp.no_perf = true;
    ContextPtr ctx(llama_init_from_model(model.get(), cp));
    if (!ctx) {
        fail("cannot create a context for " + model_path);
    }

    const auto n_vocab = static_cast<size_t>(r.n_vocab);
    // Returns the argmax of the logits of the last evaluated token; checks finiteness.
    const auto argmax_last = [&]() -> llama_token {
        const float* logits = llama_get_logits_ith(ctx.get(), -1);
        if (logits == nullptr) {
            fail("no logits after decode");
        }
        size_t best = 0;
        for (size_t i = 0; i < n_vocab; ++i) {
            if (!std::isfinite(logits[i])) {
                r.all_finite = false;
            }
            if (logits[i] > logits[best]) {
                best = i;
            }
        }
        return static_cast<llama_token>(best);
    };

    for (size_t pos = 0; pos < prompt.size(); pos += options.n_batch) {
        const size_t n = std::min<size_t>(options.n_batch, prompt.size() - pos);
        llama_batch batch = llama_batch_get_one(prompt.data() + pos, static_cast<int32_t>(n));
        if (llama_decode(ctx.get(), batch) != 0) {
            fail("llama_decode failed on the prompt");
        }
    }

    for (int i = 0; i < n_predict; ++i) {
        llama_token next = argmax_last();
        r.tokens.push_back(next);
        r.text += piece(vocab, next);
        if (options.stop_at_eog && llama_vocab_is_eog(vocab, next)) {
            break;
        }
        if (i + 1 == n_predict) {
            break;  // the last token needs no decode
        }
        llama_batch batch = llama_batch_get_one(&next, 1);
        if (llama_decode(ctx.get(), batch) != 0) {
            fail("llama_decode failed at generated token " + std::to_string(i));
        }
    }
    r.seq_state_size = llama_state_seq_get_size(ctx.get(), 0);
    return r;
}

std::vector<int32_t> greedy_generate(const std::string& model_path, const std::string& prompt_text,
                                     int n_predict, const GreedyProbeOptions& options) {
    return greedy_probe(model_path, prompt_text, n_predict, options).tokens;
}

std::string render_chat_prompt(const std::string& model_path,
                               const std::vector<std::pair<std::string, std::string>>& messages,
                               bool add_generation_prompt) {
    ensure_backend_initialized();  // before the silencer, so it restores our logger
    ScopedLlamaLogSilencer quiet;
    ModelPtr model = load_model(model_path, 0, true);
    try {
        common_chat_templates_ptr tmpls = common_chat_templates_init(model.get(), "");
        if (!tmpls) {
            fail("no chat template in " + model_path);
        }
        common_chat_templates_inputs inputs;
        inputs.use_jinja = true;
        inputs.add_generation_prompt = add_generation_prompt;
        for (const auto& [role, content] : messages) {
            common_chat_msg msg;
            msg.role = role;
            msg.content = content;
            inputs.messages.push_back(std::move(msg));
        }
        return common_chat_templates_apply(tmpls.get(), inputs).prompt;
    } catch (const std::runtime_error&) {
        throw;
    } catch (const std::exception& e) {
        fail(std::string("chat template rendering failed: ") + e.what());
    }
}

}  // namespace skippy::runtime
