// plan_chunks and ExactRule: the exactness rule of plan.h (body chunks of at least the
// body minimum, tail chunks of at least 2, restores that leave a valid rest).
#include <gtest/gtest.h>

#include <algorithm>
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
    EXPECT_EQ(ExactRule::for_model(false, false).body_min, 2);
    EXPECT_EQ(ExactRule::for_model(true, false).body_min, 64);
    // Models with recurrent state: with flash attention every last message under a tile is
    // the tail; without it there is no tail at all.
    EXPECT_EQ(ExactRule::for_model(true, true).max_tail, 63);
    EXPECT_EQ(ExactRule::for_model(false, true).max_tail, 16);
    EXPECT_FALSE(ExactRule::for_model(false, true).has_tail());
    // chunks(): plan_chunks with the rule's minimum and the prompt's body end.
    const auto fa = ExactRule::for_model(true, false);
    EXPECT_EQ(fa.chunks(0, 1050, std::vector<int32_t>{500, 1040}, 512),
              plan_chunks(0, 1050, {}, 512, 64, 1040));
    EXPECT_EQ(ExactRule::for_model(false, false).chunks(0, 540, std::vector<int32_t>{}, 512),
              (std::vector<int32_t>{512, 540}));
    // 540 tokens in 512-token batches: not 512 + 28, but 476 + 64.
    EXPECT_EQ(plan_chunks(0, 540, {}, 512, 64), (std::vector<int32_t>{476, 540}));
    EXPECT_EQ(plan_chunks(0, 540, {}, 512, 2), (std::vector<int32_t>{512, 540}));
    // A pause that would leave a short chunk on either side is dropped.
    EXPECT_EQ(plan_chunks(0, 300, {30, 200, 260}, 512, 64), (std::vector<int32_t>{200, 300}));
    // A prefill shorter than the minimum is one chunk.
    EXPECT_EQ(plan_chunks(10, 50, {20}, 512, 64), (std::vector<int32_t>{50}));
    // A pause a few tokens past a full batch (a system prompt of 1031 tokens) is kept: the
    // batch before it ends one minimum chunk earlier.
    EXPECT_EQ(plan_chunks(0, 1115, {1031}, 512, 64), (std::vector<int32_t>{512, 967, 1031, 1115}));
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
    const auto off = ExactRule::for_model(false, false);
    EXPECT_EQ(off.body_end(100, std::vector<int32_t>{40}), 100);  // no tail
    EXPECT_EQ(off.restore_limit(100, 100), 98);
    EXPECT_EQ(off.restore_limit(2, 2), 0);
    EXPECT_TRUE(off.can_restore(98, 100, 100));
    EXPECT_FALSE(off.can_restore(99, 100, 100));
}

