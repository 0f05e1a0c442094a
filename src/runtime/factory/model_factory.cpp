#include "runtime/factory/model_factory.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <system_error>

#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"
#include "runtime/model.h"

namespace skippy::runtime {
namespace {

namespace fs = std::filesystem;

constexpr const char* kArchLlama = "llama";
constexpr const char* kArchQwen35 = "qwen35";
constexpr const char* kArchMamba2 = "mamba2";

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("make-model: " + what); }

// ---------------------------------------------------------------------------------------
// Deterministic, platform-independent random numbers (no std::hash, no std::*_distribution).

uint64_t fnv1a64(std::string_view s) {
    uint64_t h = 14695981039346656037ull;
    for (const unsigned char c : s) {
        h ^= c;
        h *= 1099511628211ull;
    }
    return h;
}

class SplitMix64 {
  public:
    explicit SplitMix64(uint64_t seed) : state_(seed) {}

    uint64_t next() {
        uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }

    // Uniform in [0, 1).
    double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

    // Standard normal (Box-Muller).
    double normal() {
        if (has_spare_) {
            has_spare_ = false;
            return spare_;
        }
        const double u1 = 1.0 - uniform();  // (0, 1]
        const double u2 = uniform();
        const double r = std::sqrt(-2.0 * std::log(u1));
        const double theta = 2.0 * 3.14159265358979323846 * u2;
        spare_ = r * std::sin(theta);
        has_spare_ = true;
        return r * std::cos(theta);
    }

