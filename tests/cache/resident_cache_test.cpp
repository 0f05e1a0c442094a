#include "cache/resident_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "test_util.h"

namespace skippy::cache {
namespace {

using T = std::vector<Token>;
using Ids = std::vector<int32_t>;

ResidentCacheOptions options(size_t max_entries, size_t budget) {
    ResidentCacheOptions o;
    o.seq_id_count = 8;
    o.reserved_seq_ids = {0, 1, 2};  // lanes
    o.max_entries = max_entries;
    o.token_budget = budget;
    return o;
}

class ResidentCacheTest : public ::testing::Test {
  protected:
    void check(const ResidentCache& cache) {
        auto err = cache.debug_check();
        EXPECT_FALSE(err.has_value()) << *err;
    }
    NamespaceId ns = test::test_namespace();
};

TEST_F(ResidentCacheTest, HandsOutOnlySpareSeqIds) {
    ResidentCache cache(options(16, 0));
    std::set<int32_t> seen;
    for (Token t = 0; t < 5; ++t) {
        ResidentInsertResult r = cache.insert(ns, test::iota_tokens(10, t * 100));
        ASSERT_EQ(r.status, ResidentInsertStatus::Inserted);
        EXPECT_FALSE(cache.is_reserved(r.seq_id));
        EXPECT_TRUE(seen.insert(r.seq_id).second);
    }
    EXPECT_EQ(seen, (std::set<int32_t>{3, 4, 5, 6, 7}));
    // Pool exhausted: the LRU entry is evicted and its id is reused by this same insert.
    ResidentInsertResult r = cache.insert(ns, test::iota_tokens(10, 900));
    ASSERT_EQ(r.status, ResidentInsertStatus::Inserted);
    EXPECT_EQ(r.evicted, (Ids{3}));
    EXPECT_EQ(r.seq_id, 3);
    check(cache);
}

TEST_F(ResidentCacheTest, LookupMatchesPrefixOfStoredSequence) {
    ResidentCache cache(options(8, 0));
    const T stored = test::iota_tokens(1000);
    ResidentInsertResult r = cache.insert(ns, stored);
    ASSERT_EQ(r.status, ResidentInsertStatus::Inserted);
    EXPECT_EQ(r.stored_len, 1000u);
    T query = test::iota_tokens(600);
    query.push_back(-5);
    auto hit = cache.acquire_longest(ns, query);
    ASSERT_TRUE(hit);
    EXPECT_EQ(hit->seq_id, r.seq_id);
    EXPECT_EQ(hit->matched_len, 600u);
    EXPECT_EQ(hit->stored_len, 1000u);
    EXPECT_FALSE(cache.acquire_longest(ns, T{-1, -2}));
    auto peek = cache.peek_longest(ns, query);
    ASSERT_TRUE(peek);
    EXPECT_EQ(peek->matched_len, 600u);
    EXPECT_EQ(cache.stats().hits, 1u);
    EXPECT_EQ(cache.stats().misses, 1u);
}

TEST_F(ResidentCacheTest, CoveredAndSupersededPaths) {
    ResidentCache cache(options(8, 0));
    ResidentInsertResult a = cache.insert(ns, test::iota_tokens(100));
    // A longer path on the same conversation makes the shorter entry redundant.
    ResidentInsertResult b = cache.insert(ns, test::iota_tokens(300));
    ASSERT_EQ(b.status, ResidentInsertStatus::Inserted);
    EXPECT_EQ(b.evicted, (Ids{a.seq_id}));
    EXPECT_NE(b.seq_id, a.seq_id);  // a's id waits for confirm_dropped
    cache.confirm_dropped(b.evicted);
    // A path contained in a stored one is not stored twice.
    ResidentInsertResult c = cache.insert(ns, test::iota_tokens(200));
    EXPECT_EQ(c.status, ResidentInsertStatus::AlreadyCovered);
    EXPECT_EQ(c.seq_id, b.seq_id);
    EXPECT_EQ(c.stored_len, 300u);
    EXPECT_EQ(cache.stats().entries, 1u);
    check(cache);
}

TEST_F(ResidentCacheTest, LeasedShorterPathIsNotSuperseded) {
    ResidentCache cache(options(8, 0));
    ResidentInsertResult a = cache.insert(ns, test::iota_tokens(100));
    auto hit = cache.acquire_longest(ns, test::iota_tokens(100));
    ASSERT_TRUE(hit);
    ResidentInsertResult b = cache.insert(ns, test::iota_tokens(300));
    EXPECT_TRUE(b.evicted.empty());
    EXPECT_EQ(cache.stats().entries, 2u);
    EXPECT_EQ(cache.remove(ns, test::iota_tokens(100)).status, RemoveStatus::Leased);
    hit.reset();
    ResidentRemoveResult rm = cache.remove(ns, test::iota_tokens(100));
    EXPECT_EQ(rm.status, RemoveStatus::Removed);
    EXPECT_EQ(rm.seq_id, a.seq_id);
    check(cache);
}

TEST_F(ResidentCacheTest, TokenBudgetEvictsLeastRecentlyUsed) {
    ResidentCache cache(options(8, 1000));
    ResidentInsertResult a = cache.insert(ns, test::iota_tokens(400, 0));
    ResidentInsertResult b = cache.insert(ns, test::iota_tokens(400, 10000));
    ASSERT_TRUE(cache.acquire_longest(ns, test::iota_tokens(10, 0)));  // touch a
    ResidentInsertResult c = cache.insert(ns, test::iota_tokens(400, 20000));
    ASSERT_EQ(c.status, ResidentInsertStatus::Inserted);
    EXPECT_EQ(c.evicted, (Ids{b.seq_id}));
    EXPECT_EQ(cache.stats().tokens, 800u);
    EXPECT_EQ(cache.insert(ns, test::iota_tokens(1001, 30000)).status,
              ResidentInsertStatus::TooLarge);
    (void)a;
    check(cache);
}

TEST_F(ResidentCacheTest, EntryLimitAndLeasesNeverEvicted) {
    ResidentCache cache(options(2, 0));
    cache.insert(ns, test::iota_tokens(10, 0));
    cache.insert(ns, test::iota_tokens(10, 100));
    auto h1 = cache.acquire_longest(ns, test::iota_tokens(10, 0));
    auto h2 = cache.acquire_longest(ns, test::iota_tokens(10, 100));
    ResidentInsertResult r = cache.insert(ns, test::iota_tokens(10, 200));
    EXPECT_EQ(r.status, ResidentInsertStatus::NoCapacity);
    EXPECT_TRUE(r.evicted.empty());
    EXPECT_TRUE(cache.evict_tokens(1000).empty());
    EXPECT_TRUE(cache.evict_all().empty());
    h1.reset();
    r = cache.insert(ns, test::iota_tokens(10, 200));
    EXPECT_EQ(r.status, ResidentInsertStatus::Inserted);
    EXPECT_EQ(r.evicted.size(), 1u);
    check(cache);
}

TEST_F(ResidentCacheTest, EvictedIdsWaitForConfirmDropped) {
    ResidentCache cache(options(8, 0));
    Ids held;
    for (Token t = 0; t < 5; ++t) {
        held.push_back(cache.insert(ns, test::iota_tokens(10, t * 100)).seq_id);
    }
    const Ids dropped = cache.evict_tokens(15);  // two LRU entries
    EXPECT_EQ(dropped, (Ids{held[0], held[1]}));
    EXPECT_EQ(cache.stats().pending_drop, 2u);
    EXPECT_EQ(cache.stats().free_seq_ids, 0u);
    // Not confirmed yet: a new insert must not receive those ids.
    ResidentInsertResult r = cache.insert(ns, test::iota_tokens(10, 900));
    ASSERT_EQ(r.status, ResidentInsertStatus::Inserted);
    EXPECT_EQ(std::count(dropped.begin(), dropped.end(), r.seq_id), 0);
    EXPECT_EQ(r.evicted.size(), 1u);
    cache.confirm_dropped(dropped);
    cache.confirm_dropped(r.evicted);  // the reused id is ignored here
    EXPECT_EQ(cache.stats().pending_drop, 0u);
    EXPECT_EQ(cache.stats().free_seq_ids, 2u);
    check(cache);
}

TEST_F(ResidentCacheTest, RemoveSeqAfterFailedCopy) {
    ResidentCache cache(options(8, 0));
    ResidentInsertResult r = cache.insert(ns, test::iota_tokens(50));
    ResidentRemoveResult rm = cache.remove_seq(r.seq_id);
    EXPECT_EQ(rm.status, RemoveStatus::Removed);
    EXPECT_EQ(rm.seq_id, r.seq_id);
    EXPECT_EQ(cache.remove_seq(r.seq_id).status, RemoveStatus::NotFound);
    EXPECT_EQ(cache.stats().entries, 0u);
    EXPECT_EQ(cache.insert(ns, T{}).status, ResidentInsertStatus::EmptyKey);
    check(cache);
}

TEST_F(ResidentCacheTest, RandomOperationsKeepBookkeepingConsistent) {
    std::mt19937_64 rng(3);
    ResidentCache cache(options(4, 60));
    std::vector<ResidentHit> leases;
    Ids to_drop;
    const uint64_t steps = std::min<uint64_t>(test::fuzz_steps(), 5000);
    for (uint64_t step = 0; step < steps; ++step) {
        const T tokens = test::random_tokens(rng, 1 + rng() % 20, 2);
        switch (rng() % 6) {
            case 0:
            case 1: {
                ResidentInsertResult r = cache.insert(ns, tokens);
                to_drop.insert(to_drop.end(), r.evicted.begin(), r.evicted.end());
                if (r.status == ResidentInsertStatus::Inserted) {
                    ASSERT_EQ(std::count(r.evicted.begin(), r.evicted.end(), r.seq_id) > 0 ||
                                  !cache.is_reserved(r.seq_id),
                              true);
                }
                break;
            }
            case 2:
                if (auto hit = cache.acquire_longest(ns, tokens); hit && leases.size() < 3) {
                    leases.push_back(std::move(*hit));
                }
                break;
            case 3:
                if (!leases.empty()) {
                    leases.erase(leases.begin() + static_cast<ptrdiff_t>(rng() % leases.size()));
                }
                break;
            case 4: {
                Ids ids = cache.evict_tokens(rng() % 30);
                to_drop.insert(to_drop.end(), ids.begin(), ids.end());
                break;
            }
            case 5:
                cache.confirm_dropped(to_drop);
                to_drop.clear();
                break;
        }
        auto err = cache.debug_check();
        ASSERT_FALSE(err.has_value()) << "step " << step << ": " << *err;
        for (const ResidentHit& h : leases) {
            ASSERT_FALSE(cache.is_reserved(h.seq_id));
        }
    }
}

}  // namespace
}  // namespace skippy::cache
