// Fuzz target: stage::decode_payload (with the KV pages codec behind it) and
// cache::PayloadDescriptor::validate_against, the checks that stand between stored cache
// bytes and llama.cpp's state reader.
//
// Input (FuzzedDataProvider), first a mode byte:
//   synthetic: a descriptor, a layout and an expected token count drawn from the input
//              (often consistent with each other, to get past the early checks), then the
//              payload bytes;
//   mutated:   a real payload exported at start-up from a tiny dense (full-state), hybrid
//              qwen35 (kv-recurrent, paged KV) or mamba2 (kv-recurrent, empty KV) model,
//              with input-driven byte edits, truncation, extension and descriptor changes.
// Invariants: decode_payload never crashes or reads out of bounds (ASan), accepts only
// payloads its descriptor validates, returns the llama.cpp header + the payload for
// full-state and the recurrent section unchanged at the end for kv-recurrent; unmutated
// real payloads decode to exactly the blob llama.cpp exported. validate_against accepts
// only self-consistent descriptors (section sizes within the payload, no overflow).
// With SKIPPY_FUZZ_IMPORT=1 every accepted mutated payload is also imported into a real
// context (llama.cpp's reader must reject, not crash, on what decode_payload lets through).
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/payload_descriptor.h"
#include "fuzz_models.h"
#include "runtime/inference_context.h"
#include "runtime/model.h"
#include "stage/state_payload.h"

namespace {
// The two steps of a record (scheduler-thread copy, worker encoding) as one call, and the
// decoder with an optional result, as the target was written against.
skippy::stage::EncodedPayload export_payload(const skippy::runtime::InferenceContext& ctx,
                                             skippy::runtime::SeqId lane, uint32_t n,
                                             const skippy::stage::PayloadLayout& layout) {
    return skippy::stage::encode_payload(skippy::stage::capture_state(ctx, lane, n, layout),
                                         layout);
}
std::optional<std::vector<uint8_t>> decode_payload(std::span<const uint8_t> bytes,
                                                   const skippy::cache::PayloadDescriptor& d,
                                                   uint32_t n,
                                                   const skippy::stage::PayloadLayout& layout,
                                                   std::string* reason) {
    std::vector<uint8_t> out;
    if (!skippy::stage::decode_payload(bytes, d, n, layout, out, reason)) {
        return std::nullopt;
    }
    return out;
}
}  // namespace

