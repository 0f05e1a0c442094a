// How prefill chunking changes the bits of the logits, per model family and flash-attention
// setting, with one KV stream per lane (what the cache's canonical chunking relies on).
// Each case prefills the same prompt into a fresh lane under two chunkings and compares the
// logits of the last token bitwise.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/inference_context.h"
#include "runtime/model.h"
#include "test_models.h"

namespace skippy::runtime {
namespace {

// Prefills `tokens` into lane `seq` (cleared first) with chunks ending at `ends` (ascending,
// last = tokens.size()); returns the last token's logits.
std::vector<float> logits_after(InferenceContext& ctx, SeqId seq, const std::vector<Token>& tokens,
                                const std::vector<size_t>& ends) {
    ctx.seq_clear(seq);
    size_t begin = 0;
    int32_t last = -1;
    for (size_t end : ends) {
        ctx.batch_clear();
        for (size_t i = begin; i < end; ++i) {
            last = ctx.batch_add(tokens[i], static_cast<Pos>(i), seq, i + 1 == tokens.size());
        }
        EXPECT_EQ(ctx.decode(), 0);
        begin = end;
    }
    auto span = ctx.logits_at(last);
    return {span.begin(), span.end()};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Case {
    std::string arch;
    FlashAttn fa;
};

class ChunkingTest : public ::testing::TestWithParam<Case> {};

TEST_P(ChunkingTest, ReportsWhichChunkingsAreBitIdentical) {
    const Case c = GetParam();
    auto model = Model::load(skippy::testing::tiny_model(c.arch, "chunking-test", 5));
    ContextOptions options;
    options.n_ctx = 2048;
    options.n_seq_max = 2;
    options.n_batch = 512;
    options.n_threads = 2;
    options.flash_attn = c.fa;
    InferenceContext ctx(*model, options);
    std::vector<Token> tokens;
    for (int i = 0; i < 700; ++i) {
        tokens.push_back(static_cast<Token>(100 + (i * 7919) % 5000));
    }
    const auto ref = logits_after(ctx, 0, tokens, {512, 700});
    struct Variant {
        const char* name;
        std::vector<size_t> ends;
    };
    const std::vector<Variant> variants = {
        {"same", {512, 700}},
        {"other lane", {512, 700}},
        {"64-aligned split", {256, 512, 640, 700}},
        {"unaligned split", {300, 512, 699, 700}},
        {"tail of 1", {512, 699, 700}},
        {"32-aligned split", {512, 544, 700}},
        {"16-aligned split", {512, 528, 700}},
        {"8-aligned split", {512, 520, 700}},
        {"4-aligned split", {512, 516, 700}},
        {"2-aligned split", {512, 514, 700}},
        {"64-aligned 1-tail", {512, 640, 641, 700}},
        {"per token 640-700", {512, 640, 641, 642, 643, 644, 700}},
        {"unaligned >=2", {300, 512, 697, 700}},
        {"odd starts >=2", {7, 301, 513, 699 - 2, 700}},
        {"lengths 2,3", {512, 514, 517, 520, 700}},
        {"one token mid", {512, 600, 601, 700}},
        {"two tokens mid", {512, 600, 602, 700}},
        {"all >=64", {100, 300, 512, 636, 700}},
        {"all >=64 unaligned", {77, 333, 600, 700}},
    };
    {
        ContextOptions one = options;
        one.n_threads = 1;
        one.n_seq_max = 4;
        one.n_ctx = 4096;
        InferenceContext other(*model, one);
        const bool same = same_bits(ref, logits_after(other, 2, tokens, {512, 700}));
        std::printf("[chunking] %s fa=%s %-18s %s\n", c.arch.c_str(), flash_attn_name(c.fa),
                    "1 thread, 4 lanes", same ? "bit-identical" : "DIFFERENT");
    }
    // Flash attention on, canonical tail: chunks >= 64 up to a body end, then the short
    // rest in chunks of >= 2 (plan.h). Compared against the body + one-tail-chunk run.
    const auto tail_ref = logits_after(ctx, 0, tokens, {512, 640, 700});
    const std::vector<Variant> tail_variants = {
        {"tail: body split", {300, 640, 700}},     {"tail: body 64s", {64, 128, 576, 640, 700}},
        {"tail: split >=2", {512, 640, 670, 700}}, {"tail: split 2s", {512, 640, 642, 698, 700}},
        {"tail: other lane", {512, 640, 700}},
    };
    for (const auto& v : tail_variants) {
        const SeqId seq = std::string(v.name) == "tail: other lane" ? 1 : 0;
        const bool same = same_bits(tail_ref, logits_after(ctx, seq, tokens, v.ends));
        std::printf("[chunking] %s fa=%s %-18s %s\n", c.arch.c_str(), flash_attn_name(c.fa), v.name,
                    same ? "bit-identical" : "DIFFERENT");
        if (c.fa == FlashAttn::On || std::string(v.name) == "tail: other lane") {
            EXPECT_TRUE(same) << v.name;
        }
    }
    for (const auto& v : variants) {
        const SeqId seq = std::string(v.name) == "other lane" ? 1 : 0;
        const bool same = same_bits(ref, logits_after(ctx, seq, tokens, v.ends));
        std::printf("[chunking] %s fa=%s %-18s %s\n", c.arch.c_str(), flash_attn_name(c.fa), v.name,
                    same ? "bit-identical" : "DIFFERENT");
        if (std::string(v.name) == "same" || std::string(v.name) == "other lane") {
            EXPECT_TRUE(same) << v.name;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Families, ChunkingTest,
    ::testing::Values(Case{"llama", FlashAttn::Off}, Case{"llama", FlashAttn::On},
                      Case{"qwen35", FlashAttn::Off}, Case{"qwen35", FlashAttn::On},
                      Case{"mamba2", FlashAttn::On}),
    [](const auto& param_info) {
        return param_info.param.arch + "_fa_" + flash_attn_name(param_info.param.fa);
    });

}  // namespace
}  // namespace skippy::runtime