  private:
    uint64_t state_;
    double spare_ = 0.0;
    bool has_spare_ = false;
};

// ---------------------------------------------------------------------------------------
// Tensor initialization.

struct InitContext {
    uint64_t seed = 0;
    float init_std = 0.02f;
    float init_gain = 1.0f;
    std::string error;  // first failure inside the C callback (exceptions must not cross it)
};

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool contains(std::string_view s, std::string_view part) {
    return s.find(part) != std::string_view::npos;
}

// Fills `values` (the tensor's elements in memory order) for the tensor called `name`.
void init_values(const InitContext& ic, std::string_view name, int64_t ne0, int n_dims,
                 std::vector<float>& values) {
    SplitMix64 rng(ic.seed ^ fnv1a64(name));
    // Warm up so that nearby seeds decorrelate.
    rng.next();
    const auto fill = [&](auto&& gen) {
        for (float& v : values) {
            v = static_cast<float>(gen());
        }
    };
    if (ends_with(name, ".ssm_a")) {
        // GGUF stores A = -exp(A_log) already (mamba2 and the qwen35 gated delta net):
        // negative decay rates in [-16, -1].
        fill([&] { return -(1.0 + 15.0 * rng.uniform()); });
    } else if (ends_with(name, ".ssm_d")) {
        // mamba2 skip connection D (trained models: ~1). 0.1 keeps the skip path from
        // drowning the state path, so random models depend on the whole context.
        fill([] { return 0.1; });
    } else if (ends_with(name, ".ssm_dt.bias")) {
        // Mamba init: dt = exp(U(log 1e-3, log 1e-1)), bias = softplus^-1(dt), so the
        // per-step decay exp(dt * A) spreads from ~0.2 to ~0.999: short and long memory
        // heads. Used for the qwen35 gated delta net too (its HF init, dt_bias = 1 with
        // A in [-16, -1], forgets almost everything after one token).
        fill([&] {
            const double lo = std::log(1e-3);
            const double hi = std::log(1e-1);
            const double dt = std::exp(lo + (hi - lo) * rng.uniform());
            return dt + std::log(-std::expm1(-dt));
        });
    } else if (contains(name, "rope_freqs") || contains(name, "rope_factors") ||
               ends_with(name, ".scale") || ends_with(name, ".input_scale")) {
        fill([] { return 1.0; });  // neutral RoPE frequency factors / per-tensor scales
    } else if (contains(name, "norm")) {
        fill([] { return 1.0; });
    } else if (ends_with(name, ".bias")) {
        fill([] { return 0.0; });
    } else if (contains(name, "ssm_conv1d")) {
        // Depthwise conv: PyTorch-style U(-1/sqrt(k), 1/sqrt(k)) with k = kernel size.
        const double bound = 1.0 / std::sqrt(static_cast<double>(ne0 > 0 ? ne0 : 1));
        fill([&] { return bound * (2.0 * rng.uniform() - 1.0); });
    } else {
        // Embedding / LM head: small N(0, init_std), so logits are O(init_std * sqrt(n_embd)).
        // Hidden matrices: variance-preserving N(0, (init_gain / sqrt(fan_in))^2), so the
        // blocks' outputs are as large as the residual stream and the logits depend on the
        // whole context, not only on the last token (matters for cache/state tests).
        const bool io = name == "token_embd.weight" || name == "output.weight";
        const double stddev =
            io || n_dims < 2 ? static_cast<double>(ic.init_std)
                             : ic.init_gain / std::sqrt(static_cast<double>(ne0 > 0 ? ne0 : 1));
        fill([&] { return stddev * rng.normal(); });
    }
}

void set_tensor_data(ggml_tensor* tensor, void* userdata) {
    auto* ic = static_cast<InitContext*>(userdata);
    try {
        const int64_t n = ggml_nelements(tensor);
        std::vector<float> values(static_cast<size_t>(n));
        init_values(*ic, ggml_get_name(tensor), tensor->ne[0], ggml_n_dims(tensor), values);
        if (tensor->type == GGML_TYPE_F32) {
            ggml_backend_tensor_set(tensor, values.data(), 0, ggml_nbytes(tensor));
        } else if (tensor->type == GGML_TYPE_F16) {
            std::vector<ggml_fp16_t> half(values.size());
            ggml_fp32_to_fp16_row(values.data(), half.data(), n);
            ggml_backend_tensor_set(tensor, half.data(), 0, ggml_nbytes(tensor));
        } else if (ic->error.empty()) {
            ic->error = std::string("unexpected tensor type ") + ggml_type_name(tensor->type) +
                        " for " + ggml_get_name(tensor);
        }
    } catch (const std::exception& e) {
        if (ic->error.empty()) {
            ic->error = e.what();
        }
    }
}

// ---------------------------------------------------------------------------------------
// GGUF helpers.

struct GgufDeleter {
    void operator()(gguf_context* ctx) const { gguf_free(ctx); }
};
using GgufPtr = std::unique_ptr<gguf_context, GgufDeleter>;

struct GgmlDeleter {
    void operator()(ggml_context* ctx) const { ggml_free(ctx); }
};
using GgmlPtr = std::unique_ptr<ggml_context, GgmlDeleter>;

struct LlamaModelDeleter {
    void operator()(llama_model* m) const { llama_model_free(m); }
};

// Copies the key/value pair `key_id` of `src` into `dst` (overwriting a same-named key).
void copy_kv(gguf_context* dst, const gguf_context* src, int64_t key_id) {
    const char* key = gguf_get_key(src, key_id);
    switch (gguf_get_kv_type(src, key_id)) {
        case GGUF_TYPE_UINT8:
            gguf_set_val_u8(dst, key, gguf_get_val_u8(src, key_id));
            break;
        case GGUF_TYPE_INT8:
            gguf_set_val_i8(dst, key, gguf_get_val_i8(src, key_id));
            break;
        case GGUF_TYPE_UINT16:
            gguf_set_val_u16(dst, key, gguf_get_val_u16(src, key_id));
            break;
        case GGUF_TYPE_INT16:
            gguf_set_val_i16(dst, key, gguf_get_val_i16(src, key_id));
            break;
        case GGUF_TYPE_UINT32:
            gguf_set_val_u32(dst, key, gguf_get_val_u32(src, key_id));
            break;
        case GGUF_TYPE_INT32:
            gguf_set_val_i32(dst, key, gguf_get_val_i32(src, key_id));
            break;
        case GGUF_TYPE_FLOAT32:
            gguf_set_val_f32(dst, key, gguf_get_val_f32(src, key_id));
            break;
        case GGUF_TYPE_UINT64:
            gguf_set_val_u64(dst, key, gguf_get_val_u64(src, key_id));
            break;
        case GGUF_TYPE_INT64:
            gguf_set_val_i64(dst, key, gguf_get_val_i64(src, key_id));
            break;
        case GGUF_TYPE_FLOAT64:
            gguf_set_val_f64(dst, key, gguf_get_val_f64(src, key_id));
            break;
        case GGUF_TYPE_BOOL:
            gguf_set_val_bool(dst, key, gguf_get_val_bool(src, key_id));
            break;
        case GGUF_TYPE_STRING:
            gguf_set_val_str(dst, key, gguf_get_val_str(src, key_id));
            break;
        case GGUF_TYPE_ARRAY: {
            const gguf_type arr_type = gguf_get_arr_type(src, key_id);
            const size_t n = gguf_get_arr_n(src, key_id);
            if (arr_type == GGUF_TYPE_STRING) {
                std::vector<const char*> items(n);
                for (size_t i = 0; i < n; ++i) {
                    items[i] = gguf_get_arr_str(src, key_id, i);
                }
                gguf_set_arr_str(dst, key, items.data(), n);
            } else {
                gguf_set_arr_data(dst, key, arr_type, gguf_get_arr_data(src, key_id), n);
            }
            break;
        }
        default:
            fail(std::string("unsupported GGUF value type for key ") + key);
    }
}

bool is_tokenizer_key(std::string_view key) { return key.starts_with("tokenizer."); }

// Vocab variants: a vocab file of llama.cpp's models/ whose placeholder tokens get the names
// (and types) the real tokenizer gives them. llama.cpp's ggml-vocab-qwen2.gguf has the
// Qwen2 base vocabulary with [PAD151646]... placeholders where Qwen2.5 and Qwen3 have their
// added tokens (<tool_call>, <think>, ...): "qwen3" restores them at their real ids, so the
// Qwen2.5 and Qwen3 chat templates (tool calls, thinking) tokenize as with the real model.
struct AddedToken {
    int32_t id;  // a placeholder's id, or kAppend: a new token after the base vocabulary
    const char* text;
    bool control;  // special=true in the tokenizer's added_tokens (CONTROL), else USER_DEFINED
};
struct VocabVariant {
    const char* name;
    const char* base;
    std::vector<AddedToken> added;
};
constexpr int32_t kAppend = -1;
const std::vector<VocabVariant>& vocab_variants() {
    static const std::vector<VocabVariant> variants = {
        // The Llama 2 SentencePiece vocabulary with ChatML's two control tokens appended at
        // 32000 / 32001, as ChatML fine-tunes of 32k-SPM models have them (OpenHermes-2.5-
        // Mistral): a ChatML template then renders its message markers as special tokens,
        // where the tokenizer splits the text, as with every real ChatML model.
        {"llama-spm-chatml",
         "llama-spm",
         {{kAppend, "<|im_end|>", true}, {kAppend, "<|im_start|>", true}}},
        {"qwen3",
         "qwen2",
         {{151646, "<|object_ref_start|>", true},
          {151647, "<|object_ref_end|>", true},
          {151648, "<|box_start|>", true},
          {151649, "<|box_end|>", true},
          {151650, "<|quad_start|>", true},
          {151651, "<|quad_end|>", true},
          {151652, "<|vision_start|>", true},
          {151653, "<|vision_end|>", true},
          {151654, "<|vision_pad|>", true},
          {151655, "<|image_pad|>", true},
          {151656, "<|video_pad|>", true},
          {151657, "<tool_call>", false},
          {151658, "</tool_call>", false},
          {151659, "<|fim_prefix|>", false},
          {151660, "<|fim_middle|>", false},
          {151661, "<|fim_suffix|>", false},
          {151662, "<|fim_pad|>", false},
          {151663, "<|repo_name|>", false},
          {151664, "<|file_sep|>", false},
          {151665, "<tool_response>", false},
          {151666, "</tool_response>", false},
          {151667, "<think>", false},
          {151668, "</think>", false}}},
    };
    return variants;
}

const VocabVariant* find_vocab_variant(const std::string& name) {
    for (const auto& v : vocab_variants()) {
        if (name == v.name) {
            return &v;
        }
    }
    return nullptr;
}

// Renames the variant's placeholder tokens in the copied tokenizer keys of `dst` and appends
// its new ones; returns the token count.
uint32_t apply_vocab_variant(gguf_context* dst, const VocabVariant& variant) {
    const int64_t tokens_id = gguf_find_key(dst, "tokenizer.ggml.tokens");
    const int64_t types_id = gguf_find_key(dst, "tokenizer.ggml.token_type");
    if (tokens_id < 0 || types_id < 0 || gguf_get_arr_type(dst, types_id) != GGUF_TYPE_INT32) {
        fail(std::string("vocab '") + variant.base + "' has no token list and int32 token types");
    }
    const size_t n = gguf_get_arr_n(dst, tokens_id);
    std::vector<std::string> texts(n);
    for (size_t i = 0; i < n; ++i) {
        texts[i] = gguf_get_arr_str(dst, tokens_id, i);
    }
    const auto* types_data = static_cast<const int32_t*>(gguf_get_arr_data(dst, types_id));
    std::vector<int32_t> types(types_data, types_data + gguf_get_arr_n(dst, types_id));
    constexpr int32_t kControl = 3;      // LLAMA_TOKEN_TYPE_CONTROL
    constexpr int32_t kUserDefined = 4;  // LLAMA_TOKEN_TYPE_USER_DEFINED
    const int64_t scores_id = gguf_find_key(dst, "tokenizer.ggml.scores");
    std::vector<float> scores;
    if (scores_id >= 0 && gguf_get_arr_type(dst, scores_id) == GGUF_TYPE_FLOAT32) {
        const auto* data = static_cast<const float*>(gguf_get_arr_data(dst, scores_id));
        scores.assign(data, data + gguf_get_arr_n(dst, scores_id));
    }
    size_t n_appended = 0;
    for (const auto& token : variant.added) {
        if (token.id == kAppend) {
            texts.emplace_back(token.text);
            types.push_back(token.control ? kControl : kUserDefined);
            if (!scores.empty()) {
                scores.push_back(0.0f);  // (added tokens are matched whole, never merged)
            }
            ++n_appended;
            continue;
        }
        const auto i = static_cast<size_t>(token.id);
        if (i >= n || i >= types.size() || !texts[i].starts_with("[PAD")) {
            fail(std::string("vocab '") + variant.base + "' has no placeholder at id " +
                 std::to_string(token.id));
        }
        texts[i] = token.text;
        types[i] = token.control ? kControl : kUserDefined;
    }
    std::vector<const char*> items(texts.size());
    for (size_t i = 0; i < texts.size(); ++i) {
        items[i] = texts[i].c_str();
    }
    gguf_set_arr_str(dst, "tokenizer.ggml.tokens", items.data(), items.size());
    gguf_set_arr_data(dst, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types.data(),
                      types.size());
    if (n_appended > 0 && !scores.empty()) {
        gguf_set_arr_data(dst, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores.data(),
                          scores.size());
    }
    return static_cast<uint32_t>(texts.size());
}

// Copies every tokenizer.* key of the vocab file into `dst`; returns the token count.
uint32_t copy_tokenizer(gguf_context* dst, const gguf_context* vocab, const std::string& path) {
    const int64_t tokens_id = gguf_find_key(vocab, "tokenizer.ggml.tokens");
    if (tokens_id < 0 || gguf_get_kv_type(vocab, tokens_id) != GGUF_TYPE_ARRAY) {
        fail("vocab file has no tokenizer.ggml.tokens: " + path);
    }
    for (int64_t i = 0; i < gguf_get_n_kv(vocab); ++i) {
        if (is_tokenizer_key(gguf_get_key(vocab, i))) {
            copy_kv(dst, vocab, i);
        }
    }
    return static_cast<uint32_t>(gguf_get_arr_n(vocab, tokens_id));
}

GgufPtr open_gguf(const std::string& path, ggml_context** data_ctx) {
    gguf_init_params params{};
    params.no_alloc = data_ctx == nullptr;
    params.ctx = data_ctx;
    GgufPtr ctx(gguf_init_from_file(path.c_str(), params));
    if (!ctx) {
        fail("cannot read GGUF " + path);
    }
    return ctx;
}

// Matrices stored as F16 when spec.f16: 2-D+ ".weight" tensors other than norms and the
// SSM convolution (ggml_ssm_conv wants F32), like convert_hf_to_gguf.py does.
bool convert_to_f16(const ggml_tensor* t) {
    const std::string_view name = ggml_get_name(t);
    return t->type == GGML_TYPE_F32 && ggml_n_dims(t) >= 2 && ends_with(name, ".weight") &&
           !contains(name, "norm") && !contains(name, "ssm_conv1d");
}

// llama_model_init_from_user() creates every *optional* tensor of the arch too (the
// TENSOR_NOT_REQUIRED ones: q/k/v/o and FFN biases, rope_freqs, the NVFP4 per-tensor
// ".scale" / ".input_scale" of every matrix, ...). They are initialized neutral (bias 0,
// scale 1) and left out of the written file, which then has the tensor set of a
// converted checkpoint. The SSM biases are not optional.
bool drop_optional_tensor(std::string_view name) {
    if (ends_with(name, ".scale") || ends_with(name, ".input_scale") ||
        contains(name, "rope_freqs") || contains(name, "rope_factors")) {
        return true;
    }
    return ends_with(name, ".bias") && !ends_with(name, ".ssm_dt.bias") &&
           !ends_with(name, ".ssm_conv1d.bias");
}

// ---------------------------------------------------------------------------------------
// Metadata for each architecture.

struct MetaWriter {
    gguf_context* ctx;
    std::string arch;

