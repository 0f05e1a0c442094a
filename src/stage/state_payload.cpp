#include "stage/state_payload.h"

#include <cstring>
#include <stdexcept>

#include "stage/kv_pages.h"

namespace skippy::stage {

using runtime::StateScope;

namespace {

// llama.cpp per-sequence state blobs start with this magic and the source sequence id;
// the rest is the memory's own serialization. Payloads store the blob without this header
// (it names the lane, which would defeat deduplication) and get it back on import.
constexpr uint32_t kLlamaSeqStateMagic = 0xaf143cd8;
constexpr size_t kLlamaSeqStateHeader = 8;

void check_header(const std::vector<uint8_t>& blob) {
    uint32_t magic = 0;
    if (blob.size() < kLlamaSeqStateHeader) {
        throw std::runtime_error("state export shorter than its header");
    }
    std::memcpy(&magic, blob.data(), sizeof magic);
    if (magic != kLlamaSeqStateMagic) {
        throw std::runtime_error("unsupported llama.cpp sequence state format (magic mismatch)");
    }
}

}  // namespace

EncodedPayload export_payload(const runtime::InferenceContext& context, runtime::SeqId lane,
                              uint32_t n_tokens, const PayloadLayout& layout) {
    EncodedPayload out;
    std::vector<uint8_t> full = context.state_export(lane, StateScope::Full);
    if (full.empty()) {
        throw std::runtime_error("state export returned no bytes");
    }
    check_header(full);
    const std::span<const uint8_t> raw =
        std::span<const uint8_t>(full).subspan(kLlamaSeqStateHeader);
    auto& d = out.descriptor;
    d.kind = layout.kind;
    d.token_begin = 0;
    d.token_end = n_tokens;
    d.layer_begin = 0;
    d.layer_end = layout.n_layer;
    d.k_type = layout.k_type;
    d.v_type = layout.v_type;
    if (layout.kind != cache::PayloadKind::KvRecurrent) {
        out.bytes.assign(raw.begin(), raw.end());
        d.payload_bytes = out.bytes.size();
        return out;
    }
    size_t recurrent_size = raw.size();
    if (!layout.attention_free) {
        const std::vector<uint8_t> partial = context.state_export(lane, StateScope::PartialOnly);
        check_header(partial);
        recurrent_size = partial.size() - kLlamaSeqStateHeader;
        // llama.cpp writes the attention part first, then the recurrent part.
        if (recurrent_size == 0 || recurrent_size > raw.size() ||
            std::memcmp(raw.data() + (raw.size() - recurrent_size),
                        partial.data() + kLlamaSeqStateHeader, recurrent_size) != 0) {
            throw std::runtime_error("state layout not understood: recurrent section mismatch");
        }
    }
    {
        // The attention part is stored as token-range pages; the recurrent part as is.
        EncodedKvPages pages = encode_kv_pages(raw.first(raw.size() - recurrent_size), n_tokens);
        std::vector<uint8_t> bytes = std::move(pages.bytes);
        d.kv_bytes = bytes.size();
        d.recurrent_bytes = recurrent_size;
        bytes.insert(bytes.end(), raw.end() - static_cast<ptrdiff_t>(recurrent_size), raw.end());
        out.bytes = std::move(bytes);
        d.payload_bytes = out.bytes.size();
        out.cuts = std::move(pages.cuts);
        out.cuts.push_back(d.kv_bytes);
    }
    return out;
}

std::optional<std::vector<uint8_t>> decode_payload(std::span<const uint8_t> bytes,
                                                   const cache::PayloadDescriptor& descriptor,
                                                   uint32_t expected_tokens,
                                                   const PayloadLayout& layout, std::string* reason,
                                                   PayloadPart part) {
    auto fail = [&](const char* why) -> std::optional<std::vector<uint8_t>> {
        if (reason != nullptr) {
            *reason = why;
        }
        return std::nullopt;
    };
    if (bytes.empty()) {
        return fail("empty payload");
    }
    if (auto why = descriptor.validate_against(bytes.size())) {
        if (reason != nullptr) {
            *reason = *why;
        }
        return std::nullopt;
    }
    if (descriptor.kind != layout.kind) {
        return fail("payload kind mismatch");
    }
    if (descriptor.token_begin != 0 || descriptor.token_end != expected_tokens) {
        return fail("token range mismatch");
    }
    if (descriptor.layer_begin != 0 || descriptor.layer_end != layout.n_layer ||
        descriptor.k_type != layout.k_type || descriptor.v_type != layout.v_type) {
        return fail("layer range or KV types mismatch");
    }
    if (descriptor.kind == cache::PayloadKind::KvRecurrent &&
        (descriptor.kv_bytes > bytes.size() ||
         descriptor.recurrent_bytes != bytes.size() - descriptor.kv_bytes)) {
        return fail("section sizes mismatch");
    }
    // The reader ignores the source sequence id (header and cells): it imports into the
    // destination sequence given to it.
    const uint32_t magic = kLlamaSeqStateMagic;
    const int32_t source_seq = 0;
    std::vector<uint8_t> blob(kLlamaSeqStateHeader);
    std::memcpy(blob.data(), &magic, sizeof magic);
    std::memcpy(blob.data() + sizeof magic, &source_seq, sizeof source_seq);
    if (part == PayloadPart::RecurrentOnly) {
        if (descriptor.kind != cache::PayloadKind::KvRecurrent || descriptor.recurrent_bytes == 0) {
            return fail("payload has no separate recurrent section");
        }
        blob.insert(blob.end(), bytes.begin() + static_cast<ptrdiff_t>(descriptor.kv_bytes),
                    bytes.end());
        return blob;
    }
    if (descriptor.kind != cache::PayloadKind::KvRecurrent) {
        blob.insert(blob.end(), bytes.begin(), bytes.end());
        return blob;
    }
    const auto kv_bytes = static_cast<size_t>(descriptor.kv_bytes);
    std::string why;
    blob.reserve(kLlamaSeqStateHeader + bytes.size() + size_t{16} * expected_tokens + 256);
    if (!decode_kv_pages(bytes.first(kv_bytes), expected_tokens, source_seq, blob, &why)) {
        if (reason != nullptr) {
            *reason = why;
        }
        return std::nullopt;
    }
    blob.insert(blob.end(), bytes.begin() + static_cast<ptrdiff_t>(kv_bytes), bytes.end());
    return blob;
}

}  // namespace skippy::stage
