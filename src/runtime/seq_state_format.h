// Sequence state format: llama.cpp's per-sequence state blob, parsed and written only here.
//
// KV pages: the attention section of a kv-recurrent payload, re-laid out by token range so
// that a longer prefix shares the pages (and so the blocks in the BlockStore) of a shorter
// one.
//
//   EncodedKvPages pages = encode_kv_pages(attention, n_tokens);   // may throw
//   store.insert(pages.bytes, pages.cuts);                          // page-aligned cuts
//   std::vector<uint8_t> out;
//   if (!decode_kv_pages(pages.bytes, n_tokens, /*cell_seq_id=*/0, n_stream, out, &reason)) ...;
//
// Input: what llama_kv_cache::state_write() writes for ONE sequence (the per-sequence blob
// after its 8-byte magic/seq-id header, up to where the recurrent part of a hybrid memory
// starts):
//
//   u32 n_stream           (1 with a unified KV cache; one stream per sequence otherwise)
//   per stream: u32 cell_count; if cell_count > 0 (exactly one stream for one sequence):
//     per cell:  i32 pos, u32 n_seq_id, [llama_kv_cell_ext {i32 x, y, tok} if the cache has
//                one: M-RoPE models such as qwen35, PLE], i32 seq_id...
//     u32 v_trans, u32 n_layer
//     per layer:          i32 k_type, u64 k_row_size, cell_count K rows
//     per layer with V:   !v_trans: i32 v_type, u64 v_row_size, cell_count V rows
//                          v_trans: i32 v_type, u32 v_el_size, u32 n_embd_v_gqa,
//                                   per embedding dim: cell_count elements
//
// Paged section (all integers little-endian, packed):
//
//   header   u32 magic "SKVP" (0x50564b53), u8 format version (kKvPagesVersion),
//            u8 mode (KvPagesMode), u16 page tokens (kKvPageTokens, part of the format),
//            u64 llama.cpp state format fingerprint (XXH3 of runtime::runtime_version()).
//   Empty:   nothing else (the memory wrote no attention state, e.g. mamba2).
//   Raw:     u64 size, then the llama.cpp attention section unchanged (layouts the codec
//            does not page: cells in several streams, SWA-masked or non-0..n-1 positions, cells of
//            several sequences, a cell layout that parses both with and without ext).
//   Paged:   u32 n_tokens, u32 n_pages, u32 v_trans, u32 n_k, u32 n_v, u32 cell ext bytes
//            (0 or 12),
//            n_k x {i32 type, u32 0, u64 row size},
//            n_v x {i32 type, u32 n_embd_v_gqa (v_trans) or 0, u64 el size (v_trans) or row size},
//            then n_pages pages; page i holds tokens [64i, min(64(i+1), n_tokens)):
//              the cell ext of those tokens (pos order), if any
//              per K layer: the K rows of those tokens (pos order)
//              per V entry: !v_trans: the V rows of those tokens
//                            v_trans: per embedding dim, the elements of those tokens
//
// The bytes of page i depend only on the KV values of its tokens and on the layouts, not on
// the source sequence id, the cell indices or the prefix length, so equal KV values give
// byte-identical pages. Cuts are returned after the header and after every page.
//
// The section does not say whether cells carry an ext; the encoder tries both layouts and
// pages only when exactly one accounts for every byte.
//
// Decoding rebuilds the llama.cpp attention section that llama_kv_cache::state_read()
// accepts for a single destination sequence: one stream, the cells in pos order, each with
// n_seq_id = 1 (the reader requires it), its ext, and seq id `cell_seq_id` (the reader
// discards it and uses its destination).
// For a sequence exported from lane 0 (its stream comes first) with its cells in pos order,
// decoding with cell_seq_id = 0 reproduces the exported bytes exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace skippy::runtime {

inline constexpr uint32_t kKvPagesMagic = 0x50564b53;  // "SKVP"
inline constexpr uint8_t kKvPagesVersion = 1;
inline constexpr uint32_t kKvPageTokens = 64;