    std::string key(const char* suffix) const { return arch + "." + suffix; }
    void u32(const char* suffix, uint32_t v) const {
        gguf_set_val_u32(ctx, key(suffix).c_str(), v);
    }
    void f32(const char* suffix, float v) const { gguf_set_val_f32(ctx, key(suffix).c_str(), v); }
};

void write_hparams(const ModelSpec& s, uint32_t n_vocab, gguf_context* meta) {
    const MetaWriter w{meta, s.arch};
    gguf_set_val_str(meta, "general.architecture", s.arch.c_str());
    gguf_set_val_str(meta, "general.name", s.name.c_str());
    w.u32("vocab_size", n_vocab);
    w.u32("context_length", s.n_ctx_train);
    w.u32("embedding_length", s.n_embd);
    w.u32("block_count", s.n_layer);
    w.f32("attention.layer_norm_rms_epsilon", s.rms_norm_eps);

    if (s.arch == kArchLlama || s.arch == kArchQwen35) {
        const uint32_t head_dim = s.n_embd / s.n_head;
        w.u32("feed_forward_length", s.n_ff);
        w.u32("attention.head_count", s.n_head);
        w.u32("attention.head_count_kv", s.n_head_kv);
        w.u32("rope.dimension_count", head_dim);
        w.f32("rope.freq_base", s.rope_freq_base);
        if (s.arch == kArchQwen35) {
            // Interleaved M-RoPE sections over the n_rot/2 rotary pairs (text: all equal).
            const int32_t pairs = static_cast<int32_t>(head_dim / 2);
            const int32_t third = pairs / 3;
            const int32_t sections[4] = {pairs - 2 * third, third, third, 0};
            gguf_set_arr_data(meta, w.key("rope.dimension_sections").c_str(), GGUF_TYPE_INT32,
                              sections, 4);
            w.u32("full_attention_interval", s.full_attention_interval);
        }
    }
    if (s.arch == kArchQwen35 || s.arch == kArchMamba2) {
        w.u32("ssm.conv_kernel", s.ssm_d_conv);
        w.u32("ssm.inner_size", s.ssm_d_inner);
        w.u32("ssm.state_size", s.ssm_d_state);
        w.u32("ssm.time_step_rank", s.ssm_dt_rank);
        w.u32("ssm.group_count", s.ssm_n_group);
    }
}

void require(bool ok, const std::string& what) {
    if (!ok) {
        fail("invalid spec: " + what);
    }
}

std::string u(uint32_t v) { return std::to_string(v); }

}  // namespace

