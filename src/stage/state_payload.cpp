#include "stage/state_payload.h"

#include <cstring>
#include <stdexcept>

#include "runtime/seq_state_format.h"

namespace skippy::stage {

using runtime::StateScope;

CapturedState capture_state(const runtime::InferenceContext& context, runtime::SeqId lane,
                            uint32_t n_tokens, const PayloadLayout& layout,
                            std::vector<uint8_t> storage) {
    CapturedState out;
    out.n_tokens = n_tokens;
    out.blob = std::move(storage);
    if (!context.state_export_into(lane, StateScope::Full, out.blob)) {
        throw std::runtime_error("state export returned no bytes");
    }
    const size_t body = runtime::seq_state_body(out.blob).size();
    if (layout.kind == cache::PayloadKind::KvPages && layout.has_recurrent) {
        if (!layout.has_attention) {
            out.recurrent_bytes = body;
        } else {
            // llama.cpp writes the attention part first, then the recurrent part, which is
            // what a partial-only export holds. Only its size is needed here.
            const size_t partial = context.state_size(lane, StateScope::PartialOnly);
            if (partial <= runtime::kSeqStateHeaderBytes ||
                partial - runtime::kSeqStateHeaderBytes > body) {
                throw std::runtime_error("state layout not understood: recurrent section size");
            }
            out.recurrent_bytes = partial - runtime::kSeqStateHeaderBytes;
        }
    }
    return out;
}

EncodedPayload encode_payload(const CapturedState& state, const PayloadLayout& layout,
                              std::vector<uint8_t> storage) {
    EncodedPayload out;
    out.bytes = std::move(storage);
    out.bytes.clear();
    const std::span<const uint8_t> raw = runtime::seq_state_body(state.blob);
    auto& d = out.descriptor;
    d.kind = layout.kind;
    d.token_begin = 0;
    d.token_end = state.n_tokens;
    d.layer_begin = 0;
    d.layer_end = layout.n_layer;
    d.k_type = layout.k_type;
    d.v_type = layout.v_type;
    if (layout.kind != cache::PayloadKind::KvPages) {
        out.bytes.assign(raw.begin(), raw.end());
        d.payload_bytes = out.bytes.size();
        return out;
    }
    if (state.recurrent_bytes > raw.size()) {
        throw std::runtime_error("state layout not understood: recurrent section too large");
    }
    runtime::EncodedKvPages pages = runtime::encode_kv_pages(
        raw.first(raw.size() - state.recurrent_bytes), state.n_tokens, 0, std::move(out.bytes));
    out.bytes = std::move(pages.bytes);
    d.kv_bytes = out.bytes.size();
    d.recurrent_bytes = state.recurrent_bytes;
    out.bytes.insert(out.bytes.end(), raw.end() - static_cast<ptrdiff_t>(state.recurrent_bytes),
                     raw.end());
    d.payload_bytes = out.bytes.size();
    out.cuts = std::move(pages.cuts);
    if (state.recurrent_bytes > 0) {
        out.cuts.push_back(d.kv_bytes);
    }
    return out;
}

std::vector<size_t> payload_cuts(std::span<const uint8_t> bytes,
                                 const cache::PayloadDescriptor& descriptor) {
    std::vector<size_t> cuts;
    if (descriptor.kind != cache::PayloadKind::KvPages || descriptor.kv_bytes > bytes.size()) {
        return cuts;
    }
    const auto info = runtime::inspect_kv_pages(bytes.first(descriptor.kv_bytes), nullptr);
    if (!info) {
        return cuts;
    }
    if (info->mode == runtime::KvPagesMode::Paged) {
        for (uint32_t page = 0; page < info->n_pages; ++page) {
            cuts.push_back(info->header_bytes + static_cast<size_t>(page) * runtime::kKvPageTokens *
                                                    info->bytes_per_token);
        }
    } else if (info->header_bytes < descriptor.kv_bytes) {
        cuts.push_back(info->header_bytes);
    }
    if (descriptor.recurrent_bytes > 0) {
        cuts.push_back(descriptor.kv_bytes);
    }
    std::erase_if(cuts, [&](size_t c) { return c == 0 || c >= bytes.size(); });
    return cuts;
}

std::vector<uint8_t> captured_recurrent_blob(const CapturedState& state) {
    std::vector<uint8_t> blob;
    runtime::append_seq_state_header(blob);
    blob.insert(blob.end(), state.blob.end() - static_cast<ptrdiff_t>(state.recurrent_bytes),
                state.blob.end());
    return blob;
}

bool decode_payload(std::span<const uint8_t> bytes, const cache::PayloadDescriptor& descriptor,
                    uint32_t expected_tokens, const PayloadLayout& layout,
                    std::vector<uint8_t>& out, std::string* reason, PayloadPart part) {
    const std::span<const uint8_t> one[1] = {bytes};
    return decode_payload(runtime::ByteParts(one), descriptor, expected_tokens, layout, out, reason,
                          part);
}

bool decode_payload(runtime::ByteParts bytes, const cache::PayloadDescriptor& descriptor,
                    uint32_t expected_tokens, const PayloadLayout& layout,
                    std::vector<uint8_t>& out, std::string* reason, PayloadPart part) {
    out.clear();
    auto fail = [&](const std::string& why) {
        if (reason != nullptr) {
            *reason = why;
        }
        out.clear();
        return false;
    };
    const size_t size = runtime::parts_size(bytes);
    if (size == 0) {
        return fail("empty payload");
    }
    if (auto why = descriptor.validate_against(size)) {
        return fail(*why);
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
    const bool paged = descriptor.kind == cache::PayloadKind::KvPages;
    if (paged &&
        (descriptor.kv_bytes > size || descriptor.recurrent_bytes != size - descriptor.kv_bytes)) {
        return fail("section sizes mismatch");
    }
    if (paged && (descriptor.recurrent_bytes > 0) != layout.has_recurrent) {
        return fail("recurrent section does not match the model");
    }
    runtime::append_seq_state_header(out);
    if (part == PayloadPart::RecurrentOnly) {
        if (!paged || descriptor.recurrent_bytes == 0) {
            return fail("payload has no separate recurrent section");
        }
        runtime::append_parts(out, runtime::slice_parts(bytes, descriptor.kv_bytes, size));
        return true;
    }
    if (!paged) {
        runtime::append_parts(out, bytes);
        return true;
    }
    const auto kv_bytes = static_cast<size_t>(descriptor.kv_bytes);
    out.reserve(runtime::kSeqStateHeaderBytes + size + size_t{16} * expected_tokens +
                4 * size_t{layout.n_stream} + 256);
    std::string why;
    if (!runtime::decode_kv_pages(runtime::slice_parts(bytes, 0, kv_bytes), expected_tokens,
                                  /*cell_seq_id=*/0, layout.n_stream, out, &why)) {
        return fail(why);
    }
    runtime::append_parts(out, runtime::slice_parts(bytes, kv_bytes, size));
    return true;
}

}  // namespace skippy::stage