enum class KvPagesMode : uint8_t { Empty = 0, Paged = 1, Raw = 2 };
const char* to_string(KvPagesMode mode);

struct EncodedKvPages {
    std::vector<uint8_t> bytes;
    std::vector<size_t> cuts;  // strictly increasing, inside (0, bytes.size())
    KvPagesMode mode = KvPagesMode::Empty;
    std::string raw_reason;  // Raw: why the layout was not paged
};

// Encodes the attention section of a sequence holding `n_tokens` tokens. Unsupported
// layouts are stored Raw (see above). Throws std::runtime_error when the section is a
// supported layout but does not hold exactly positions 0..n_tokens-1.
// `held_tokens` (0 = n_tokens): the section holds positions 0..held_tokens-1 and only the
// first `n_tokens` of them are paged (a prefix of a lane, recorded from one export).
// `storage`: a buffer to write the pages into (its capacity is reused, its bytes dropped).
EncodedKvPages encode_kv_pages(std::span<const uint8_t> attention, uint32_t n_tokens,
                               uint32_t held_tokens = 0, std::vector<uint8_t> storage = {});

struct KvPagesInfo {
    KvPagesMode mode = KvPagesMode::Empty;
    size_t header_bytes = 0;
    // Paged only:
    uint32_t n_tokens = 0;
    uint32_t n_pages = 0;
    bool v_trans = false;
    uint32_t n_k_layers = 0;
    uint32_t n_v_entries = 0;
    uint32_t cell_ext_bytes = 0;   // llama_kv_cell_ext per token (M-RoPE / PLE models), or 0
    uint64_t bytes_per_token = 0;  // page bytes per token (all layers, K and V)
    // Raw only:
    uint64_t raw_bytes = 0;
};

// Parses and checks the header against the section size; nullopt + reason when invalid.
std::optional<KvPagesInfo> inspect_kv_pages(std::span<const uint8_t> section, std::string* reason);

// Appends the llama.cpp attention section to `out`. False + reason (nothing appended) when
// the section is inconsistent: truncated or trailing bytes, wrong magic/version/page size,
// another llama.cpp state format, token count different from `expected_tokens`, page count
// or sizes not adding up.
// `n_stream`: the destination context's KV stream count (its sequence count without a
// unified KV cache); the pages do not depend on it, so a payload moves between contexts
// with different lane counts.
bool decode_kv_pages(std::span<const uint8_t> section, uint32_t expected_tokens,
                     int32_t cell_seq_id, uint32_t n_stream, std::vector<uint8_t>& out,
                     std::string* reason);

// Bytes in pieces, in order: a stored payload's blocks, read in place (no joined copy).
using ByteParts = std::span<const std::span<const uint8_t>>;
// Same as above, from the section's bytes in parts.
bool decode_kv_pages(ByteParts section, uint32_t expected_tokens, int32_t cell_seq_id,
                     uint32_t n_stream, std::vector<uint8_t>& out, std::string* reason);
size_t parts_size(ByteParts parts);
// The bytes [begin, end) of `parts`, as views into the same memory.
std::vector<std::span<const uint8_t>> slice_parts(ByteParts parts, size_t begin, size_t end);
void append_parts(std::vector<uint8_t>& out, ByteParts parts);

// Fingerprint of the llama.cpp state format this build reads and writes.
uint64_t llama_state_format_fingerprint();

// llama.cpp per-sequence state blobs (llama_state_seq_get_data_ext) start with an 8-byte
// header: u32 magic, i32 source sequence id. Payloads store the blob without it (it names
// the lane, which would defeat deduplication) and get it back on import.
inline constexpr size_t kSeqStateHeaderBytes = 8;
// The blob without its header; throws std::runtime_error when it is not a sequence state.
std::span<const uint8_t> seq_state_body(std::span<const uint8_t> blob);
// Appends a header for an import (the reader ignores the source sequence id).
void append_seq_state_header(std::vector<uint8_t>& out);

}  // namespace skippy::runtime