std::vector<std::string> supported_model_archs() { return {kArchLlama, kArchQwen35, kArchMamba2}; }

std::string default_chat_template() {
    return "{%- for message in messages -%}\n"
           "{{- '<|im_start|>' + message['role'] + '\\n' -}}\n"
           "{%- if message['content'] is string -%}{{- message['content'] -}}{%- endif -%}\n"
           "{{- '<|im_end|>\\n' -}}\n"
           "{%- endfor -%}\n"
           "{%- if add_generation_prompt -%}\n"
           "{{- '<|im_start|>assistant\\n' -}}\n"
           "{%- endif -%}\n";
}

std::string vocab_gguf_path(const std::string& vocab_name) {
    if (vocab_name.empty() || vocab_name.find('/') != std::string::npos ||
        vocab_name.find("..") != std::string::npos) {
        fail("invalid vocab name '" + vocab_name + "'");
    }
    const VocabVariant* variant = find_vocab_variant(vocab_name);
    const std::string path = std::string(SKIPPY_LLAMA_VOCAB_DIR) + "/ggml-vocab-" +
                             (variant != nullptr ? variant->base : vocab_name) + ".gguf";
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) {
        fail("vocab '" + vocab_name + "' not found: " + path);
    }
    return path;
}

std::string chat_template_text(const std::string& name_or_path) {
    std::error_code ec;
    std::string path = name_or_path;
    if (!fs::is_regular_file(path, ec)) {
        if (name_or_path.empty() || name_or_path.find('/') != std::string::npos ||
            name_or_path.find("..") != std::string::npos) {
            fail("chat template '" + name_or_path + "' not found");
        }
        path = std::string(SKIPPY_LLAMA_VOCAB_DIR) + "/templates/" + name_or_path + ".jinja";
        if (!fs::is_regular_file(path, ec)) {
            fail("chat template '" + name_or_path + "' not found (no file, and no " + path + ")");
        }
    }
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (!in && !in.eof()) {
        fail("cannot read chat template " + path);
    }
    return text.str();
}

