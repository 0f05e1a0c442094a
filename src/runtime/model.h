// Model: a loaded GGUF model (weights + vocabulary) and what it reports about itself.
//
//   auto model = skippy::runtime::Model::load("/path/model.gguf");
//   auto tokens = model->tokenize("hello", /*add_special=*/true, /*parse_special=*/true);
//
// Thread safety: a Model is immutable after load; tokenize/detokenize are safe from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/devices.h"

struct llama_model;
struct llama_vocab;

namespace skippy::runtime {

using Token = int32_t;

// How the model keeps its per-sequence state; decides which cache payload is safe.
enum class ModelKind {
    Dense,      // attention only, full KV cache
    Swa,        // attention with a sliding window on some layers
    Hybrid,     // attention layers + recurrent layers (qwen3next, qwen35, jamba, ...)
    Recurrent,  // recurrent only (mamba, mamba2, rwkv)
};
std::string_view model_kind_name(ModelKind kind);

// Where the layers go (devices.h). The defaults keep everything on the CPU, with no device
// in the context at all (llama.cpp would otherwise still offload large batches' matrix
// products of CPU layers to a GPU).
struct ModelLoadOptions {
    // Layers on the devices, counted from the output down (llama.cpp's -ngl): 0 = CPU only,
    // kGpuLayersAuto / kGpuLayersAll = every layer and the output.
    int32_t n_gpu_layers = 0;
    // Device names (ggml_backend_dev_name: "CUDA0", "RPC0", ...); empty = llama.cpp's choice
    // (every rpc-server's devices, then the GPUs); {"none"} = no device.
    std::vector<std::string> devices;
    std::vector<float> tensor_split;  // proportions per device; empty = by free memory
    int32_t main_gpu = 0;
    SplitMode split_mode = SplitMode::Layer;
    bool use_mmap = true;
    // llama.cpp's CPU weight repacking (extra buffer types: Q4_K, Q4_0, IQ4_NL ... laid out
    // for its gemm kernels, ~1.3x faster prefill). Its kernels compute the rows of a batch in
    // groups of 4 (gemm) and the last rows % 4 one by one (gemv), which rounds differently, so
    // a token's state would depend on where its chunk ends. InferenceContext::prefill pads
    // every prefill batch to whole groups (throw-away rows, removed again) so every prompt
    // row takes the gemm path whatever the chunking; that needs rows that can be removed
    // again, so models with recurrent state (whose state cannot step back) are loaded
    // without repacking. Auto: on for attention-only models, off for the others.
    enum class Repack : uint8_t { Auto, On, Off };
    Repack repack = Repack::Auto;
};

class Model {
  public:
    // Throws std::runtime_error when the file is missing or not a loadable GGUF.
    static std::unique_ptr<Model> load(const std::string& path,
                                       const ModelLoadOptions& options = {});
    ~Model();
    Model(const Model&) = delete;
    Model& operator=(const Model&) = delete;

    std::vector<Token> tokenize(std::string_view text, bool add_special, bool parse_special) const;
    std::string token_to_piece(Token token, bool render_special = false) const;
    std::string detokenize(std::span<const Token> tokens, bool render_special = false) const;
    bool is_end_of_generation(Token token) const;
    // A control or user-defined token (the tokenizer splits text at these before anything
    // else).
    bool is_special_token(Token token) const;
    // A special token that takes the whitespace before it (the tokenizer drops it).
    bool strips_left(Token token) const;
    bool is_valid_token(Token token) const { return token >= 0 && token < n_vocab(); }

    int32_t n_vocab() const;
    uint32_t n_ctx_train() const;
    int32_t n_layer() const;
    int32_t n_swa() const;
    // K plus V elements one KV cell holds over all layers (KV heads x head size, K and V),
    // for models whose layers all have attention (dense, sliding window: an upper bound);
    // 0 for models with recurrent layers (their attention layers are not reported).
    uint64_t kv_elements_per_cell() const;
    ModelKind kind() const { return kind_; }
    // Weights of a repackable type were loaded with llama.cpp's CPU repacking
    // (ModelLoadOptions::repack; false for a model without such weights).
    bool repacked() const { return repacked_; }
    const std::string& arch() const { return arch_; }
    const std::string& name() const { return name_; }
    const std::string& path() const { return path_; }
    // Digest of the GGUF file bytes (weights identity for the prefix cache).
    const std::string& weights_digest() const { return weights_digest_; }
    std::string metadata(const std::string& key) const;  // "" when absent
    uint64_t n_params() const;
    uint64_t size_bytes() const;
    // Where the weights (and so each layer's KV and recurrent state, and its computation)
    // live, read from the loaded model.
    const DevicePlacement& placement() const { return placement_; }

    llama_model* raw() const { return model_; }
    const llama_vocab* vocab() const { return vocab_; }

  private:
    Model() = default;
    llama_model* model_ = nullptr;
    const llama_vocab* vocab_ = nullptr;
    ModelKind kind_ = ModelKind::Dense;
    bool repacked_ = false;
    std::string arch_;
    std::string name_;
    std::string path_;
    std::string weights_digest_;
    DevicePlacement placement_;
};

// Initializes the llama.cpp backend once per process and routes its logging
// (silent unless SKIPPY_LLAMA_LOG=1).
void ensure_backend_initialized();

// A model-load progress callback that reports nothing and never cancels.
bool silent_load_progress(float progress, void* user_data);

}  // namespace skippy::runtime
