// plan_chunks and max_restorable: the exactness rule of plan.h (every chunk of a prefill
// at least min_chunk tokens unless the whole prefill is shorter, at most max_chunk).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "stage/plan.h"

namespace skippy::stage {
namespace {

void expect_valid(int32_t begin, int32_t end, const std::vector<int32_t>& ends, int32_t max_chunk,
                  int32_t min_chunk) {
    ASSERT_FALSE(ends.empty());
    EXPECT_EQ(ends.back(), end);
    int32_t at = begin;
    for (int32_t e : ends) {
        EXPECT_GT(e, at);
        EXPECT_LE(e - at, max_chunk);
        if (end - begin >= min_chunk) {
            EXPECT_GE(e - at, min_chunk) << "chunk " << at << ".." << e;
        }
        at = e;
    }
}

TEST(PlanChunks, FlashAttentionChunksAreAtLeastOneTile) {
    EXPECT_EQ(min_chunk_tokens(false), 2);
    EXPECT_EQ(min_chunk_tokens(true), 64);
    // 540 tokens in 512-token batches: not 512 + 28, but 476 + 64.
    EXPECT_EQ(plan_chunks(0, 540, {}, 512, 64), (std::vector<int32_t>{476, 540}));
    EXPECT_EQ(plan_chunks(0, 540, {}, 512, 2), (std::vector<int32_t>{512, 540}));
    // A pause that would leave a short chunk on either side is dropped.
    EXPECT_EQ(plan_chunks(0, 300, {30, 200, 260}, 512, 64), (std::vector<int32_t>{200, 300}));
    // A prefill shorter than the minimum is one chunk.
    EXPECT_EQ(plan_chunks(10, 50, {20}, 512, 64), (std::vector<int32_t>{50}));
}

TEST(PlanChunks, RandomPlansKeepTheRule) {
    std::mt19937 rng(5);
    for (int i = 0; i < 2000; ++i) {
        const int32_t min_chunk = i % 2 ? 64 : 2;
        const int32_t max_chunk = std::uniform_int_distribution<int32_t>(128, 600)(rng);
        const int32_t begin = std::uniform_int_distribution<int32_t>(0, 300)(rng);
        const int32_t end = begin + std::uniform_int_distribution<int32_t>(1, 2000)(rng);
        std::vector<int32_t> pauses;
        for (int k = 0; k < 6; ++k) {
            pauses.push_back(std::uniform_int_distribution<int32_t>(begin, end)(rng));
        }
        const auto ends = plan_chunks(begin, end, pauses, max_chunk, min_chunk);
        expect_valid(begin, end, ends, max_chunk, min_chunk);
    }
}

TEST(PlanChunks, RestoresLeaveTheMinimumToPrefill) {
    EXPECT_EQ(max_restorable(100, 2), 98);
    EXPECT_EQ(max_restorable(2, 2), 0);
    EXPECT_EQ(max_restorable(100, 64), 36);
    EXPECT_EQ(max_restorable(64, 64), 0);
}

}  // namespace
}  // namespace skippy::stage