ModelSpec resolve_model_spec(const ModelSpec& spec) {
    ModelSpec s = spec;
    const auto archs = supported_model_archs();
    bool known = false;
    std::string list;
    for (const auto& a : archs) {
        known = known || a == s.arch;
        list += (list.empty() ? "" : ", ") + a;
    }
    if (!known) {
        fail("unsupported arch '" + s.arch + "' (supported: " + list + ")");
    }
    if (s.name.empty()) {
        s.name = "skippy-random-" + s.arch;
    }
    if (s.chat_template.empty()) {
        s.chat_template = default_chat_template();
    }

    require(s.n_layer >= 1 && s.n_layer <= 512, "n_layer must be in [1, 512], got " + u(s.n_layer));
    require(s.n_embd >= 8, "n_embd must be >= 8, got " + u(s.n_embd));
    require(s.n_ctx_train >= 1, "n_ctx_train must be >= 1");
    require(std::isfinite(s.init_std) && s.init_std > 0.0f && s.init_std <= 1.0f,
            "init_std must be in (0, 1]");
    require(std::isfinite(s.init_gain) && s.init_gain > 0.0f && s.init_gain <= 4.0f,
            "init_gain must be in (0, 4]");
    require(std::isfinite(s.rms_norm_eps) && s.rms_norm_eps > 0.0f, "rms_norm_eps must be > 0");
    require(std::isfinite(s.rope_freq_base) && s.rope_freq_base > 0.0f,
            "rope_freq_base must be > 0");

    if (s.arch == kArchLlama || s.arch == kArchQwen35) {
        require(s.n_head >= 1, "n_head must be >= 1");
        require(s.n_embd % s.n_head == 0,
                "n_embd (" + u(s.n_embd) + ") must be divisible by n_head (" + u(s.n_head) + ")");
        require((s.n_embd / s.n_head) % 2 == 0,
                "head size n_embd/n_head (" + u(s.n_embd / s.n_head) + ") must be even for RoPE");
        require(s.n_head_kv >= 1 && s.n_head % s.n_head_kv == 0,
                "n_head_kv (" + u(s.n_head_kv) + ") must divide n_head (" + u(s.n_head) + ")");
        require(s.n_ff >= 1, "n_ff must be >= 1");
    }

    if (s.arch == kArchQwen35) {
        const uint32_t head_dim = s.n_embd / s.n_head;
        require(head_dim >= 6,
                "qwen35 needs a head size n_embd/n_head >= 6 for its M-RoPE sections");
        require(s.n_layer >= 2,
                "qwen35 needs n_layer >= 2 (at least one recurrent and one attention layer)");
        if (s.full_attention_interval == 0) {
            s.full_attention_interval = s.n_layer < 4 ? s.n_layer : 4;
        }
        require(
            s.full_attention_interval >= 2 && s.full_attention_interval <= s.n_layer,
            "full_attention_interval must be in [2, n_layer], got " + u(s.full_attention_interval));
        if (s.ssm_d_conv == 0) s.ssm_d_conv = 4;
        if (s.ssm_d_state == 0) s.ssm_d_state = head_dim;
        if (s.ssm_dt_rank == 0) s.ssm_dt_rank = s.n_head;
        if (s.ssm_n_group == 0) s.ssm_n_group = s.ssm_dt_rank;
        if (s.ssm_d_inner == 0) s.ssm_d_inner = s.ssm_d_state * s.ssm_dt_rank;
        require(s.ssm_dt_rank % s.ssm_n_group == 0,
                "qwen35 value heads ssm_dt_rank (" + u(s.ssm_dt_rank) +
                    ") must be a multiple of key heads ssm_n_group (" + u(s.ssm_n_group) + ")");
        require(s.ssm_d_inner == s.ssm_d_state * s.ssm_dt_rank,
                "qwen35 needs ssm_d_inner == ssm_d_state * ssm_dt_rank (" + u(s.ssm_d_inner) +
                    " != " + u(s.ssm_d_state) + " * " + u(s.ssm_dt_rank) + ")");
    } else if (s.arch == kArchMamba2) {
        if (s.ssm_d_conv == 0) s.ssm_d_conv = 4;
        if (s.ssm_d_inner == 0) s.ssm_d_inner = 2 * s.n_embd;
        if (s.ssm_d_state == 0) s.ssm_d_state = 64;
        if (s.ssm_dt_rank == 0) s.ssm_dt_rank = s.ssm_d_inner % 64 == 0 ? s.ssm_d_inner / 64 : 1;
        if (s.ssm_n_group == 0) s.ssm_n_group = 1;
        require(s.ssm_d_inner % s.ssm_dt_rank == 0, "mamba2 ssm_d_inner (" + u(s.ssm_d_inner) +
                                                        ") must be divisible by ssm_dt_rank (" +
                                                        u(s.ssm_dt_rank) + ")");
        require(s.ssm_d_inner % s.ssm_n_group == 0, "mamba2 ssm_d_inner (" + u(s.ssm_d_inner) +
                                                        ") must be divisible by ssm_n_group (" +
                                                        u(s.ssm_n_group) + ")");
    }
    if (s.arch != kArchLlama) {
        require(s.ssm_d_conv >= 2 && s.ssm_d_conv <= 16, "ssm_d_conv must be in [2, 16]");
        require(s.ssm_d_state >= 1, "ssm_d_state must be >= 1");
    }
    return s;
}