namespace {

using skippy::fuzz::fail;
using namespace skippy;

constexpr uint32_t kLlamaSeqStateMagic = 0xaf143cd8;
constexpr size_t kHeader = 8;

struct RealPayload {
    std::string name;
    std::unique_ptr<runtime::Model> model;
    std::unique_ptr<runtime::InferenceContext> context;
    stage::PayloadLayout layout;
    stage::EncodedPayload encoded;
    std::vector<uint8_t> exported;  // llama.cpp's own blob (with header) for the same state
    uint32_t n_tokens = 0;
};

std::vector<std::unique_ptr<RealPayload>> g_real;
bool g_import = false;

std::unique_ptr<RealPayload> make_real(const std::string& arch, const char* argv0,
                                       cache::PayloadKind kind, uint32_t n_tokens) {
    auto r = std::make_unique<RealPayload>();
    r->name = arch;
    r->model = runtime::Model::load(fuzz::tiny_model(arch, argv0));
    runtime::ContextOptions options;
    options.n_ctx = 512;
    options.n_seq_max = 2;
    options.n_batch = 256;
    options.n_ubatch = 256;
    options.n_threads = 1;
    r->context = std::make_unique<runtime::InferenceContext>(*r->model, options);
    r->context->batch_clear();
    for (uint32_t i = 0; i < n_tokens; ++i) {
        r->context->batch_add(static_cast<runtime::Token>(100 + 7 * i), static_cast<int32_t>(i), 0,
                              i + 1 == n_tokens);
    }
    if (r->context->decode() != 0) {
        fail("prefill of the " + arch + " seed state failed");
    }
    r->layout.kind = kind;
    r->layout.n_layer = r->model->n_layer();
    r->layout.k_type = options.type_k;
    r->layout.v_type = options.type_v;
    r->layout.has_attention = r->model->kind() != runtime::ModelKind::Recurrent;
    r->layout.has_recurrent = r->model->kind() != runtime::ModelKind::Dense;
    r->layout.n_stream = options.n_seq_max;
    r->n_tokens = n_tokens;
    r->encoded = export_payload(*r->context, 0, n_tokens, r->layout);
    r->exported = r->context->state_export(0, runtime::StateScope::Full);
    std::string reason;
    const auto decoded = decode_payload(r->encoded.bytes, r->encoded.descriptor, n_tokens,
                                               r->layout, &reason);
    if (!decoded) {
        fail("a fresh " + arch + " export does not decode: " + reason);
    }
    if (*decoded != r->exported) {
        fail("a fresh " + arch + " export does not decode to llama.cpp's blob");
    }
    return r;
}

std::string pick_type(FuzzedDataProvider& in) {
    static const char* const types[] = {"f16", "f32", "q8_0", "bf16", ""};
    return types[in.ConsumeIntegralInRange<size_t>(0, 4)];
}

// Either a value consistent with `consistent` or anything.
template <typename T>
T maybe(FuzzedDataProvider& in, T consistent) {
    switch (in.ConsumeIntegralInRange<int>(0, 3)) {
        case 0:
            return in.ConsumeIntegral<T>();
        case 1:
            return static_cast<T>(consistent + in.ConsumeIntegralInRange<int>(-2, 2));
        default:
            return consistent;
    }
}

void check_validate(const cache::PayloadDescriptor& d, uint64_t actual) {
    if (d.validate_against(actual).has_value()) {
        return;
    }
    if (d.payload_bytes != actual || d.payload_bytes == 0 || d.token_end <= d.token_begin ||
        d.layer_end <= d.layer_begin) {
        fail("validate_against accepted an inconsistent descriptor");
    }
    if (d.kind == cache::PayloadKind::KvPages &&
        (d.kv_bytes > d.payload_bytes || d.recurrent_bytes > d.payload_bytes ||
         d.kv_bytes + d.recurrent_bytes != d.payload_bytes)) {
        fail("validate_against accepted section sizes outside the payload (kv_bytes=" +
             std::to_string(d.kv_bytes) + " recurrent_bytes=" + std::to_string(d.recurrent_bytes) +
             " payload_bytes=" + std::to_string(d.payload_bytes) + ")");
    }
}

void check_decoded(const std::vector<uint8_t>& bytes, const cache::PayloadDescriptor& d,
                   uint32_t expected_tokens, const stage::PayloadLayout& layout,
                   const std::vector<uint8_t>& blob) {
    check_validate(d, bytes.size());
    if (d.kind != layout.kind || d.token_begin != 0 || d.token_end != expected_tokens ||
        d.layer_end != layout.n_layer || d.k_type != layout.k_type || d.v_type != layout.v_type) {
        fail("decode_payload accepted a descriptor that does not match the layout");
    }
    uint32_t magic = 0;
    if (blob.size() < kHeader ||
        (std::memcpy(&magic, blob.data(), 4), magic) != kLlamaSeqStateMagic) {
        fail("decoded blob without the llama.cpp sequence state header");
    }
    if (d.kind == cache::PayloadKind::FullState) {
        if (blob.size() != kHeader + bytes.size() ||
            std::memcmp(blob.data() + kHeader, bytes.data(), bytes.size()) != 0) {
            fail("full-state decode changed the payload");
        }
        return;
    }
    const size_t recurrent = static_cast<size_t>(d.recurrent_bytes);
    if (blob.size() < kHeader + recurrent ||
        std::memcmp(blob.data() + blob.size() - recurrent, bytes.data() + bytes.size() - recurrent,
                    recurrent) != 0) {
        fail("kv-recurrent decode changed the recurrent section");
    }
}

void synthetic(FuzzedDataProvider& in) {
    stage::PayloadLayout layout;
    layout.kind =
        in.ConsumeBool() ? cache::PayloadKind::KvPages : cache::PayloadKind::FullState;
    layout.n_layer = in.ConsumeIntegralInRange<int32_t>(0, 64);
    layout.k_type = pick_type(in);
    layout.v_type = in.ConsumeBool() ? layout.k_type : pick_type(in);
    layout.has_recurrent = in.ConsumeBool();
    layout.n_stream = in.ConsumeIntegralInRange<uint32_t>(1, 4);
    const uint32_t expected = in.ConsumeIntegralInRange<uint32_t>(0, 5000);

    cache::PayloadDescriptor d;
    d.kind = in.ConsumeBool() ? layout.kind
                              : (in.ConsumeBool() ? cache::PayloadKind::KvPages
                                                  : cache::PayloadKind::FullState);
    d.token_begin = maybe<uint32_t>(in, 0);
    d.token_end = maybe<uint32_t>(in, expected);
    d.layer_begin = maybe<int32_t>(in, 0);
    d.layer_end = maybe<int32_t>(in, layout.n_layer);
    d.k_type = in.ConsumeBool() ? layout.k_type : pick_type(in);
    d.v_type = in.ConsumeBool() ? layout.v_type : pick_type(in);
    const size_t size_hint = in.remaining_bytes() > 16 ? in.remaining_bytes() - 16 : 0;
    const uint64_t kv_hint = in.ConsumeIntegralInRange<uint64_t>(0, size_hint);
    d.kv_bytes = maybe<uint64_t>(in, kv_hint);
    const uint64_t payload_hint = size_hint;
    d.payload_bytes = maybe<uint64_t>(in, payload_hint);
    d.recurrent_bytes = maybe<uint64_t>(in, d.payload_bytes - d.kv_bytes);  // may wrap

    const std::vector<uint8_t> bytes = in.ConsumeRemainingBytes<uint8_t>();
    check_validate(d, bytes.size());
    check_validate(d, d.payload_bytes);
    std::string reason;
    const auto blob = decode_payload(bytes, d, expected, layout, &reason);
    if (blob) {
        check_decoded(bytes, d, expected, layout, *blob);
    } else if (reason.empty()) {
        fail("decode_payload rejected without a reason");
    }
}

void mutated(FuzzedDataProvider& in) {
    RealPayload& real = *g_real[in.ConsumeIntegralInRange<size_t>(0, g_real.size() - 1)];
    std::vector<uint8_t> bytes = real.encoded.bytes;
    cache::PayloadDescriptor d = real.encoded.descriptor;
    uint32_t expected = real.n_tokens;
    const int edits = in.ConsumeIntegralInRange<int>(0, 8);
    for (int i = 0; i < edits && in.remaining_bytes() > 0; ++i) {
        switch (in.ConsumeIntegralInRange<int>(0, 8)) {
            case 0:  // flip one byte
            case 1: {
                if (!bytes.empty()) {
                    const size_t at = in.ConsumeIntegralInRange<size_t>(0, bytes.size() - 1);
                    bytes[at] ^= in.ConsumeIntegralInRange<uint8_t>(1, 255);
                }
                break;
            }
            case 2: {  // overwrite a 32-bit field (counts, types, sizes) with any value
                if (bytes.size() >= 4) {
                    const size_t at = in.ConsumeIntegralInRange<size_t>(0, bytes.size() - 4);
                    const uint32_t value = in.ConsumeIntegral<uint32_t>();
                    std::memcpy(bytes.data() + at, &value, 4);
                }
                break;
            }
            case 3: {  // truncate (keeping the descriptor consistent or not)
                bytes.resize(in.ConsumeIntegralInRange<size_t>(0, bytes.size()));
                if (in.ConsumeBool()) {
                    d.payload_bytes = bytes.size();
                    d.recurrent_bytes = d.payload_bytes - std::min(d.kv_bytes, d.payload_bytes);
                }
                break;
            }
            case 4: {  // append bytes
                const auto extra = in.ConsumeBytes<uint8_t>(in.ConsumeIntegralInRange(0, 64));
                bytes.insert(bytes.end(), extra.begin(), extra.end());
                if (in.ConsumeBool()) {
                    d.payload_bytes = bytes.size();
                    d.recurrent_bytes += extra.size();
                }
                break;
            }
            case 5:  // move the section boundary
                d.kv_bytes = in.ConsumeIntegralInRange<uint64_t>(0, bytes.size());
                d.recurrent_bytes = bytes.size() - d.kv_bytes;
                d.payload_bytes = bytes.size();
                break;
            case 6:
                d.kv_bytes = in.ConsumeIntegral<uint64_t>();
                d.recurrent_bytes = in.ConsumeBool() ? d.payload_bytes - d.kv_bytes
                                                     : in.ConsumeIntegral<uint64_t>();
                break;
            case 7:
                expected = in.ConsumeIntegralInRange<uint32_t>(0, 2 * real.n_tokens + 70);
                d.token_end = in.ConsumeBool() ? expected : d.token_end;
                break;
            case 8:
                d.layer_end = in.ConsumeIntegralInRange<int32_t>(-1, 8);
                break;
        }
    }
    std::string reason;
    const auto blob = decode_payload(bytes, d, expected, real.layout, &reason);
    if (!blob) {
        if (reason.empty()) {
            fail("decode_payload rejected without a reason");
        }
        if (edits == 0) {
            fail("an unmutated " + real.name + " payload was rejected: " + reason);
        }
        return;
    }
    check_decoded(bytes, d, expected, real.layout, *blob);
    if (edits == 0 && *blob != real.exported) {
        fail("an unmutated " + real.name + " payload decoded differently");
    }
    if (g_import) {
        real.context->state_import(*blob, 1, runtime::StateScope::Full);
        real.context->seq_clear(1);
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
    const char* argv0 = *argc > 0 ? (*argv)[0] : nullptr;
    const char* import = std::getenv("SKIPPY_FUZZ_IMPORT");
    g_import = import != nullptr && std::string(import) == "1";
    // 70 tokens: two KV pages (64 + 6) on the hybrid model.
    g_real.push_back(make_real("llama", argv0, cache::PayloadKind::FullState, 70));
    g_real.push_back(make_real("llama", argv0, cache::PayloadKind::KvPages, 70));
    g_real.push_back(make_real("qwen35", argv0, cache::PayloadKind::KvPages, 70));
    g_real.push_back(make_real("mamba2", argv0, cache::PayloadKind::KvPages, 9));
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FuzzedDataProvider in(data, size);
    if (in.ConsumeBool()) {
        synthetic(in);
    } else {
        mutated(in);
    }
    return 0;
}
