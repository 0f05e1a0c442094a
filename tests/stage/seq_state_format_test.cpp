// KV pages codec (runtime/seq_state_format.h) and its use in kv-recurrent payloads
// (stage/state_payload.h): byte-exact round trips on real llama.cpp states (hybrid qwen35
// with transposed and non-transposed V, dense llama, pure recurrent mamba2), restore into
// another lane, prefix sharing in the block store, fallbacks and decode errors.
#include "runtime/seq_state_format.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "cache/block_store.h"
#include "runtime/factory/model_factory.h"
#include "runtime/inference_context.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "stage/state_payload.h"
#include "test_models.h"

namespace skippy::stage {
namespace {

using runtime::ContextOptions;
using runtime::decode_kv_pages;
using runtime::encode_kv_pages;
using runtime::EncodedKvPages;
using runtime::InferenceContext;
using runtime::inspect_kv_pages;
using runtime::kKvPagesVersion;
using runtime::KvPagesMode;
using runtime::Model;
using runtime::Pos;
using runtime::SeqId;
using runtime::StateScope;
using runtime::Token;

constexpr size_t kSeqHeader = 8;  // llama.cpp per-sequence blob: magic + source seq id
// Contexts use one thread: with two, ggml's spinning thread barrier makes these tiny decodes
// ~80x slower when the machine's cores are busy (measured: 0.4 s vs 33 s for one test).

std::string model_for(const std::string& arch) {
    return skippy::testing::tiny_model(arch, "stage-test", 11);
}

std::vector<Token> prompt_tokens(const Model& model, size_t n) {
    std::vector<Token> out;
    const auto vocab = static_cast<uint32_t>(model.n_vocab());
    for (size_t i = 0; i < n; ++i) {
        out.push_back(static_cast<Token>((i * 7919u + 13u) % (vocab - 200u) + 100u));
    }
    return out;
}

// Prefill in canonical chunks that end at multiples of 64 (so KV bytes match).
int32_t prefill(InferenceContext& ctx, SeqId seq, const std::vector<Token>& tokens, size_t from,
                size_t to) {
    return skippy::testing::prefill(ctx, seq, tokens, from, to, 64);
}

using skippy::testing::continue_greedy;

PayloadLayout layout_for(const Model& model, cache::PayloadKind kind, uint32_t n_stream) {
    PayloadLayout layout;
    layout.kind = kind;
    layout.n_layer = model.n_layer();
    layout.k_type = "f16";
    layout.v_type = "f16";
    layout.has_attention = model.kind() != runtime::ModelKind::Recurrent;
    layout.has_recurrent = model.kind() != runtime::ModelKind::Dense;
    layout.n_stream = n_stream;
    return layout;
}

// The two steps of a record, as one call.
EncodedPayload export_payload(const InferenceContext& ctx, SeqId lane, uint32_t n,
                              const PayloadLayout& layout) {
    return encode_payload(capture_state(ctx, lane, n, layout), layout);
}

std::optional<std::vector<uint8_t>> decode_payload(std::span<const uint8_t> bytes,
                                                   const cache::PayloadDescriptor& d, uint32_t n,
                                                   const PayloadLayout& layout, std::string* reason,
                                                   PayloadPart part = PayloadPart::Full) {
    std::vector<uint8_t> out;
    if (!stage::decode_payload(bytes, d, n, layout, out, reason, part)) {
        return std::nullopt;
    }
    return out;
}

// decode_kv_pages into a context with one stream (the tests' reference layout).
bool decode_kv_pages(std::span<const uint8_t> section, uint32_t n, int32_t seq,
                     std::vector<uint8_t>& out, std::string* reason, uint32_t n_stream = 1) {
    return runtime::decode_kv_pages(section, n, seq, n_stream, out, reason);
}

std::vector<uint8_t> with_seq(std::vector<uint8_t> blob, int32_t seq) {
    std::memcpy(blob.data() + 4, &seq, sizeof seq);
    return blob;
}

// ---- hybrid model (qwen35), V transposed (flash attention off) and not (on) ----

class HybridKvPagesTest : public ::testing::TestWithParam<bool> {
  protected:
    void SetUp() override {
        model_ = Model::load(model_for("qwen35"));
        ContextOptions options;
        options.n_ctx = 512;
        options.n_seq_max = 3;
        options.n_threads = 1;
        options.flash_attn = GetParam() ? runtime::FlashAttn::On : runtime::FlashAttn::Off;
        ctx_ = std::make_unique<InferenceContext>(*model_, options);
        tokens_ = prompt_tokens(*model_, 200);
        layout_ = layout_for(*model_, cache::PayloadKind::KvPages, ctx_->n_seq_max());
    }
    std::unique_ptr<Model> model_;
    std::unique_ptr<InferenceContext> ctx_;
    std::vector<Token> tokens_;
    PayloadLayout layout_;
};

TEST_P(HybridKvPagesTest, RoundTripReproducesTheLlamaBlob) {
    for (const SeqId lane : {0, 1}) {
        SCOPED_TRACE("lane " + std::to_string(lane));
        ctx_->clear_all();
        prefill(*ctx_, lane, tokens_, 0, 150);
        const auto full = ctx_->state_export(lane, StateScope::Full);
        const auto partial = ctx_->state_export(lane, StateScope::PartialOnly);
        const size_t attn = full.size() - partial.size();
        const auto direct = encode_kv_pages(std::span(full).subspan(kSeqHeader, attn), 150);
        ASSERT_EQ(direct.mode, KvPagesMode::Paged) << direct.raw_reason;
        const EncodedPayload enc = export_payload(*ctx_, lane, 150, layout_);
        const auto& d = enc.descriptor;
        EXPECT_EQ(d.kind, cache::PayloadKind::KvPages);
        EXPECT_EQ(d.token_end, 150u);
        EXPECT_EQ(d.recurrent_bytes, partial.size() - kSeqHeader);
        EXPECT_EQ(d.kv_bytes + d.recurrent_bytes, enc.bytes.size());
        EXPECT_EQ(d.payload_bytes, enc.bytes.size());
        EXPECT_FALSE(d.validate_against(enc.bytes.size()).has_value());

        std::string reason;
        const auto info = inspect_kv_pages(std::span(enc.bytes).first(d.kv_bytes), &reason);
        ASSERT_TRUE(info.has_value()) << reason;
        EXPECT_EQ(info->mode, KvPagesMode::Paged);
        EXPECT_EQ(info->n_tokens, 150u);
        EXPECT_EQ(info->n_pages, 3u);
        EXPECT_EQ(info->v_trans, !GetParam());  // llama.cpp transposes V without flash attn
        EXPECT_EQ(info->n_k_layers, 1u);        // one full-attention layer of four
        EXPECT_EQ(info->n_v_entries, 1u);
        EXPECT_EQ(info->cell_ext_bytes, 12u);  // qwen35 uses M-RoPE: cells carry an ext
        EXPECT_EQ(info->bytes_per_token, 12u + 2u * 128u * 2u);  // ext + K + V rows of 128 f16

        // Cuts: after the header, after pages 0 and 1, between the sections.
        const std::vector<size_t> want_cuts = {
            info->header_bytes, info->header_bytes + 64 * info->bytes_per_token,
            info->header_bytes + 128 * info->bytes_per_token, d.kv_bytes};
        EXPECT_EQ(enc.cuts, want_cuts);

        const auto blob = decode_payload(enc.bytes, d, 150, layout_, &reason);
        ASSERT_TRUE(blob.has_value()) << reason;
        if (lane == 0) {
            EXPECT_EQ(*blob, full);  // byte for byte, header included
        } else {
            // One KV stream per lane: lane 1's export has its cells in the second of three
            // streams; the decoded blob puts them first (the reader takes any stream's
            // cells into the destination lane). Same pages either way.
            std::vector<uint8_t> attention;
            ASSERT_TRUE(decode_kv_pages(std::span(enc.bytes).first(d.kv_bytes), 150, lane,
                                        attention, &reason, ctx_->n_seq_max()))
                << reason;
            EXPECT_EQ(encode_kv_pages(attention, 150).bytes,
                      encode_kv_pages(std::span(full).subspan(kSeqHeader, attn), 150).bytes);
            EXPECT_EQ(
                std::vector<uint8_t>(blob->end() - (partial.size() - kSeqHeader), blob->end()),
                std::vector<uint8_t>(partial.begin() + kSeqHeader, partial.end()));
        }
    }
}

// The restore path decodes a RAM-tier entry from its blocks in place: any split of the
// payload into parts decodes to the same blob as the joined bytes, and missing bytes fail.
TEST_P(HybridKvPagesTest, DecodesTheSameFromPartsSplitAnywhere) {
    prefill(*ctx_, 0, tokens_, 0, 150);
    const EncodedPayload enc = export_payload(*ctx_, 0, 150, layout_);
    const auto& d = enc.descriptor;
    std::string reason;
    const auto whole = decode_payload(enc.bytes, d, 150, layout_, &reason);
    ASSERT_TRUE(whole.has_value()) << reason;
    const auto recurrent =
        decode_payload(enc.bytes, d, 150, layout_, &reason, PayloadPart::RecurrentOnly);
    ASSERT_TRUE(recurrent.has_value()) << reason;
    const std::span<const uint8_t> bytes(enc.bytes);
    const auto split = [&](const std::vector<size_t>& cuts) {
        std::vector<std::span<const uint8_t>> parts;
        size_t at = 0;
        for (size_t c : cuts) {
            parts.push_back(bytes.subspan(at, c - at));  // (an empty part when c == at)
            at = c;
        }
        parts.push_back(bytes.subspan(at));
        return parts;
    };
    std::vector<size_t> every_333;  // mid-row, mid-cell and across the section boundary
    for (size_t c = 333; c < bytes.size(); c += 333) {
        every_333.push_back(c);
    }
    const std::vector<std::vector<size_t>> splits = {
        {},                                            // one part
        enc.cuts,                                      // the blocks the store keeps
        {5, 5, 40},                                    // inside the header: joined once
        {d.kv_bytes - 1, d.kv_bytes, d.kv_bytes + 1},  // around the section boundary
        every_333,
    };
    for (size_t i = 0; i < splits.size(); ++i) {
        SCOPED_TRACE("split " + std::to_string(i));
        const auto parts = split(splits[i]);
        std::vector<uint8_t> out;
        ASSERT_TRUE(stage::decode_payload(parts, d, 150, layout_, out, &reason)) << reason;
        EXPECT_EQ(out, *whole);
        ASSERT_TRUE(
            stage::decode_payload(parts, d, 150, layout_, out, &reason, PayloadPart::RecurrentOnly))
            << reason;
        EXPECT_EQ(out, *recurrent);
    }
    // One byte short, in any part: an error, not a read past the parts.
    auto parts = split(every_333);
    parts.back() = parts.back().first(parts.back().size() - 1);
    std::vector<uint8_t> out;
    EXPECT_FALSE(stage::decode_payload(parts, d, 150, layout_, out, &reason));
    auto kv = runtime::slice_parts(split(every_333), 0, d.kv_bytes);
    kv[3] = kv[3].first(kv[3].size() - 1);
    EXPECT_FALSE(runtime::decode_kv_pages(kv, 150, 0, 1, out, &reason));
    EXPECT_FALSE(reason.empty());
}

TEST_P(HybridKvPagesTest, DecodedStateRestoresIntoAnotherLane) {
    const size_t n = 137;  // checkpoint before the last prompt token
    prefill(*ctx_, 0, tokens_, 0, n);
    const EncodedPayload enc = export_payload(*ctx_, 0, n, layout_);
    const Pos pos_min = ctx_->seq_pos_min(0);  // hybrid: the recurrent cell's position
    int32_t idx = prefill(*ctx_, 0, tokens_, n, n + 1);
    const auto reference = continue_greedy(*ctx_, 0, static_cast<Pos>(n + 1), idx, 10);
    ctx_->seq_clear(0);

    std::string reason;
    const auto blob = decode_payload(enc.bytes, enc.descriptor, n, layout_, &reason);
    ASSERT_TRUE(blob.has_value()) << reason;
    ASSERT_TRUE(ctx_->state_import(*blob, 2, StateScope::Full));
    EXPECT_EQ(ctx_->seq_pos_max(2), static_cast<Pos>(n) - 1);
    EXPECT_EQ(ctx_->seq_pos_min(2), pos_min);
    idx = prefill(*ctx_, 2, tokens_, n, n + 1);
    EXPECT_EQ(continue_greedy(*ctx_, 2, static_cast<Pos>(n + 1), idx, 10), reference);
}

TEST_P(HybridKvPagesTest, LongerPrefixSharesPagesInTheBlockStore) {
    prefill(*ctx_, 0, tokens_, 0, 128);
    const EncodedPayload a = export_payload(*ctx_, 0, 128, layout_);
    ctx_->clear_all();
    prefill(*ctx_, 1, tokens_, 0, 200);  // other lane, canonical chunks 64, 128, 192, 200
    const EncodedPayload b = export_payload(*ctx_, 1, 200, layout_);

    std::string reason;
    const auto ia = inspect_kv_pages(std::span(a.bytes).first(a.descriptor.kv_bytes), &reason);
    const auto ib = inspect_kv_pages(std::span(b.bytes).first(b.descriptor.kv_bytes), &reason);
    ASSERT_TRUE(ia && ib) << reason;
    ASSERT_EQ(ia->header_bytes, ib->header_bytes);
    const size_t two_pages = 128 * ia->bytes_per_token;
    EXPECT_EQ(0, std::memcmp(a.bytes.data() + ia->header_bytes, b.bytes.data() + ib->header_bytes,
                             two_pages))
        << "pages 0-1 differ between the 128- and 200-token prefixes";

    cache::BlockStore store;
    const auto ra = store.insert(a.bytes, a.cuts);
    const auto rb = store.insert(b.bytes, b.cuts);
    ASSERT_TRUE(ra.ok() && rb.ok());
    EXPECT_EQ(rb.report.reused_blocks, 2u);  // pages 0 and 1
    const auto stats = store.stats();
    EXPECT_LT(stats.physical_bytes, stats.logical_bytes);
    EXPECT_EQ(stats.logical_bytes - stats.physical_bytes, two_pages);
    std::printf(
        "[ dedup    ] flash_attn=%d: logical %llu B (128: %zu kv + %llu rec, 200: %zu kv + "
        "%llu rec), physical %llu B, ratio %.3f, attention-only ratio %.3f\n",
        GetParam() ? 1 : 0, static_cast<unsigned long long>(stats.logical_bytes),
        static_cast<size_t>(a.descriptor.kv_bytes),
        static_cast<unsigned long long>(a.descriptor.recurrent_bytes),
        static_cast<size_t>(b.descriptor.kv_bytes),
        static_cast<unsigned long long>(b.descriptor.recurrent_bytes),
        static_cast<unsigned long long>(stats.physical_bytes),
        static_cast<double>(stats.logical_bytes) / static_cast<double>(stats.physical_bytes),
        static_cast<double>(a.descriptor.kv_bytes + b.descriptor.kv_bytes) /
            static_cast<double>(a.descriptor.kv_bytes + b.descriptor.kv_bytes - two_pages));

    // Both entries still reconstruct and decode.
    for (const auto* r : {&ra, &rb}) {
        const auto bytes = store.reconstruct(r->payload);
        ASSERT_TRUE(bytes.ok());
        const auto& enc = r == &ra ? a : b;
        EXPECT_TRUE(decode_payload(bytes.bytes.span(), enc.descriptor, enc.descriptor.token_end,
                                   layout_, &reason)
                        .has_value())
            << reason;
    }
}

TEST_P(HybridKvPagesTest, CorruptPayloadIsADecodeError) {
    prefill(*ctx_, 0, tokens_, 0, 100);
    const EncodedPayload enc = export_payload(*ctx_, 0, 100, layout_);
    std::string reason;
    // Version byte (offset 4 of the pages header).
    auto bad = enc.bytes;
    bad[4] = kKvPagesVersion + 1;
    EXPECT_FALSE(decode_payload(bad, enc.descriptor, 100, layout_, &reason));
    EXPECT_NE(reason.find("format version"), std::string::npos) << reason;
    // Truncated: one byte short (the descriptor no longer matches).
    bad = enc.bytes;
    bad.pop_back();
    EXPECT_FALSE(decode_payload(bad, enc.descriptor, 100, layout_, &reason));
    EXPECT_FALSE(reason.empty());
    // Truncated attention section with a descriptor that agrees with the new size.
    auto d = enc.descriptor;
    bad = enc.bytes;
    bad.erase(bad.begin() + static_cast<ptrdiff_t>(d.kv_bytes) - 1);
    d.kv_bytes -= 1;
    d.payload_bytes -= 1;
    EXPECT_FALSE(decode_payload(bad, d, 100, layout_, &reason));
    EXPECT_NE(reason.find("page bytes"), std::string::npos) << reason;
    // Section boundary moved into the recurrent part.
    d = enc.descriptor;
    d.kv_bytes += 4;
    d.recurrent_bytes -= 4;
    EXPECT_FALSE(decode_payload(enc.bytes, d, 100, layout_, &reason));
    EXPECT_NE(reason.find("kv pages"), std::string::npos) << reason;
    // Token range of the descriptor vs the pages.
    d = enc.descriptor;
    d.token_end = 90;
    EXPECT_FALSE(decode_payload(enc.bytes, d, 90, layout_, &reason));
    EXPECT_NE(reason.find("tokens"), std::string::npos) << reason;
}

INSTANTIATE_TEST_SUITE_P(FlashAttn, HybridKvPagesTest, ::testing::Bool(),
                         [](const auto& param_info) {
                             return param_info.param ? "FlashAttn" : "NoFlashAttn";
                         });

// ---- dense KV (llama), through the full per-sequence state ----

TEST(DenseKvPagesTest, FullStateAttentionRoundTripAndRestore) {
    auto model = Model::load(model_for("llama"));
    ContextOptions options;
    options.n_ctx = 512;
    options.n_seq_max = 3;
    options.n_threads = 1;
    options.flash_attn = runtime::FlashAttn::Off;  // (the V cache transposed, as checked below)
    InferenceContext ctx(*model, options);
    const auto tokens = prompt_tokens(*model, 100);
    const size_t n = 99;
    prefill(ctx, 1, tokens, 0, n);
    const auto full = ctx.state_export(1, StateScope::Full);
    const std::span<const uint8_t> attention = std::span(full).subspan(kSeqHeader);
    const EncodedKvPages pages = encode_kv_pages(attention, n);
    ASSERT_EQ(pages.mode, KvPagesMode::Paged) << pages.raw_reason;
    std::string reason;
    const auto info = inspect_kv_pages(pages.bytes, &reason);
    ASSERT_TRUE(info) << reason;
    EXPECT_EQ(info->n_k_layers, 2u);
    EXPECT_EQ(info->n_v_entries, 2u);
    EXPECT_TRUE(info->v_trans);
    EXPECT_EQ(info->cell_ext_bytes, 0u);
    EXPECT_EQ(info->n_pages, 2u);
    EXPECT_EQ(pages.cuts.size(), 2u);  // after the header and after page 0

    std::vector<uint8_t> decoded;
    ASSERT_TRUE(decode_kv_pages(pages.bytes, n, 1, decoded, &reason, ctx.n_seq_max())) << reason;
    EXPECT_EQ(encode_kv_pages(decoded, n).bytes, pages.bytes);  // lane 1 is stream 1 of 3

    int32_t idx = prefill(ctx, 1, tokens, n, n + 1);
    const auto reference = continue_greedy(ctx, 1, static_cast<Pos>(n + 1), idx, 8);
    ctx.seq_clear(1);
    // Cells naming lane 0 in a blob imported into lane 2.
    std::vector<uint8_t> other(full.begin(), full.begin() + kSeqHeader);
    ASSERT_TRUE(decode_kv_pages(pages.bytes, n, 0, other, &reason, ctx.n_seq_max())) << reason;
    ASSERT_TRUE(ctx.state_import(with_seq(other, 0), 2, StateScope::Full));
    EXPECT_EQ(ctx.seq_pos_max(2), static_cast<Pos>(n) - 1);
    idx = prefill(ctx, 2, tokens, n, n + 1);
    EXPECT_EQ(continue_greedy(ctx, 2, static_cast<Pos>(n + 1), idx, 8), reference);
}

// ---- pure recurrent (mamba2): no attention section ----

TEST(RecurrentKvPagesTest, EmptyAttentionSection) {
    auto model = Model::load(model_for("mamba2"));
    ContextOptions options;
    options.n_ctx = 512;
    options.n_seq_max = 3;
    options.n_threads = 1;
    InferenceContext ctx(*model, options);
    const auto tokens = prompt_tokens(*model, 70);
    prefill(ctx, 0, tokens, 0, 70);
    const auto layout = layout_for(*model, cache::PayloadKind::KvPages, ctx.n_seq_max());
    const EncodedPayload enc = export_payload(ctx, 0, 70, layout);
    std::string reason;
    const auto info =
        inspect_kv_pages(std::span(enc.bytes).first(enc.descriptor.kv_bytes), &reason);
    ASSERT_TRUE(info) << reason;
    EXPECT_EQ(info->mode, KvPagesMode::Empty);
    EXPECT_EQ(enc.descriptor.kv_bytes, info->header_bytes);
    EXPECT_EQ(enc.cuts, std::vector<size_t>{info->header_bytes});
    const auto blob = decode_payload(enc.bytes, enc.descriptor, 70, layout, &reason);
    ASSERT_TRUE(blob) << reason;
    EXPECT_EQ(*blob, ctx.state_export(0, StateScope::Full));
}

// ---- synthetic llama.cpp sections: layouts, fallbacks, errors ----

uint8_t value_at(uint32_t entry, uint32_t pos, uint32_t byte) {
    return static_cast<uint8_t>(entry * 131u + pos * 7u + byte * 3u + 1u);
}

struct SynthSpec {
    uint32_t n_cells = 10;
    std::vector<uint32_t> order;  // cell i holds position order[i]; empty = identity
    bool v_trans = true;
    uint32_t n_layer = 2;
    uint32_t n_v = 2;
    uint64_t k_row = 8;
    uint32_t v_el = 2;
    uint32_t n_embd_v = 3;
    int32_t seq = 1;
    uint32_t n_stream = 1;
    bool both_streams = false;  // cells in the first stream too (not a one-sequence export)
    bool ext = false;
};

// A section as llama_kv_cache::state_write writes it; values depend only on (entry, pos).
std::vector<uint8_t> synth_section(const SynthSpec& s) {
    std::vector<uint8_t> out;
    auto put = [&out](const auto& v) {
        const auto* p = reinterpret_cast<const uint8_t*>(&v);
        out.insert(out.end(), p, p + sizeof v);
    };
    std::vector<uint32_t> order = s.order;
    if (order.empty()) {
        order.resize(s.n_cells);
        std::iota(order.begin(), order.end(), 0u);
    }
    // Streams before the last are empty (a per-sequence export of a non-unified cache).
    put(s.both_streams ? uint32_t{1} : s.n_stream);
    for (uint32_t stream = 0; !s.both_streams && stream + 1 < s.n_stream; ++stream) {
        put(uint32_t{0});
    }
    put(s.n_cells);
    for (uint32_t i = 0; i < s.n_cells; ++i) {
        put(static_cast<int32_t>(order[i]));
        put(uint32_t{1});
        if (s.ext) {
            put(static_cast<int32_t>(order[i]));         // x
            put(int32_t{0});                             // y
            put(static_cast<int32_t>(1000 + order[i]));  // tok
        }
        put(s.seq >= 0 ? s.seq : static_cast<int32_t>(i == 3 ? 5 : 0));
    }
    put(static_cast<uint32_t>(s.v_trans ? 1 : 0));
    put(s.n_layer);
    for (uint32_t l = 0; l < s.n_layer; ++l) {
        put(int32_t{1});
        put(s.k_row);
        for (uint32_t i = 0; i < s.n_cells; ++i) {
            for (uint32_t b = 0; b < s.k_row; ++b) {
                out.push_back(value_at(l, order[i], b));
            }
        }
    }
    for (uint32_t l = 0; l < s.n_v; ++l) {
        put(int32_t{1});
        if (!s.v_trans) {
            const uint64_t row = uint64_t{s.v_el} * s.n_embd_v;
            put(row);
            for (uint32_t i = 0; i < s.n_cells; ++i) {
                for (uint32_t b = 0; b < row; ++b) {
                    out.push_back(value_at(100 + l, order[i], b));
                }
            }
        } else {
            put(s.v_el);
            put(s.n_embd_v);
            for (uint32_t j = 0; j < s.n_embd_v; ++j) {
                for (uint32_t i = 0; i < s.n_cells; ++i) {
                    for (uint32_t b = 0; b < s.v_el; ++b) {
                        out.push_back(value_at(100 + l, order[i], j * s.v_el + b));
                    }
                }
            }
        }
    }
    if (s.both_streams) {  // the same cells in both streams
        std::vector<uint8_t> one(out.begin() + 4, out.end());
        out.clear();
        put(uint32_t{2});
        out.insert(out.end(), one.begin(), one.end());
        out.insert(out.end(), one.begin(), one.end());
    }
    return out;
}

TEST(SyntheticKvPagesTest, CellsInAnyOrderDecodeInPosOrder) {
    for (const bool v_trans : {true, false}) {
        SCOPED_TRACE(v_trans ? "v_trans" : "rows");
        SynthSpec shuffled;
        shuffled.n_cells = 150;
        shuffled.v_trans = v_trans;
        for (uint32_t i = 0; i < shuffled.n_cells; ++i) {
            shuffled.order.push_back((i * 37u + 11u) % shuffled.n_cells);  // a permutation
        }
        SynthSpec ordered = shuffled;
        ordered.order.clear();
        ordered.seq = 2;
        const auto pages = encode_kv_pages(synth_section(shuffled), 150);
        ASSERT_EQ(pages.mode, KvPagesMode::Paged) << pages.raw_reason;
        std::vector<uint8_t> out;
        std::string reason;
        ASSERT_TRUE(decode_kv_pages(pages.bytes, 150, 2, out, &reason)) << reason;
        EXPECT_EQ(out, synth_section(ordered));
        // Lane independence: same pages from a section exported from another lane.
        EXPECT_EQ(encode_kv_pages(synth_section(ordered), 150).bytes, pages.bytes);
    }
}

TEST(SyntheticKvPagesTest, CellExtIsPagedWithItsTokens) {
    for (const bool v_trans : {true, false}) {
        SynthSpec spec;
        spec.n_cells = 70;
        spec.ext = true;
        spec.v_trans = v_trans;
        spec.seq = 0;
        SynthSpec shuffled = spec;
        for (uint32_t i = 0; i < spec.n_cells; ++i) {
            shuffled.order.push_back((i * 29u + 5u) % spec.n_cells);
        }
        const auto section = synth_section(spec);
        const auto pages = encode_kv_pages(synth_section(shuffled), 70);
        ASSERT_EQ(pages.mode, KvPagesMode::Paged) << pages.raw_reason;
        std::string reason;
        const auto info = inspect_kv_pages(pages.bytes, &reason);
        ASSERT_TRUE(info) << reason;
        EXPECT_EQ(info->cell_ext_bytes, 12u);
        std::vector<uint8_t> out;
        ASSERT_TRUE(decode_kv_pages(pages.bytes, 70, 0, out, &reason)) << reason;
        EXPECT_EQ(out, section);
    }
}

TEST(SyntheticKvPagesTest, PagesOfAShorterPrefixAreAPrefixOfTheLongerOnes) {
    SynthSpec shorter;
    shorter.n_cells = 128;
    SynthSpec longer = shorter;
    longer.n_cells = 200;
    const auto a = encode_kv_pages(synth_section(shorter), 128);
    const auto b = encode_kv_pages(synth_section(longer), 200);
    ASSERT_EQ(a.cuts.size(), 2u);  // header, page 0 (page 1 ends the section)
    ASSERT_EQ(b.cuts.size(), 4u);  // header, pages 0-2
    EXPECT_TRUE(std::equal(a.bytes.begin() + static_cast<ptrdiff_t>(a.cuts[0]), a.bytes.end(),
                           b.bytes.begin() + static_cast<ptrdiff_t>(b.cuts[0])));
    cache::BlockStore store;
    ASSERT_TRUE(store.insert(a.bytes, a.cuts).ok());
    const auto rb = store.insert(b.bytes, b.cuts);
    ASSERT_TRUE(rb.ok());
    EXPECT_EQ(rb.report.reused_blocks, 2u);
}

TEST(SyntheticKvPagesTest, UnsupportedLayoutsAreStoredRaw) {
    SynthSpec two_streams;  // cells in both of two streams
    two_streams.n_stream = 2;
    two_streams.both_streams = true;
    SynthSpec mixed;  // one cell of another sequence (not a single-sequence export)
    mixed.seq = -1;
    SynthSpec swa;  // positions 5..14: older cells SWA-masked
    for (uint32_t i = 0; i < swa.n_cells; ++i) {
        swa.order.push_back(i + 5);
    }
    for (const auto& spec : {two_streams, mixed, swa}) {
        const auto section = synth_section(spec);
        const auto pages = encode_kv_pages(section, spec.n_cells);
        EXPECT_EQ(pages.mode, KvPagesMode::Raw);
        EXPECT_FALSE(pages.raw_reason.empty());
        std::vector<uint8_t> out;
        std::string reason;
        ASSERT_TRUE(decode_kv_pages(pages.bytes, spec.n_cells, 0, out, &reason)) << reason;
        EXPECT_EQ(out, section);
    }
    // Empty section: pure recurrent memory.
    const auto empty = encode_kv_pages({}, 10);
    EXPECT_EQ(empty.mode, KvPagesMode::Empty);
    std::vector<uint8_t> out;
    EXPECT_TRUE(decode_kv_pages(empty.bytes, 10, 0, out, nullptr));
    EXPECT_TRUE(out.empty());
}

TEST(SyntheticKvPagesTest, WrongTokenCountThrowsAtExport) {
    SynthSpec spec;
    EXPECT_THROW(encode_kv_pages(synth_section(spec), spec.n_cells + 2), std::runtime_error);
}

TEST(SyntheticKvPagesTest, InconsistentSectionsAreDecodeErrors) {
    SynthSpec spec;
    spec.n_cells = 100;
    const auto good = encode_kv_pages(synth_section(spec), 100).bytes;
    auto check = [&](std::vector<uint8_t> bytes, uint32_t expected, const std::string& want) {
        std::vector<uint8_t> out = {7};
        std::string reason;
        EXPECT_FALSE(decode_kv_pages(bytes, expected, 0, out, &reason)) << want;
        EXPECT_NE(reason.find(want), std::string::npos) << "reason: " << reason;
        EXPECT_EQ(out, std::vector<uint8_t>{7});  // nothing appended
    };
    auto patched = [&](size_t offset, const auto& value) {
        auto bytes = good;
        std::memcpy(bytes.data() + offset, &value, sizeof value);
        return bytes;
    };
    check({}, 100, "empty");
    check(std::vector<uint8_t>(good.begin(), good.begin() + 3), 100, "magic");
    check(std::vector<uint8_t>(good.begin(), good.begin() + 10), 100, "truncated header");
    check(std::vector<uint8_t>(good.begin(), good.begin() + 30), 100, "truncated");
    check(std::vector<uint8_t>(good.begin(), good.end() - 1), 100, "page bytes");
    auto longer = good;
    longer.push_back(0);
    check(longer, 100, "page bytes");
    check(patched(0, uint32_t{0x12345678}), 100, "magic");
    check(patched(4, uint8_t{kKvPagesVersion + 1}), 100, "format version");
    check(patched(5, uint8_t{9}), 100, "unknown mode");
    check(patched(6, uint16_t{32}), 100, "page size");
    check(patched(8, runtime::llama_state_format_fingerprint() + 1), 100, "llama.cpp state format");
    check(good, 99, "expected 99");                        // descriptor token range
    check(patched(16, uint32_t{120}), 100, "page bytes");  // n_tokens, still 2 pages
    check(patched(16, uint32_t{200}), 100, "pages for");   // n_tokens, 4 pages
    check(patched(20, uint32_t{3}), 100, "pages for");     // n_pages
    check(patched(24, uint32_t{2}), 100, "v_trans");
    check(patched(28, uint32_t{0}), 100, "layer counts");
    check(patched(32, uint32_t{3}), 100, "layer counts");  // n_v > n_k
    check(patched(36, uint32_t{5}), 100, "cell ext");
    check(patched(48, uint64_t{0}), 100, "layer table");  // K row size
    check(patched(48, uint64_t{1} << 62), 100, "overflow");
}

}  // namespace
}  // namespace skippy::stage
