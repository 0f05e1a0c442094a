#include "runtime/model.h"

#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <stdexcept>

#include "llama.h"

namespace skippy::runtime {

std::string_view model_kind_name(ModelKind kind) {
    switch (kind) {
        case ModelKind::Dense:
            return "dense";
        case ModelKind::Swa:
            return "swa";
        case ModelKind::Hybrid:
            return "hybrid";
        case ModelKind::Recurrent:
            return "recurrent";
    }
    return "unknown";
}

namespace {

void log_callback(ggml_log_level level, const char* text, void* /*user_data*/) {
    static const bool verbose = [] {
        const char* env = std::getenv("SKIPPY_LLAMA_LOG");
        return env != nullptr && std::string(env) == "1";
    }();
    if (verbose || level == GGML_LOG_LEVEL_ERROR) {
        std::fputs(text, stderr);
    }
}

std::string digest_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        throw std::runtime_error("cannot open model file: " + path);
    }
    XXH3_state_t* state = XXH3_createState();
    XXH3_128bits_reset(state);
    std::vector<char> buffer(1 << 20);
    while (in) {
        in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
        const auto got = in.gcount();
        if (got > 0) {
            XXH3_128bits_update(state, buffer.data(), static_cast<size_t>(got));
        }
    }
    const XXH128_hash_t hash = XXH3_128bits_digest(state);
    XXH3_freeState(state);
    char hex[40];
    std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(hash.high64),
                  static_cast<unsigned long long>(hash.low64));
    return std::string("xxh3-128:") + hex;
}

}  // namespace

void ensure_backend_initialized() {
    static std::once_flag once;
    std::call_once(once, [] {
        llama_log_set(log_callback, nullptr);
        llama_backend_init();
    });
}

bool silent_load_progress(float /*progress*/, void* /*user_data*/) { return true; }

std::unique_ptr<Model> Model::load(const std::string& path, const ModelLoadOptions& options) {
    ensure_backend_initialized();
    std::unique_ptr<Model> model(new Model());
    model->path_ = path;
    model->weights_digest_ = digest_file(path);
    llama_model_params params = llama_model_default_params();
    params.n_gpu_layers = options.n_gpu_layers;
    if (!options.use_mmap) {
        params.load_mode = LLAMA_LOAD_MODE_NONE;
    }
    model->model_ = llama_model_load_from_file(path.c_str(), params);
    if (model->model_ == nullptr) {
        throw std::runtime_error("failed to load GGUF model: " + path);
    }
    model->vocab_ = llama_model_get_vocab(model->model_);
    model->arch_ = model->metadata("general.architecture");
    model->name_ = model->metadata("general.name");
    if (model->name_.empty()) {
        model->name_ = model->arch_;
    }
    if (llama_model_is_recurrent(model->model_)) {
        model->kind_ = ModelKind::Recurrent;
    } else if (llama_model_is_hybrid(model->model_)) {
        model->kind_ = ModelKind::Hybrid;
    } else if (llama_model_n_swa(model->model_) > 0) {
        model->kind_ = ModelKind::Swa;
    } else {
        model->kind_ = ModelKind::Dense;
    }
    return model;
}

Model::~Model() {
    if (model_ != nullptr) {
        llama_model_free(model_);
    }
}

std::vector<Token> Model::tokenize(std::string_view text, bool add_special,
                                   bool parse_special) const {
    if (text.size() > static_cast<size_t>(INT32_MAX / 2)) {
        throw std::invalid_argument("text too long to tokenize");
    }
    const auto text_len = static_cast<int32_t>(text.size());
    std::vector<Token> tokens(text.size() + 8);
    int32_t n = llama_tokenize(vocab_, text.data(), text_len, tokens.data(),
                               static_cast<int32_t>(tokens.size()), add_special, parse_special);
    if (n < 0) {
        if (n == INT32_MIN) {
            throw std::invalid_argument("tokenization overflow");
        }
        tokens.resize(static_cast<size_t>(-n));
        n = llama_tokenize(vocab_, text.data(), text_len, tokens.data(),
                           static_cast<int32_t>(tokens.size()), add_special, parse_special);
        if (n < 0) {
            throw std::runtime_error("tokenization failed");
        }
    }
    tokens.resize(static_cast<size_t>(n));
    return tokens;
}

std::string Model::token_to_piece(Token token, bool render_special) const {
    char buf[256];
    int32_t n = llama_token_to_piece(vocab_, token, buf, sizeof buf, 0, render_special);
    if (n >= 0) {
        return std::string(buf, static_cast<size_t>(n));
    }
    std::string out(static_cast<size_t>(-n), '\0');
    n = llama_token_to_piece(vocab_, token, out.data(), static_cast<int32_t>(out.size()), 0,
                             render_special);
    out.resize(n > 0 ? static_cast<size_t>(n) : 0);
    return out;
}

std::string Model::detokenize(std::span<const Token> tokens, bool render_special) const {
    std::string out;
    for (Token token : tokens) {
        out += token_to_piece(token, render_special);
    }
    return out;
}

bool Model::is_end_of_generation(Token token) const { return llama_vocab_is_eog(vocab_, token); }
bool Model::is_special_token(Token token) const {
    return is_valid_token(token) &&
           (llama_vocab_get_attr(vocab_, token) &
            (LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_USER_DEFINED)) != 0;
}
bool Model::strips_left(Token token) const {
    return is_valid_token(token) &&
           (llama_vocab_get_attr(vocab_, token) & LLAMA_TOKEN_ATTR_LSTRIP) != 0;
}
int32_t Model::n_vocab() const { return llama_vocab_n_tokens(vocab_); }
uint32_t Model::n_ctx_train() const {
    return static_cast<uint32_t>(llama_model_n_ctx_train(model_));
}
int32_t Model::n_layer() const { return llama_model_n_layer(model_); }
int32_t Model::n_swa() const { return llama_model_n_swa(model_); }
uint64_t Model::n_params() const { return llama_model_n_params(model_); }
uint64_t Model::kv_elements_per_cell() const {
    if (kind_ != ModelKind::Dense && kind_ != ModelKind::Swa) {
        return 0;
    }
    const int32_t n_head = llama_model_n_head(model_);
    const auto fallback = n_head > 0 ? llama_model_n_embd(model_) / n_head : 0;
    auto head_size = [&](const char* key) -> uint64_t {
        const std::string value = metadata(arch_ + ".attention." + key);
        return value.empty() ? static_cast<uint64_t>(fallback) : std::stoull(value);
    };
    const auto per_layer = static_cast<uint64_t>(llama_model_n_head_kv(model_)) *
                           (head_size("key_length") + head_size("value_length"));
    return per_layer * static_cast<uint64_t>(llama_model_n_layer(model_));
}
uint64_t Model::size_bytes() const { return llama_model_size(model_); }

std::string Model::metadata(const std::string& key) const {
    char buf[512];
    const int32_t n = llama_model_meta_val_str(model_, key.c_str(), buf, sizeof buf);
    if (n < 0) {
        return "";
    }
    if (static_cast<size_t>(n) < sizeof buf) {
        return std::string(buf, static_cast<size_t>(n));
    }
    std::string out(static_cast<size_t>(n) + 1, '\0');
    llama_model_meta_val_str(model_, key.c_str(), out.data(), out.size());
    out.resize(static_cast<size_t>(n));
    return out;
}

}  // namespace skippy::runtime
