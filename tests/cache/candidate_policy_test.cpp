#include "cache/candidate_policy.h"

#include <gtest/gtest.h>

#include <vector>

namespace skippy::cache {
namespace {

using V = std::vector<size_t>;

TEST(CandidatePolicy, ReusablePrefixIsPromptMinusOne) {
    EXPECT_EQ(reusable_prefix_len(0), 0u);
    EXPECT_EQ(reusable_prefix_len(1), 0u);
    EXPECT_EQ(reusable_prefix_len(1001), 1000u);
}

TEST(CandidatePolicy, LookupFullLengthThenGridLongestFirst) {
    // A 1001-token prompt: reusable 1000, then the 128-grid down to min_tokens 64.
    EXPECT_EQ(lookup_candidates(reusable_prefix_len(1001)),
              (V{1000, 896, 768, 640, 512, 384, 256, 128}));
    // Full length on the grid is not repeated.
    EXPECT_EQ(lookup_candidates(1024), (V{1024, 896, 768, 640, 512, 384, 256, 128}));
    EXPECT_EQ(lookup_candidates(129), (V{129, 128}));
    EXPECT_EQ(lookup_candidates(128), (V{128}));
    EXPECT_EQ(lookup_candidates(100), (V{100}));
    EXPECT_EQ(lookup_candidates(64), (V{64}));
    EXPECT_EQ(lookup_candidates(63), V{});
    EXPECT_EQ(lookup_candidates(0), V{});
}

TEST(CandidatePolicy, LookupHonoursStrideAndMinTokens) {
    CandidatePolicy p;
    p.stride = 100;
    p.min_tokens = 250;
    EXPECT_EQ(lookup_candidates(640, p), (V{640, 600, 500, 400, 300}));
    p.min_tokens = 0;  // treated as 1
    p.stride = 2;
    EXPECT_EQ(lookup_candidates(5, p), (V{5, 4, 2}));
    p.stride = 0;
    EXPECT_THROW(lookup_candidates(5, p), std::invalid_argument);
}

TEST(CandidatePolicy, RecordLadderWorkedExamples) {
    // exact 1000, grid below 896, geometric rungs 512, 256 (limit 4 - 2).
    EXPECT_EQ(record_ladder(1000), (V{256, 512, 896, 1000}));
    // exact on the grid: the grid rung is strictly below it.
    EXPECT_EQ(record_ladder(1024), (V{256, 512, 896, 1024}));
    EXPECT_EQ(record_ladder(150), (V{128, 150}));
    EXPECT_EQ(record_ladder(129), (V{128, 129}));
    EXPECT_EQ(record_ladder(128), (V{128}));  // grid below is 0
    EXPECT_EQ(record_ladder(100), (V{100}));
    EXPECT_EQ(record_ladder(50), V{});
    EXPECT_EQ(record_ladder(0), V{});

    CandidatePolicy p;
    p.record_limit = 6;
    // 5000: grid 4992, geometric 4096, 2048, 1024, 512 (limit 6 - 2 = 4).
    EXPECT_EQ(record_ladder(5000, {}, p), (V{512, 1024, 2048, 4096, 4992, 5000}));
    p.record_limit = 2;
    EXPECT_EQ(record_ladder(5000, {}, p), (V{4992, 5000}));
    p.record_limit = 1;
    EXPECT_EQ(record_ladder(5000, {}, p), (V{5000}));
}

TEST(CandidatePolicy, RecordLadderRungsAreSharedAcrossConversations) {
    // Geometric rungs sit at absolute grid positions, so two prompts of different
    // lengths record common rungs.
    const V a = record_ladder(1000);
    const V b = record_ladder(1700);
    EXPECT_EQ(b, (V{512, 1024, 1664, 1700}));
    EXPECT_NE(std::find(a.begin(), a.end(), 512), a.end());
    EXPECT_NE(std::find(b.begin(), b.end(), 512), b.end());
}

TEST(CandidatePolicy, StructuralPositionsMergedWithPriorityOverGeometric) {
    // Unsorted, duplicated, below min_tokens (37) and beyond exact (2000) inputs.
    const V structural{700, 37, 300, 700, 2000};
    CandidatePolicy p;
    p.record_limit = 5;
    // exact 1000, grid 896, structural 300 (shortest first) and 700, one geometric: 512.
    EXPECT_EQ(record_ladder(1000, structural, p), (V{300, 512, 700, 896, 1000}));
    p.record_limit = 4;
    EXPECT_EQ(record_ladder(1000, structural, p), (V{300, 700, 896, 1000}));
    p.record_limit = 3;
    EXPECT_EQ(record_ladder(1000, structural, p), (V{300, 896, 1000}));
    // Structural positions equal to exact or the grid rung are deduplicated.
    p.record_limit = 4;
    EXPECT_EQ(record_ladder(1000, V{1000, 896, 200}, p), (V{200, 512, 896, 1000}));
}

TEST(CandidatePolicy, StructuralChatTurns) {
    // System prompt ends at 410, messages at 655, 1290, 1733; recording after a reply
    // that ends the turn at 2048. Limit 6: exact, grid 1920, 410 (system prompt), then
    // the later boundaries longest first: 1733, 1290, 655.
    CandidatePolicy p;
    p.record_limit = 6;
    EXPECT_EQ(record_ladder(2048, V{410, 655, 1290, 1733}, p),
              (V{410, 655, 1290, 1733, 1920, 2048}));
    p.record_limit = 5;
    EXPECT_EQ(record_ladder(2048, V{410, 655, 1290, 1733}, p), (V{410, 1290, 1733, 1920, 2048}));
}

TEST(CandidatePolicy, RecordLadderBoundedByTokenBudget) {
    CandidatePolicy p;
    p.record_token_budget = 2500;
    // 1000 + 896 = 1896; 512 fits (2408); 256 and 128 do not.
    EXPECT_EQ(record_ladder(1000, {}, p), (V{512, 896, 1000}));
    p.record_token_budget = 900;
    // The exact length alone exceeds the budget; shorter rungs are still tried.
    EXPECT_EQ(record_ladder(1000, {}, p), (V{896}));
    p.record_token_budget = 50;
    EXPECT_EQ(record_ladder(1000, {}, p), V{});
}

TEST(CandidatePolicy, LadderPropertiesHoldForManyLengths) {
    CandidatePolicy p;
    p.record_limit = 5;
    const V structural{80, 333, 901, 4000};
    for (size_t exact = 0; exact < 5000; exact += 7) {
        const V rungs = record_ladder(exact, structural, p);
        EXPECT_LE(rungs.size(), p.record_limit);
        EXPECT_TRUE(std::is_sorted(rungs.begin(), rungs.end()));
        EXPECT_EQ(std::adjacent_find(rungs.begin(), rungs.end()), rungs.end());
        for (size_t r : rungs) {
            EXPECT_GE(r, p.min_tokens);
            EXPECT_LE(r, exact);
        }
        if (exact >= p.min_tokens) {
            ASSERT_FALSE(rungs.empty());
            EXPECT_EQ(rungs.back(), exact);
        }
        const V look = lookup_candidates(exact, p);
        EXPECT_TRUE(std::is_sorted(look.rbegin(), look.rend()));
        EXPECT_EQ(std::adjacent_find(look.begin(), look.end()), look.end());
    }
}

}  // namespace
}  // namespace skippy::cache
