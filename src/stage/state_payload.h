// State payloads: how a lane's exported state becomes an exact-state cache payload, in two
// steps so that the scheduler thread only copies state out:
//
//   capture_state()   scheduler thread: the lane's llama.cpp sequence state, copied out
//                     (importable as is into any lane: the "recent record" restore path).
//   encode_payload()  record worker: the capture cut into a payload with block cuts.
//   decode_payload()  restore path: a payload checked against its descriptor and turned
//                     back into the bytes to import.
//
// Payload kinds (cache::PayloadKind):
//   full-state: the whole per-sequence state blob without its llama.cpp header.
//   kv-pages:   [attention KV pages][recurrent section]. The attention section is re-laid
//               out as token-range pages (runtime/seq_state_format.h: a longer prefix shares
//               the pages, so the blocks, of a shorter one; an empty header for pure
//               recurrent models); the recurrent section (hybrid and recurrent models) is
//               the state exactly at the checkpoint, as llama.cpp wrote it; dense models
//               have none. descriptor.kv_bytes is the paged section's size. Cuts fall after
//               the pages' header, after every page and between the sections.
//
// Any inconsistency found by decode_payload() is an error that quarantines the entry.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/payload_descriptor.h"
#include "runtime/inference_context.h"
#include "runtime/seq_state_format.h"

namespace skippy::stage {

struct PayloadLayout {
    cache::PayloadKind kind = cache::PayloadKind::KvPages;
    int32_t n_layer = 0;
    std::string k_type;
    std::string v_type;
    bool has_attention = true;   // false: pure recurrent model (no KV section)
    bool has_recurrent = false;  // hybrid and recurrent models
    uint32_t n_stream = 1;       // KV streams of the importing context (= its lanes)
};

// A lane's state as llama.cpp exported it, with where its recurrent section starts.
struct CapturedState {
    std::vector<uint8_t> blob;   // llama.cpp per-sequence blob, header included
    size_t recurrent_bytes = 0;  // tail of the blob that is the recurrent state
    uint32_t n_tokens = 0;
};

// Scheduler thread. Throws std::runtime_error if the export is empty or inconsistent.
// `storage`: the buffer to export into (a recycled one does not page-fault).
CapturedState capture_state(const runtime::InferenceContext& context, runtime::SeqId lane,
                            uint32_t n_tokens, const PayloadLayout& layout,
                            std::vector<uint8_t> storage = {});

struct EncodedPayload {
    std::vector<uint8_t> bytes;
    cache::PayloadDescriptor descriptor;
    std::vector<size_t> cuts;  // block boundaries
};

// Any thread. Throws std::runtime_error when the captured layout is not understood.
// `storage`: a buffer for the payload bytes (its capacity is reused, its bytes dropped).
EncodedPayload encode_payload(const CapturedState& state, const PayloadLayout& layout,
                              std::vector<uint8_t> storage = {});

enum class PayloadPart {
    Full,           // the whole state: import with StateScope::Full
    RecurrentOnly,  // kv-pages with a recurrent section: import with StateScope::PartialOnly
};

// Validates `bytes` against `descriptor` (kind, token range, section sizes) and writes the
// llama.cpp blob to import into `out` (a buffer reused across restores); false + reason
// when the payload is unusable.
bool decode_payload(std::span<const uint8_t> bytes, const cache::PayloadDescriptor& descriptor,
                    uint32_t expected_tokens, const PayloadLayout& layout,
                    std::vector<uint8_t>& out, std::string* reason,
                    PayloadPart part = PayloadPart::Full);
// Same, from the payload's bytes in parts (a RAM-tier snapshot's blocks, read in place).
bool decode_payload(runtime::ByteParts bytes, const cache::PayloadDescriptor& descriptor,
                    uint32_t expected_tokens, const PayloadLayout& layout,
                    std::vector<uint8_t>& out, std::string* reason,
                    PayloadPart part = PayloadPart::Full);

// Block cuts of a stored payload (after the pages' header, after every page, between the
// sections), recomputed from its bytes: a payload read back from disk dedupes in RAM like
// a fresh one. Empty when the layout is not paged.
std::vector<size_t> payload_cuts(std::span<const uint8_t> bytes,
                                 const cache::PayloadDescriptor& descriptor);

// The recurrent section of a captured state, as an importable PartialOnly blob.
std::vector<uint8_t> captured_recurrent_blob(const CapturedState& state);

}  // namespace skippy::stage