void make_random_model(const ModelSpec& spec_in, const std::string& out_path) {
    if (is_quantized_weight_type(spec_in.type)) {
        // Written as F16 next to the output, then quantized into place.
        ModelSpec base = spec_in;
        base.type = "";
        base.f16 = true;
        const std::string tmp = out_path + ".f16.tmp";
        make_random_model(base, tmp);
        try {
            quantize_model_file(tmp, out_path, spec_in.type);
        } catch (...) {
            std::error_code ec;
            fs::remove(tmp, ec);
            throw;
        }
        std::error_code ec;
        fs::remove(tmp, ec);
        return;
    }
    ModelSpec spec = resolve_model_spec(spec_in);
    if (spec.type == "f16") {
        spec.f16 = true;
    } else if (!spec.type.empty() && spec.type != "f32") {
        fail("unknown --type '" + spec.type + "'");
    }
    if (out_path.empty()) {
        fail("empty output path");
    }
    const std::string vocab_path = vocab_gguf_path(spec.vocab);

    ensure_backend_initialized();  // routes llama.cpp logging (silent unless SKIPPY_LLAMA_LOG=1)

    // 1. Metadata: hyperparameters + the real tokenizer.
    GgufPtr vocab = open_gguf(vocab_path, nullptr);
    GgufPtr meta(gguf_init_empty());
    uint32_t n_vocab = copy_tokenizer(meta.get(), vocab.get(), vocab_path);
    if (const VocabVariant* variant = find_vocab_variant(spec.vocab)) {
        n_vocab = apply_vocab_variant(meta.get(), *variant);
    }
    write_hparams(spec, n_vocab, meta.get());

    // 2. Build the model in memory (CPU only: the saver reads tensor->data directly).
    InitContext ic;
    ic.seed = spec.seed;
    ic.init_std = spec.init_std;
    ic.init_gain = spec.init_gain;
    llama_model_params mparams = llama_model_default_params();
    ggml_backend_dev_t no_devices[1] = {nullptr};
    mparams.devices = no_devices;
    mparams.n_gpu_layers = 0;
    mparams.progress_callback = silent_load_progress;
    std::unique_ptr<llama_model, LlamaModelDeleter> model(
        llama_model_init_from_user(meta.get(), set_tensor_data, &ic, mparams));
    if (!model) {
        fail("llama_model_init_from_user failed for arch '" + spec.arch +
             "' (set SKIPPY_LLAMA_LOG=1 for llama.cpp's reason)");
    }
    if (!ic.error.empty()) {
        fail("initializing tensors: " + ic.error);
    }

    // 3. Save, then rewrite once with our own metadata: the saver re-derives every key from
    //    the loaded model (~150 keys, most of them defaults of other archs, e.g.
    //    attn_logit_softcapping = 50), regenerates the tokenizer keys from the loaded vocab
    //    and drops tokenizer.chat_template. The model was built from `meta` alone, so `meta`
    //    (+ chat template) loads back the same model. The matrices become F16 here too.
    const fs::path out(out_path);
    const fs::path tmp = fs::path(out_path + ".partial");
    std::error_code ec;
    if (out.has_parent_path() && !fs::is_directory(out.parent_path(), ec)) {
        fail("output directory does not exist: " + out.parent_path().string());
    }
    fs::remove(tmp, ec);
    llama_model_save_to_file(model.get(), tmp.string().c_str());
    model.reset();
    if (!fs::is_regular_file(tmp, ec)) {
        fail("llama_model_save_to_file did not write " + tmp.string());
    }

    ggml_context* data_raw = nullptr;
    GgufPtr saved = open_gguf(tmp.string(), &data_raw);
    GgmlPtr data(data_raw);
    fs::remove(tmp, ec);

    GgufPtr final_ctx(gguf_init_empty());
    gguf_set_kv(final_ctx.get(), meta.get());
    gguf_set_val_str(final_ctx.get(), "tokenizer.chat_template", spec.chat_template.c_str());
    gguf_set_val_u32(final_ctx.get(), "general.file_type",
                     spec.f16 ? static_cast<uint32_t>(LLAMA_FTYPE_MOSTLY_F16)
                              : static_cast<uint32_t>(LLAMA_FTYPE_ALL_F32));
    gguf_set_val_str(final_ctx.get(), "general.description",
                     ("random weights, not a trained model (skippy make-model, seed " +
                      std::to_string(spec.seed) + ")")
                         .c_str());

    std::vector<ggml_tensor*> tensors;
    size_t f16_bytes = 0;
    int64_t n_f16 = 0;
    for (int64_t i = 0; i < gguf_get_n_tensors(saved.get()); ++i) {
        const char* tname = gguf_get_tensor_name(saved.get(), i);
        ggml_tensor* t = ggml_get_tensor(data.get(), tname);
        if (t == nullptr) {
            fail(std::string("saved model lacks tensor data for ") + tname);
        }
        if (drop_optional_tensor(tname)) {
            continue;
        }
        tensors.push_back(t);
        if (spec.f16 && convert_to_f16(t)) {
            f16_bytes += static_cast<size_t>(ggml_nelements(t)) * sizeof(ggml_fp16_t);
            ++n_f16;
        }
    }
    GgmlPtr f16_ctx;
    if (n_f16 > 0) {
        ggml_init_params p{};
        p.mem_size = f16_bytes + static_cast<size_t>(n_f16) * (ggml_tensor_overhead() + 64) + 1024;
        p.mem_buffer = nullptr;
        p.no_alloc = false;
        f16_ctx.reset(ggml_init(p));
        if (!f16_ctx) {
            fail("out of memory converting to F16");
        }
    }
    for (ggml_tensor* t : tensors) {
        if (f16_ctx && convert_to_f16(t)) {
            ggml_tensor* h = ggml_new_tensor(f16_ctx.get(), GGML_TYPE_F16, ggml_n_dims(t), t->ne);
            ggml_set_name(h, ggml_get_name(t));
            ggml_fp32_to_fp16_row(static_cast<const float*>(t->data),
                                  static_cast<ggml_fp16_t*>(h->data), ggml_nelements(t));
            gguf_add_tensor(final_ctx.get(), h);
        } else {
            gguf_add_tensor(final_ctx.get(), t);
        }
    }

    if (!gguf_write_to_file(final_ctx.get(), tmp.string().c_str(), false)) {
        fs::remove(tmp, ec);
        fail("cannot write " + tmp.string());
    }
    fs::rename(tmp, out, ec);
    if (ec) {
        fs::remove(tmp, ec);
        fail("cannot move the model into place at " + out_path);
    }
}

}  // namespace skippy::runtime
