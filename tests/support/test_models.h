// Shared helpers for tests that run real generated models: a cached tiny model per arch,
// canonical-chunk prefill and greedy continuation on an InferenceContext.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/inference_context.h"

namespace skippy::testing {

// Path of a tiny random-weight model of `arch` (llama, qwen35, mamba2), generated once
// into the temp dir under `tag` (n_embd 128, 2 layers; qwen35: 4 = 3 recurrent + 1 attn).
// With `type` (a llama.cpp quantization: "q8_0", "q4_k_m", ...) the model is quantized, with
// n_embd 256 and n_ff 512 so that k-quant rows (256 values) fit every matrix.
std::string tiny_model(const std::string& arch, const std::string& tag, uint64_t seed,
                       const std::string& type = "");

// Path of a tiny tool-capable dense model (1 layer, f16): the qwen3 vocabulary (Qwen2.5/3
// added tokens at their real ids) and the Qwen2.5 chat template, made once under `tag`.
std::string tiny_tool_model(const std::string& tag);

// Path of a tiny dense model (1 layer, f16) with the llama-spm-chatml vocabulary (ChatML's
// control tokens appended) and the default ChatML template, made once under `tag`.
std::string tiny_chatml_spm_model(const std::string& tag);

// The chat templates llama.cpp ships (models/templates/*.jinja), sorted.
std::vector<std::filesystem::path> shipped_chat_templates();

// The contents of a text file.
std::string read_text_file(const std::filesystem::path& path);

// Decodes tokens[from, to) into `seq`, in chunks ending at multiples of `chunk` (0 = one
// chunk); returns the batch index of the last token's logits.
int32_t prefill(runtime::InferenceContext& ctx, runtime::SeqId seq,
                const std::vector<runtime::Token>& tokens, size_t from, size_t to,
                size_t chunk = 0);

// Greedy continuation of `seq` whose last decoded token's logits are at `logits_index`.
std::vector<runtime::Token> continue_greedy(runtime::InferenceContext& ctx, runtime::SeqId seq,
                                            runtime::Pos next_pos, int32_t logits_index, int n);

}  // namespace skippy::testing