TEST(PlanChunks, FlashAttentionBodyAndTail) {
    const auto fa = ExactRule::for_model(true, false);
    // No boundary (a completion): the last token alone is the tail.
    EXPECT_EQ(fa.body_end(1025, std::vector<int32_t>{}), 1024);
    EXPECT_EQ(fa.body_end(1024, std::vector<int32_t>{}), 1023);
    EXPECT_EQ(fa.body_end(60, std::vector<int32_t>{}), 0);  // all tail
    EXPECT_EQ(fa.body_end(64, std::vector<int32_t>{}), 0);
    // Messages with a long last message: no tail.
    EXPECT_EQ(fa.body_end(1050, std::vector<int32_t>{500, 1030}), 1050);
    EXPECT_EQ(fa.body_end(64, std::vector<int32_t>{20}), 64);
    EXPECT_EQ(fa.body_end(63, std::vector<int32_t>{20}), 0);
    EXPECT_EQ(fa.body_end(100, std::vector<int32_t>{0, 100}), 99);  // no boundary inside
    // A short last message (<= 16 tokens, after a boundary >= 64) is the tail.
    EXPECT_EQ(fa.body_end(1050, std::vector<int32_t>{500, 1040}), 1040);
    EXPECT_EQ(fa.body_end(1200, std::vector<int32_t>{1199, 1200}), 1199);
    EXPECT_EQ(fa.body_end(70, std::vector<int32_t>{60}), 70);  // a boundary < 64 is no anchor
    // Restores: the body end itself, or >= 64 before it.
    EXPECT_TRUE(fa.can_restore(1024, 1024, 1025));
    EXPECT_FALSE(fa.can_restore(1000, 1024, 1025));
    EXPECT_TRUE(fa.can_restore(960, 1024, 1025));
    EXPECT_FALSE(fa.can_restore(1025, 1024, 1025));
    EXPECT_EQ(fa.best_restore(5000, 1024, 1025), 1024);
    EXPECT_EQ(fa.best_restore(1000, 1024, 1025), 960);
    EXPECT_EQ(fa.best_restore(900, 1024, 1025), 900);
    EXPECT_EQ(fa.best_restore(30, 0, 40), 0);
    // Plans: body chunks >= 64 up to the body end, then the tail in chunks >= 2.
    EXPECT_EQ(plan_chunks(0, 1050, {}, 512, 64, 1030),
              (std::vector<int32_t>{512, 966, 1030, 1050}));
    EXPECT_EQ(plan_chunks(0, 1094, {1060}, 512, 64, 1030),
              (std::vector<int32_t>{512, 966, 1030, 1094}));  // a 64-token tail: one chunk
    EXPECT_EQ(plan_chunks(1000, 1050, {}, 512, 64, 1030), (std::vector<int32_t>{1030, 1050}));
    EXPECT_EQ(plan_chunks(1035, 1050, {1040}, 512, 64, 1030), (std::vector<int32_t>{1040, 1050}));
    EXPECT_EQ(plan_chunks(0, 1031, {}, 512, 64, 1030),
              (std::vector<int32_t>{512, 966, 1030, 1031}));
    EXPECT_EQ(plan_chunks(0, 40, {20}, 512, 64, 0), (std::vector<int32_t>{20, 40}));
}

TEST(PlanChunks, RandomBodyAndTailPlansKeepTheRule) {
    std::mt19937 rng(9);
    const auto fa = ExactRule::for_model(true, false);
    for (int i = 0; i < 2000; ++i) {
        const int32_t n = std::uniform_int_distribution<int32_t>(1, 3000)(rng);
        std::vector<int32_t> bounds;
        for (int k = 0; k < 4; ++k) {
            bounds.push_back(std::uniform_int_distribution<int32_t>(0, n)(rng));
        }
        const int32_t b = fa.body_end(n, bounds);
        ASSERT_GE(b, 0);
        ASSERT_LE(b, n);
        ASSERT_LE(n - b, 64) << "a tail of <= 64 tokens";
        const int32_t available = std::uniform_int_distribution<int32_t>(0, n)(rng);
        const int32_t r = fa.best_restore(available, b, n);
        ASSERT_LE(r, available);
        ASSERT_TRUE(r == 0 || fa.can_restore(r, b, n)) << r << " " << b << " " << n;
        const auto ends = plan_chunks(r, n, bounds, 512, 64, b);
        ASSERT_FALSE(ends.empty());
        EXPECT_EQ(ends.back(), n);
        if (r < b) {
            EXPECT_TRUE(std::binary_search(ends.begin(), ends.end(), b)) << "a chunk ends at B";
        }
        int32_t at = r;
        for (int32_t e : ends) {
            const bool body = e <= b;
            EXPECT_GT(e, at);
            EXPECT_LE(e - at, 512);
            if (body) {
                EXPECT_GE(e - at, 64) << at << ".." << e << " body end " << b;
            } else if (n - std::max(at, b) > 1 && n - b < 64) {
                EXPECT_GE(e - at, 2) << at << ".." << e;
                EXPECT_GE(at, b) << "no chunk straddles the body end";
            }
            at = e;
        }
    }
}

}  // namespace
}  // namespace skippy::stage
