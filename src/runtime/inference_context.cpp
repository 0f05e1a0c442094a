#include "runtime/inference_context.h"

#include <algorithm>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ggml-cpu.h"
#include "llama.h"

namespace skippy::runtime {

namespace {

ggml_type parse_cache_type(const std::string& name) {
    if (name == "f16") return GGML_TYPE_F16;
    if (name == "f32") return GGML_TYPE_F32;
    if (name == "bf16") return GGML_TYPE_BF16;
    if (name == "q8_0") return GGML_TYPE_Q8_0;
    if (name == "q4_0") return GGML_TYPE_Q4_0;
    throw std::invalid_argument("unsupported KV cache type: " + name);
}

llama_state_seq_flags to_flags(StateScope scope) {
    return scope == StateScope::PartialOnly ? LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
                                            : LLAMA_STATE_SEQ_FLAGS_NONE;
}

}  // namespace

FlashAttn parse_flash_attn(const std::string& value) {
    if (value == "auto") return FlashAttn::Auto;
    if (value == "on" || value == "1" || value == "true") return FlashAttn::On;
    if (value == "off" || value == "0" || value == "false") return FlashAttn::Off;
    throw std::invalid_argument("flash attention must be auto, on or off");
}

const char* flash_attn_name(FlashAttn value) {
    switch (value) {
        case FlashAttn::Auto:
            return "auto";
        case FlashAttn::On:
            return "on";
        case FlashAttn::Off:
            return "off";
    }
    return "?";
}

FlashAttn resolve_flash_attn(FlashAttn value, ModelKind kind) {
    if (kind == ModelKind::Recurrent) {
        return FlashAttn::Off;
    }
    // auto = on, as in llama-server: the tiled kernel is faster, and the cache stays exact
    // with it (body and tail, stage/plan.h).
    return value == FlashAttn::Off ? FlashAttn::Off : FlashAttn::On;
}

struct InferenceContext::Threadpool {
    ggml_threadpool* pool = nullptr;
};

struct InferenceContext::BatchStorage {
    llama_batch batch;
};

InferenceContext::InferenceContext(const Model& model, const ContextOptions& options)
    : model_(model), options_(options) {
    if (options_.n_threads <= 0) {
        options_.n_threads =
            static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
    }
    if (options_.n_seq_max == 0 || options_.n_seq_max > 256) {
        throw std::invalid_argument("n_seq_max must be in [1, 256]");
    }
    options_.n_ubatch = std::min(options_.n_ubatch, options_.n_batch);
    llama_context_params params = llama_context_default_params();
    params.n_ctx = options_.n_ctx;
    params.n_batch = options_.n_batch;
    params.n_ubatch = options_.n_ubatch;
    params.n_seq_max = options_.n_seq_max;
    params.n_threads = options_.n_threads;
    params.n_threads_batch = options_.n_threads;
    params.kv_unified = false;
    params.no_perf = true;
    options_.flash_attn = resolve_flash_attn(options_.flash_attn, model.kind());
    params.flash_attn_type = options_.flash_attn == FlashAttn::On ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                                                                  : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    params.type_k = parse_cache_type(options_.type_k);
    params.type_v = parse_cache_type(options_.type_v);
    ctx_ = llama_init_from_model(model.raw(), params);
    if (ctx_ == nullptr) {
        throw std::runtime_error("failed to create llama context");
    }
    batch_ = new BatchStorage{llama_batch_init(static_cast<int32_t>(options_.n_batch), 0, 1)};
    // Padding needs rows that can be removed again: attention only (model.h).
    row_group_ = model.repacked() && model.kind() == ModelKind::Dense ? 4 : 1;
    // One persistent threadpool for every decode (without one, ggml creates and joins a
    // throwaway pool per graph computation), as llama.cpp's own tools do.
    ggml_threadpool_params tpp = ggml_threadpool_params_default(options_.n_threads);
    threadpool_ = new Threadpool{ggml_threadpool_new(&tpp)};
    if (threadpool_->pool != nullptr) {
        llama_attach_threadpool(ctx_, threadpool_->pool, nullptr);
    }
}

InferenceContext::~InferenceContext() {
    if (batch_ != nullptr) {
        llama_batch_free(batch_->batch);
        delete batch_;
    }
    if (ctx_ != nullptr) {
        llama_detach_threadpool(ctx_);
        llama_free(ctx_);
    }
    if (threadpool_ != nullptr) {
        if (threadpool_->pool != nullptr) {
            ggml_threadpool_free(threadpool_->pool);
        }
        delete threadpool_;
    }
}

void InferenceContext::warm_up() {
    // (common_init_from_params's warm-up at the pinned llama.cpp.)
    const llama_vocab* vocab = model_.vocab();
    std::vector<llama_token> tokens;
    for (const llama_token t : {llama_vocab_bos(vocab), llama_vocab_eos(vocab)}) {
        if (t != LLAMA_TOKEN_NULL) {
            tokens.push_back(t);
        }
    }
    if (tokens.empty()) {
        tokens.push_back(0);
    }
    (void)llama_decode(ctx_,
                       llama_batch_get_one(tokens.data(), static_cast<int32_t>(tokens.size())));
    llama_memory_clear(llama_get_memory(ctx_), true);
    llama_synchronize(ctx_);
}

uint32_t InferenceContext::n_ctx() const { return llama_n_ctx(ctx_); }

uint32_t InferenceContext::n_ctx_seq() const { return llama_n_ctx_seq(ctx_); }

bool InferenceContext::flash_attn() const { return options_.flash_attn == FlashAttn::On; }

void InferenceContext::batch_clear() {
    n_batch_tokens_ = 0;
    batch_->batch.n_tokens = 0;
}

int32_t InferenceContext::batch_add(Token token, Pos pos, SeqId seq, bool want_logits) {
    if (n_batch_tokens_ >= static_cast<int32_t>(options_.n_batch)) {
        throw std::logic_error("batch is full");
    }
    llama_batch& b = batch_->batch;
    const int32_t i = n_batch_tokens_++;
    b.token[i] = token;
    b.pos[i] = pos;
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = seq;
    b.logits[i] = want_logits ? 1 : 0;
    b.n_tokens = n_batch_tokens_;
    return i;
}

int32_t InferenceContext::decode() {
    if (n_batch_tokens_ == 0) {
        return 0;
    }
    return llama_decode(ctx_, batch_->batch);
}

std::span<const float> InferenceContext::logits_at(int32_t batch_index) const {
    const float* logits = llama_get_logits_ith(ctx_, batch_index);
    if (logits == nullptr) {
        throw std::logic_error("no logits for batch index");
    }
    return {logits, static_cast<size_t>(model_.n_vocab())};
}

int32_t InferenceContext::max_prefill_chunk() const {
    const auto ubatch = static_cast<int32_t>(options_.n_ubatch);
    return row_group_ > 1 ? std::max(row_group_, ubatch / row_group_ * row_group_) : ubatch;
}

int32_t InferenceContext::prefill(SeqId seq, std::span<const Token> tokens, Pos begin,
                                  bool want_last_logits, int32_t* logits_index) {
    const auto n = static_cast<int32_t>(tokens.size());
    const int32_t g = row_group_;
    const auto padded = [g](int32_t rows) { return (rows + g - 1) / g * g; };
    // ggml-cpu's flash attention computes a batch of >= 64 query rows in tiles and a smaller
    // one row by row (stage/plan.h): padding must not move a chunk from one to the other.
    constexpr int32_t kFlashTile = 64;
    int32_t cut = n;
    if (g > 1 && flash_attn() && n < kFlashTile && padded(n) >= kFlashTile) {
        cut = n - g;  // (both halves are row-by-row chunks of >= 2: the same bits)
    }
    int32_t at = 0;
    while (at < n) {
        const int32_t end = at == 0 ? cut : n;
        batch_clear();
        for (int32_t i = at; i < end; ++i) {
            const bool want = want_last_logits && i == n - 1;
            const int32_t index = batch_add(tokens[static_cast<size_t>(i)], begin + i, seq, want);
            if (want && logits_index != nullptr) {
                *logits_index = index;
            }
        }
        // A one-row chunk stays one row (the decode kernel, gemv): the exactness rule puts a
        // row alone only where every path prefills it alone (a completion's last token after
        // its body end, plan.h), and padding it would cost a whole row group's compute on
        // every warm hit that prefills just that token.
        const int32_t rows = end - at;
        const int32_t pad = g > 1 && rows > 1 ? padded(rows) - rows : 0;
        for (int32_t k = 0; k < pad; ++k) {
            batch_add(tokens[static_cast<size_t>(end - 1)], begin + end + k, seq, false);
        }
        const int32_t rc = decode();
        if (rc != 0) {
            if (at > 0) {
                seq_remove(seq, begin, -1);  // the first half is in; the chunk is not
            }
            return rc;
        }
        if (pad > 0) {
            seq_remove(seq, begin + end, -1);
        }
        at = end;
    }
    return 0;
}

bool InferenceContext::seq_remove(SeqId seq, Pos p0, Pos p1) {
    return llama_memory_seq_rm(llama_get_memory(ctx_), seq, p0, p1);
}

void InferenceContext::seq_copy(SeqId src, SeqId dst, Pos p0, Pos p1) {
    llama_memory_seq_cp(llama_get_memory(ctx_), src, dst, p0, p1);
}

Pos InferenceContext::seq_pos_max(SeqId seq) const {
    return llama_memory_seq_pos_max(llama_get_memory(ctx_), seq);
}

Pos InferenceContext::seq_pos_min(SeqId seq) const {
    return llama_memory_seq_pos_min(llama_get_memory(ctx_), seq);
}

void InferenceContext::clear_all() { llama_memory_clear(llama_get_memory(ctx_), true); }

size_t InferenceContext::state_size(SeqId seq, StateScope scope) const {
    return llama_state_seq_get_size_ext(ctx_, seq, to_flags(scope));
}

std::vector<uint8_t> InferenceContext::state_export(SeqId seq, StateScope scope) const {
    std::vector<uint8_t> bytes;
    state_export_into(seq, scope, bytes);
    return bytes;
}

bool InferenceContext::state_export_into(SeqId seq, StateScope scope,
                                         std::vector<uint8_t>& out) const {
    out.resize(state_size(seq, scope));
    const size_t written =
        llama_state_seq_get_data_ext(ctx_, out.data(), out.size(), seq, to_flags(scope));
    out.resize(written);
    return written > 0;
}

bool InferenceContext::state_import(std::span<const uint8_t> bytes, SeqId seq, StateScope scope) {
    if (bytes.empty()) {
        return false;
    }
    const size_t read =
        llama_state_seq_set_data_ext(ctx_, bytes.data(), bytes.size(), seq, to_flags(scope));
    if (read != bytes.size()) {
        seq_clear(seq);
        return false;
    }
    return true;
}

}  // namespace skippy::runtime
