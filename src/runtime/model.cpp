#include "runtime/model.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <stdexcept>

#include "ggml-backend.h"
#include "gguf.h"
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

// The device list for llama_model_params::devices (null-terminated): {nullptr} = none (CPU
// only), empty = llama.cpp's default choice. With a row split and no device named, the
// default choice is spelled out (the rpc-servers' devices, then the GPUs), so that the split
// by free memory can be named.
std::vector<ggml_backend_dev_t> load_devices(const ModelLoadOptions& options) {
    const bool none = options.devices.size() == 1 && options.devices[0] == "none";
    if (options.n_gpu_layers == 0 || none) {
        return {nullptr};
    }
    std::vector<ggml_backend_dev_t> out;
    if (!options.devices.empty()) {
        for (const auto& name : options.devices) {
            ggml_backend_dev_t dev = ggml_backend_dev_by_name(name.c_str());
            if (dev == nullptr || ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
                std::string known;
                for (const auto& d : available_devices()) {
                    known += (known.empty() ? "" : ", ") + d.label();
                }
                throw std::runtime_error("--device: no device '" + name + "' (available: " +
                                         (known.empty() ? std::string("none") : known) + ")");
            }
            out.push_back(dev);
        }
    } else if (options.split_mode == SplitMode::Row && options.tensor_split.empty()) {
        std::vector<ggml_backend_dev_t> gpus;
        for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
            ggml_backend_dev_t dev = ggml_backend_dev_get(i);
            if (ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_GPU) {
                continue;
            }
            ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
            const bool rpc = reg != nullptr && std::string(ggml_backend_reg_name(reg)) == "RPC";
            (rpc ? out : gpus).push_back(dev);
        }
        out.insert(out.end(), gpus.begin(), gpus.end());
        if (out.empty()) {
            return {};
        }
    } else {
        return {};
    }
    out.push_back(nullptr);
    return out;
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

namespace {

// Model load progress on the terminal (stderr is a TTY): one line rewritten in place, every
// 5 %; nothing when stderr is a file or a pipe (logs and tests read whole lines).
bool terminal_load_progress(float progress, void* user_data) {
    auto* last = static_cast<int*>(user_data);
    const int percent = static_cast<int>(progress * 100.0f);
    if (percent >= *last + 5 || (percent == 100 && *last != 100)) {
        *last = percent;
        std::fprintf(stderr, "\rskippy: loading model %3d%%%s", percent,
                     percent == 100 ? "\n" : "");
        std::fflush(stderr);
    }
    return true;
}

// Whether the model at `path` keeps recurrent state (hybrid or recurrent): read from its
// metadata and vocabulary alone, without its weights.
bool has_recurrent_state(const std::string& path) {
    llama_model_params params = llama_model_default_params();
    params.vocab_only = true;
    params.n_gpu_layers = 0;
    llama_model* probe = llama_model_load_from_file(path.c_str(), params);
    if (probe == nullptr) {
        return false;  // (the real load reports the problem)
    }
    const bool recurrent = llama_model_is_recurrent(probe) || llama_model_is_hybrid(probe);
    llama_model_free(probe);
    return recurrent;
}

// Whether the file has weights of a type llama.cpp's CPU backend repacks on some CPU (x86 with
// AVX2: Q4_0, Q4_K, IQ4_NL, MXFP4; Arm and RISC-V also Q8_0, Q2_K, Q5_K, Q6_K). Without any,
// repacking changes nothing and prefill needs no padding.
bool has_repackable_weights(const std::string& path) {
    gguf_init_params params{true, nullptr};
    gguf_context* ctx = gguf_init_from_file(path.c_str(), params);
    if (ctx == nullptr) {
        return false;
    }
    bool any = false;
    for (int64_t i = 0; i < gguf_get_n_tensors(ctx) && !any; ++i) {
        switch (gguf_get_tensor_type(ctx, i)) {
            case GGML_TYPE_Q4_0:
            case GGML_TYPE_Q4_K:
            case GGML_TYPE_IQ4_NL:
            case GGML_TYPE_MXFP4:
            case GGML_TYPE_Q8_0:
            case GGML_TYPE_Q2_K:
            case GGML_TYPE_Q5_K:
            case GGML_TYPE_Q6_K:
                any = true;
                break;
            default:
                break;
        }
    }
    gguf_free(ctx);
    return any;
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& path, const ModelLoadOptions& options) {
    ensure_backend_initialized();
    std::unique_ptr<Model> model(new Model());
    model->path_ = path;
    model->weights_digest_ = digest_file(path);
    llama_model_params params = llama_model_default_params();
    std::vector<ggml_backend_dev_t> devices = load_devices(options);
    params.devices = devices.empty() ? nullptr : devices.data();
    params.n_gpu_layers = options.n_gpu_layers < 0 ? -1 : options.n_gpu_layers;  // -1: all
    params.split_mode = options.split_mode == SplitMode::None  ? LLAMA_SPLIT_MODE_NONE
                        : options.split_mode == SplitMode::Row ? LLAMA_SPLIT_MODE_ROW
                                                               : LLAMA_SPLIT_MODE_LAYER;
    params.main_gpu = options.main_gpu;
    std::vector<float> split = options.tensor_split;
    if (split.empty() && options.split_mode == SplitMode::Row && devices.size() > 1) {
        // llama.cpp would split rows by the devices' free memory at this moment; name the
        // proportions, so that the identity records what the rows were split by.
        for (size_t i = 0; i + 1 < devices.size(); ++i) {
            size_t free = 0;
            size_t total = 0;
            ggml_backend_dev_memory(devices[i], &free, &total);
            split.push_back(static_cast<float>(free));
        }
    }
    std::vector<float> split_arg(llama_max_devices(), 0.0f);
    std::copy_n(split.begin(), std::min(split.size(), split_arg.size()), split_arg.begin());
    params.tensor_split = split_arg.data();
    if (!options.use_mmap) {
        params.load_mode = LLAMA_LOAD_MODE_NONE;
    }
    const bool repackable = has_repackable_weights(path);
    bool repack = options.repack == ModelLoadOptions::Repack::On;
    if (options.repack == ModelLoadOptions::Repack::Auto) {
        repack = repackable && !has_recurrent_state(path);
    }
    params.use_extra_bufts = repack;
    model->repacked_ = repack && repackable;
    int last_percent = -5;
    if (::isatty(STDERR_FILENO) != 0) {
        params.progress_callback = terminal_load_progress;
        params.progress_callback_user_data = &last_percent;
    }
    model->model_ = llama_model_load_from_file(path.c_str(), params);
    if (model->model_ == nullptr) {
        throw std::runtime_error("failed to load GGUF model: " + path +
                                 (devices.size() == 1 ? std::string()
                                                      : " (on its devices: set SKIPPY_LLAMA_LOG=1 "
                                                        "for llama.cpp's reason)"));
    }
    model->placement_ = read_placement(model->model_, options.split_mode, split, options.main_gpu);
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
