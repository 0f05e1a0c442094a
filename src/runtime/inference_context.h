// InferenceContext: one llama_context with `n_seq_max` sequence ids (lanes). Each lane owns
// its own KV stream (kv_unified = false): `n_ctx` cells are split evenly over the lanes
// (llama.cpp rounds each lane's share up to a multiple of 256), a lane's cells sit
// contiguously from cell 0 in position order, and attention covers only that lane.
// Decoding uses one persistent CPU threadpool.
//
// Thread safety: NOT thread-safe. Exactly one thread (the scheduler's) owns an
// InferenceContext and makes every call on it; other threads talk to that thread
// through the scheduler's queue.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/model.h"

struct llama_context;

namespace skippy::runtime {

using SeqId = int32_t;
using Pos = int32_t;

enum class FlashAttn { Auto, On, Off };
FlashAttn parse_flash_attn(const std::string& value);  // "auto" | "on" | "off"
const char* flash_attn_name(FlashAttn value);
// "auto" means off (on measures faster for dense models, but the e2e suite's cached-token
// expectations follow the flash-attention-off rule; see README). A model without attention
// layers (recurrent) has nothing to flash: always off for it. Both settings are exact for
// the prefix cache (stage/plan.h's rule, measured by tests/runtime/chunking_test.cpp).
FlashAttn resolve_flash_attn(FlashAttn value, ModelKind kind);

struct ContextOptions {
    uint32_t n_ctx = 4096;   // total KV cells, split evenly over the sequences
    uint32_t n_seq_max = 4;  // lanes
    uint32_t n_batch = 512;  // max tokens per llama_decode call
    uint32_t n_ubatch = 512;
    int32_t n_threads = 0;  // 0 = hardware concurrency
    FlashAttn flash_attn = FlashAttn::Auto;
    std::string type_k = "f16";
    std::string type_v = "f16";
};

// Which part of a sequence's state to export/import.
enum class StateScope {
    Full,         // attention KV + recurrent state (llama_state_seq_*_ext flags = 0)
    PartialOnly,  // only the partial state: recurrent/SWA (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
};

class InferenceContext {
  public:
    InferenceContext(const Model& model, const ContextOptions& options);
    ~InferenceContext();
    InferenceContext(const InferenceContext&) = delete;
    InferenceContext& operator=(const InferenceContext&) = delete;

    const Model& model() const { return model_; }
    const ContextOptions& options() const { return options_; }
    uint32_t n_ctx() const;      // all cells
    uint32_t n_ctx_seq() const;  // cells of one lane
    bool flash_attn() const;     // "auto" resolved
    uint32_t n_batch() const { return options_.n_batch; }
    uint32_t n_ubatch() const { return options_.n_ubatch; }  // <= n_batch
    uint32_t n_seq_max() const { return options_.n_seq_max; }
    // Prefill batches are padded to a multiple of this many rows (repacked weights of an
    // attention-only model: 4, model.h); 1 = no padding.
    int32_t prefill_row_group() const { return row_group_; }
    // The longest prefill chunk prefill() takes in one llama_decode (n_ubatch, rounded down to
    // whole row groups so that a padded chunk still fits one ubatch).
    int32_t max_prefill_chunk() const;
    // Cells of a lane a request may use: n_ctx_seq() less the room padding needs after them.
    uint32_t n_ctx_usable() const { return n_ctx_seq() - static_cast<uint32_t>(row_group_ - 1); }

    // One throwaway decode of BOS + EOS, then all lanes cleared, as llama.cpp's tools do
    // before serving: the model's weights are paged in and the kernels' buffers set up now
    // rather than in the first request's prefill.
    void warm_up();

    // ---- batch building and decoding ----
    void batch_clear();
    // Adds one token; returns its index in the batch (for logits_at).
    int32_t batch_add(Token token, Pos pos, SeqId seq, bool want_logits);
    int32_t batch_size() const { return n_batch_tokens_; }
    // llama_decode: 0 ok, 1 no KV slot for the batch (caller may free space and retry),
    // other values are errors. On failure the batch's tokens are not in the KV cache.
    int32_t decode();
    // Logits of the batch token at `batch_index` (must have been added with want_logits).
    std::span<const float> logits_at(int32_t batch_index) const;
    // One exact prefill chunk: `tokens` at positions begin.. of `seq` (at most
    // max_prefill_chunk()), in one llama_decode, or two where padding would move a chunk under
    // flash attention's 64-row tile into the tiled kernel (both halves stay row by row).
    // With a row group > 1, each batch of two or more rows gets throw-away rows after the
    // chunk (positions past it, removed again), so every row of the chunk takes the same
    // kernels wherever the chunk starts and ends; a one-row chunk is decoded as it is.
    // Returns decode()'s code (on failure nothing of the chunk stays in the cache);
    // `logits_index`: the last token's batch index when want_last_logits.
    int32_t prefill(SeqId seq, std::span<const Token> tokens, Pos begin, bool want_last_logits,
                    int32_t* logits_index = nullptr);

    // ---- sequence operations ----
    bool seq_remove(SeqId seq, Pos p0 = -1, Pos p1 = -1);
    void seq_copy(SeqId src, SeqId dst, Pos p0 = -1, Pos p1 = -1);
    void seq_clear(SeqId seq) { seq_remove(seq, -1, -1); }
    Pos seq_pos_max(SeqId seq) const;  // -1 when empty
    Pos seq_pos_min(SeqId seq) const;
    void clear_all();

    // ---- per-sequence state ----
    size_t state_size(SeqId seq, StateScope scope) const;
    std::vector<uint8_t> state_export(SeqId seq, StateScope scope) const;
    // The same into `out` (resized to the state; a buffer used before keeps its pages, so
    // the copy does not page-fault). False if llama.cpp wrote nothing.
    bool state_export_into(SeqId seq, StateScope scope, std::vector<uint8_t>& out) const;
    // Returns false if llama.cpp rejected the bytes (the sequence is cleared then).
    bool state_import(std::span<const uint8_t> bytes, SeqId seq, StateScope scope);

    llama_context* raw() const { return ctx_; }

  private:
    const Model& model_;
    ContextOptions options_;
    llama_context* ctx_ = nullptr;
    struct BatchStorage;
    BatchStorage* batch_ = nullptr;
    int32_t n_batch_tokens_ = 0;
    int32_t row_group_ = 1;
    struct Threadpool;
    Threadpool* threadpool_ = nullptr;
};

}  // namespace skippy::runtime
