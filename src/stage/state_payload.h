// State payloads: how an exported sequence state is laid out for the exact-state cache.
//
//   full-state:   the whole llama.cpp per-sequence blob (attention KV + recurrent state),
//                 without its 8-byte magic/seq-id header.
//   kv-recurrent: [attention KV pages][recurrent section]. The attention section of the
//                 llama.cpp blob is re-laid out as token-range pages (stage/kv_pages.h:
//                 format version, 64-token pages, raw fallback for layouts it does not
//                 page, an empty header for pure recurrent models); the recurrent section
//                 is the PARTIAL_ONLY export (the state exactly at the checkpoint), as is.
//                 descriptor.kv_bytes is the paged section's size. Cuts fall after the
//                 pages' header, after every page and between the sections, so a longer
//                 prefix shares the page blocks of a shorter one in the block store.
//
// decode_payload() checks the payload against its descriptor (and the pages against the
// token range) and returns the bytes to import with StateScope::Full into any lane; any
// inconsistency is an error that quarantines the entry.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/payload_descriptor.h"
#include "runtime/inference_context.h"

namespace skippy::stage {

struct EncodedPayload {
    std::vector<uint8_t> bytes;
    cache::PayloadDescriptor descriptor;
    std::vector<size_t> cuts;  // block boundaries
};

struct PayloadLayout {
    cache::PayloadKind kind = cache::PayloadKind::KvRecurrent;
    int32_t n_layer = 0;
    std::string k_type;
    std::string v_type;
    // Pure recurrent models: the whole state is the recurrent section (no attention KV),
    // so the partial-only export that would find it is skipped.
    bool attention_free = false;
};

// Exports the lane's state holding `n_tokens` tokens. Throws std::runtime_error if the
// export is empty or inconsistent.
EncodedPayload export_payload(const runtime::InferenceContext& context, runtime::SeqId lane,
                              uint32_t n_tokens, const PayloadLayout& layout);

// Validates `bytes` against `descriptor` (kind, token range, section sizes) and returns
// the llama.cpp blob to import; nullopt + reason when the payload is unusable.
enum class PayloadPart {
    Full,           // the whole state: import with StateScope::Full
    RecurrentOnly,  // kv-recurrent only: the recurrent section, import with PartialOnly
};

std::optional<std::vector<uint8_t>> decode_payload(std::span<const uint8_t> bytes,
                                                   const cache::PayloadDescriptor& descriptor,
                                                   uint32_t expected_tokens,
                                                   const PayloadLayout& layout, std::string* reason,
                                                   PayloadPart part = PayloadPart::Full);

}  // namespace skippy::stage
