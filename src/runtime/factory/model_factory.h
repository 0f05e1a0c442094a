// Model factory: writes small random-weight GGUF models for tests and benchmarks
// (`skippy make-model`).
//
//   skippy::runtime::ModelSpec spec;
//   spec.arch = "qwen35";
//   spec.n_layer = 4;
//   skippy::runtime::make_random_model(spec, "/tmp/tiny-qwen35.gguf");
//
// The weights are random (seeded by spec.seed and each tensor name, so a spec always
// produces the same file), but the tokenizer is real: every `tokenizer.ggml.*` key is
// copied from llama.cpp's models/ggml-vocab-<spec.vocab>.gguf, so text prompts tokenize
// like the real model family. A ChatML-style Jinja chat template is stored as
// `tokenizer.chat_template` so chat requests render.
//
// The model is built with llama_model_init_from_user() and written with
// llama_model_save_to_file(); the saved file is then rewritten once with the factory's own
// metadata (the saver re-derives ~150 keys, mostly defaults of other archs, and drops the
// chat template), without the neutral optional tensors llama_model_init_from_user()
// creates (biases, rope_freqs, per-tensor NVFP4 scales), and with F16 matrices if asked.
//
// Weights: token_embd/output N(0, init_std); other matrices N(0, (init_gain/sqrt(fan_in))^2)
// so the output depends on the whole context; norms 1; SSM parameters in their usual init
// ranges (A in [-16, -1], softplus(dt_bias) in [1e-3, 1e-1], mamba2 D = 0.1).
//
// Thread safety: make_random_model() may be called from several threads for different
// output paths; it temporarily replaces llama.cpp's (process-global) log callback.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace skippy::runtime {

struct ModelSpec {
    std::string arch = "llama";  // one of supported_model_archs()
    std::string name;            // general.name; empty = "skippy-random-<arch>"
    uint32_t n_layer = 4;
    uint32_t n_embd = 256;
    uint32_t n_head = 4;     // attention heads (ignored by mamba2)
    uint32_t n_head_kv = 4;  // must divide n_head (ignored by mamba2)
    uint32_t n_ff = 512;     // feed-forward width (ignored by mamba2)
    uint32_t n_ctx_train = 4096;
    uint64_t seed = 1;
    bool f16 = false;  // store 2-D weight matrices as F16 (norms, conv, SSM params stay F32)
    // Weight type of the written file: "" (f32, or f16 with `f16`), or one of
    // supported_weight_types(): the model is written as F16 and quantized by llama.cpp's
    // quantizer (llama_model_quantize), as llama-quantize would (q8_0, q4_k_m, ...).
    std::string type;
    std::string vocab = "llama-spm";  // ggml-vocab-<vocab>.gguf from llama.cpp's models/
    float init_std = 0.02f;  // std of token_embd / output (logits ~ init_std * sqrt(n_embd))
    float init_gain = 1.0f;  // hidden matrices: N(0, (init_gain / sqrt(fan_in))^2)
    float rope_freq_base = 10000.0f;
    float rms_norm_eps = 1e-5f;

    // Recurrent / linear-attention settings; 0 = derive a sane default:
    //   mamba2: d_conv 4, d_inner 2*n_embd, d_state 64, dt_rank (SSM heads) d_inner/64
    //           (or 1 when 64 does not divide d_inner), n_group 1.
    //   qwen35: d_conv 4, d_state (linear-attention head dim) n_embd/n_head,
    //           dt_rank (value heads) n_head, n_group (key heads) n_head,
    //           d_inner d_state*dt_rank (required), full_attention_interval min(4, n_layer):
    //           layer i is full attention when (i+1) % interval == 0, otherwise gated delta net.
    uint32_t ssm_d_conv = 0;
    uint32_t ssm_d_inner = 0;
    uint32_t ssm_d_state = 0;
    uint32_t ssm_dt_rank = 0;
    uint32_t ssm_n_group = 0;
    uint32_t full_attention_interval = 0;

    std::string chat_template;  // Jinja chat template; empty = default_chat_template()
};

// Architectures make_random_model() can generate: "llama" (dense), "qwen35" (hybrid:
// gated delta net + full attention), "mamba2" (pure recurrent).
std::vector<std::string> supported_model_archs();

// Fills the derived defaults of `spec` (the 0 fields, the name, the chat template) and
// validates it. Throws std::runtime_error with a clear message when the spec is invalid
// (unknown arch, n_embd not divisible by n_head, inconsistent SSM sizes, ...).
ModelSpec resolve_model_spec(const ModelSpec& spec);

// Weight types `type` accepts: f32, f16, bf16, q8_0, q6_k, q5_k_m, ..., q4_k_m, ..., q2_k.
std::vector<std::string> supported_weight_types();
bool is_quantized_weight_type(const std::string& type);  // anything but f32 / f16
// Quantizes a GGUF file to `type` with llama.cpp's quantizer; throws std::runtime_error.
void quantize_model_file(const std::string& in_path, const std::string& out_path,
                         const std::string& type);

// Writes a random-weight model for `spec` to `out_path` (overwritten). Throws
// std::runtime_error when the spec is invalid, the vocab is missing or writing fails.
void make_random_model(const ModelSpec& spec, const std::string& out_path);

// SKIPPY_LLAMA_VOCAB_DIR "/ggml-vocab-<vocab_name>.gguf"; throws std::runtime_error when
// the file does not exist. The variant "qwen3" is ggml-vocab-qwen2.gguf with the added
// tokens of the Qwen2.5/Qwen3 tokenizers (<tool_call>, </tool_call>, <think>, ...) restored
// at their real ids in place of its [PAD] placeholders; "llama-spm-chatml" is
// ggml-vocab-llama-spm.gguf with ChatML's <|im_end|> and <|im_start|> appended as control
// tokens (ids 32000 and 32001).
std::string vocab_gguf_path(const std::string& vocab_name);

// The Jinja text of a chat template: `name_or_path` is a file path (when it names an existing
// file) or the stem of one of llama.cpp's models/templates/<NAME>.jinja (for example
// "Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct"). Throws std::runtime_error
// when neither exists.
std::string chat_template_text(const std::string& name_or_path);

// The ChatML-style Jinja template stored in generated models:
//   <|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]
std::string default_chat_template();

}  // namespace skippy::runtime
