#include "cache/radix_index.h"

#include <gtest/gtest.h>

#include <vector>

#include "test_util.h"

namespace skippy::cache {
namespace {

using test::iota_tokens;
using test::test_namespace;
using T = std::vector<Token>;
constexpr ComponentKind kExact = ComponentKind::Exact;
constexpr ComponentKind kResident = ComponentKind::Resident;

class RadixIndexTest : public ::testing::Test {
  protected:
    void TearDown() override {
        auto err = index.check_invariants();
        EXPECT_FALSE(err.has_value()) << *err;
    }
    RadixIndex index;
    NamespaceId ns = test_namespace();
};

TEST_F(RadixIndexTest, ExactLookupFindsLongestStoredPrefix) {
    index.insert(kExact, ns, T{1, 2, 3}, 30);
    index.insert(kExact, ns, T{1, 2, 3, 4, 5}, 50);
    index.insert(kExact, ns, T{1, 2, 9}, 90);
    auto m = index.peek_exact(ns, T{1, 2, 3, 4, 5, 6, 7});
    ASSERT_TRUE(m);
    EXPECT_EQ(m->len, 5u);
    EXPECT_EQ(m->value, 50u);
    m = index.peek_exact(ns, T{1, 2, 3, 4});
    ASSERT_TRUE(m);
    EXPECT_EQ(m->len, 3u);
    EXPECT_EQ(m->value, 30u);
    // Exact state must end exactly at a recorded node: a longer stored path is no hit.
    EXPECT_FALSE(index.peek_exact(ns, T{1, 2}));
    EXPECT_FALSE(index.peek_exact(ns, T{7}));
    EXPECT_FALSE(index.peek_exact(test_namespace("other"), T{1, 2, 3}));
}

TEST_F(RadixIndexTest, ExactCommonLookupMatchesInsideStoredPaths) {
    index.insert(kExact, ns, T{1, 2, 3, 4, 5, 6}, 60);
    index.insert(kExact, ns, T{1, 2, 3, 4, 5, 6, 7, 8}, 80);
    index.insert(kExact, ns, T{1, 2, 9, 9}, 99);
    // Diverges inside both long paths: the shallowest entry below the divergence serves.
    auto m = index.peek_exact(ns, T{1, 2, 3, 4, 42}, PrefixMatch::Common);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->matched_len, 4u);
    EXPECT_EQ(m->stored_len, 6u);
    EXPECT_EQ(m->value, 60u);
    m = index.peek_exact(ns, T{1, 2, 3, 4, 5, 6, 7, 8, 9}, PrefixMatch::Common);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->matched_len, 8u);
    EXPECT_EQ(m->value, 80u);
    m = index.peek_exact(ns, T{1, 2, 7}, PrefixMatch::Common);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->matched_len, 2u);
    EXPECT_FALSE(index.peek_exact(ns, T{5}, PrefixMatch::Common));
    // Resident entries are not exact state; removed ones stop matching.
    index.insert(kResident, ns, T{5, 6, 7}, 1);
    EXPECT_FALSE(index.peek_exact(ns, T{5, 6}, PrefixMatch::Common));
    index.remove(kExact, ns, T{1, 2, 9, 9});
    m = index.peek_exact(ns, T{1, 2, 9}, PrefixMatch::Common);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->matched_len, 2u);
    EXPECT_NE(m->value, 99u);
}

TEST_F(RadixIndexTest, ResidentLookupMatchesPrefixOfStoredSequence) {
    const T stored = iota_tokens(10, 1);  // 1..10
    index.insert(kResident, ns, stored, 7);
    auto m = index.peek_resident(ns, T{1, 2, 3, 4, 5});
    ASSERT_TRUE(m);
    EXPECT_EQ(m->matched_len, 5u);
    EXPECT_EQ(m->stored_len, 10u);
    EXPECT_EQ(m->value, 7u);
    m = index.peek_resident(ns, T{1, 2, 3, 99});  // diverges inside the edge
    ASSERT_TRUE(m);
    EXPECT_EQ(m->matched_len, 3u);
    T longer = iota_tokens(12, 1);
    m = index.peek_resident(ns, longer);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->matched_len, 10u);
    EXPECT_EQ(m->stored_len, 10u);
    EXPECT_FALSE(index.peek_resident(ns, T{2, 3}));
    EXPECT_FALSE(index.peek_resident(ns, T{}));
    // Exact lookup does not see resident components.
    EXPECT_FALSE(index.peek_exact(ns, longer));
}

TEST_F(RadixIndexTest, ResidentLookupPrefersDeepestBranch) {
    index.insert(kResident, ns, T{1, 2, 3}, 3);
    index.insert(kResident, ns, T{1, 2, 4, 5, 6}, 6);
    auto m = index.peek_resident(ns, T{1, 2, 4, 5, 0});
    ASSERT_TRUE(m);
    EXPECT_EQ(m->value, 6u);
    EXPECT_EQ(m->matched_len, 4u);
    m = index.peek_resident(ns, T{1, 2, 3, 4});
    ASSERT_TRUE(m);
    EXPECT_EQ(m->value, 3u);
    EXPECT_EQ(m->matched_len, 3u);
    // Diverging at the branch point: either entry serves two tokens.
    m = index.peek_resident(ns, T{1, 2, 8});
    ASSERT_TRUE(m);
    EXPECT_EQ(m->matched_len, 2u);
}

TEST_F(RadixIndexTest, BothComponentsOnOneNode) {
    const T path{5, 6, 7};
    auto a = index.insert(kResident, ns, path, 1);
    auto b = index.insert(kExact, ns, path, 2);
    EXPECT_NE(a.entry, b.entry);
    EXPECT_EQ(index.size(), 2u);
    EXPECT_EQ(index.node_count(), 2u);  // root + one node
    index.remove(a.entry);
    EXPECT_TRUE(index.peek_exact(ns, path));
    EXPECT_FALSE(index.peek_resident(ns, path));
}

TEST_F(RadixIndexTest, InsertStatuses) {
    const T path{1, 2};
    auto r = index.insert(kExact, ns, path, 10);
    EXPECT_EQ(r.status, InsertStatus::Inserted);
    EXPECT_EQ(index.insert(kExact, ns, path, 10).status, InsertStatus::AlreadyPresent);
    Lease lease = index.acquire(r.entry);
    auto leased = index.insert(kExact, ns, path, 11);
    EXPECT_EQ(leased.status, InsertStatus::Leased);
    EXPECT_EQ(leased.entry, r.entry);
    EXPECT_EQ(index.peek_exact(ns, path)->value, 10u);
    lease.reset();
    auto replaced = index.insert(kExact, ns, path, 11);
    EXPECT_EQ(replaced.status, InsertStatus::Replaced);
    ASSERT_TRUE(replaced.replaced);
    EXPECT_EQ(replaced.replaced->value, 10u);
    EXPECT_EQ(replaced.replaced->entry, r.entry);
    EXPECT_NE(replaced.entry, r.entry);
    EXPECT_EQ(index.peek_exact(ns, path)->value, 11u);
    EXPECT_EQ(index.insert(kExact, ns, T{}, 1).status, InsertStatus::EmptyKey);
    EXPECT_EQ(index.size(kExact), 1u);
}

TEST_F(RadixIndexTest, PeekKeepsRecencyLookupTouches) {
    auto a = index.insert(kExact, ns, T{1}, 1);
    auto b = index.insert(kExact, ns, T{2}, 2);
    const uint64_t clock = index.clock();
    index.peek_exact(ns, T{1, 5});
    EXPECT_EQ(index.clock(), clock);
    EXPECT_EQ(index.lru_victim(kExact)->entry, a.entry);
    index.lookup_exact(ns, T{1, 5});
    EXPECT_GT(index.clock(), clock);
    EXPECT_EQ(index.lru_victim(kExact)->entry, b.entry);
    auto victim = index.evict_lru(kExact);
    ASSERT_TRUE(victim);
    EXPECT_EQ(victim->entry, b.entry);
    EXPECT_EQ(victim->value, 2u);
    EXPECT_EQ(victim->token_count, 1u);
}

TEST_F(RadixIndexTest, EvictionOrderIsDeterministicAndSkipsLeased) {
    std::vector<EntryId> ids;
    for (Token t = 0; t < 5; ++t) {
        ids.push_back(index.insert(kExact, ns, T{t, t}, static_cast<uint64_t>(t)).entry);
    }
    Lease held = index.acquire(ids[0]);
    EXPECT_EQ(index.leased_count(kExact), 1u);
    EXPECT_EQ(index.leased_count(kResident), 0u);
    EXPECT_EQ(index.evict_lru(kExact, /*exclude=*/ids[1])->entry, ids[2]);
    EXPECT_EQ(index.evict_lru(kExact)->entry, ids[1]);
    EXPECT_EQ(index.evict_lru(kExact)->entry, ids[3]);
    EXPECT_EQ(index.evict_lru(kExact)->entry, ids[4]);
    EXPECT_FALSE(index.evict_lru(kExact));  // only the leased one is left
    EXPECT_FALSE(index.evict_lru(kResident));
    held.reset();
    EXPECT_EQ(index.leased_count(kExact), 0u);
    EXPECT_EQ(index.evict_lru(kExact)->entry, ids[0]);
    EXPECT_EQ(index.namespace_count(), 0u);
}

TEST_F(RadixIndexTest, RemoveLeasedFailsOrDefers) {
    const T path{4, 4, 4};
    auto r = index.insert(kExact, ns, path, 44);
    Lease lease = index.acquire(r.entry);
    EXPECT_EQ(index.remove(r.entry).status, RemoveStatus::Leased);
    EXPECT_TRUE(index.peek_exact(ns, path));
    EXPECT_EQ(index.remove(kExact, ns, path, LeasedRemoval::Defer).status, RemoveStatus::Deferred);
    EXPECT_FALSE(index.peek_exact(ns, path));  // hidden at once
    EXPECT_FALSE(index.find(kExact, ns, path));
    EXPECT_FALSE(index.acquire(r.entry));  // no new leases on a doomed entry
    EXPECT_EQ(index.insert(kExact, ns, path, 45).status, InsertStatus::Leased);
    EXPECT_EQ(index.size(kExact), 1u);
    // The manual release of the last lease returns the removed entry.
    Lease moved = std::move(lease);
    EXPECT_FALSE(lease.held());
    EXPECT_TRUE(moved.held());
    const EntryId id = moved.entry();
    ASSERT_TRUE(index.acquire_raw(id) == false);  // doomed: refused
    moved.reset();
    EXPECT_EQ(index.size(kExact), 0u);
    EXPECT_EQ(index.node_count(), 0u);
}

TEST_F(RadixIndexTest, ReleaseRawReturnsDeferredRemoval) {
    auto r = index.insert(kExact, ns, T{1, 2}, 12);
    ASSERT_TRUE(index.acquire_raw(r.entry));
    ASSERT_TRUE(index.acquire_raw(r.entry));
    EXPECT_EQ(index.leased_count(kExact), 1u);  // entries, not leases
    EXPECT_EQ(index.remove(r.entry, LeasedRemoval::Defer).status, RemoveStatus::Deferred);
    EXPECT_EQ(index.leased_count(kExact), 1u);  // doomed, still leased
    EXPECT_FALSE(index.release_raw(r.entry));
    auto removed = index.release_raw(r.entry);
    EXPECT_EQ(index.leased_count(kExact), 0u);
    ASSERT_TRUE(removed);
    EXPECT_EQ(removed->value, 12u);
    EXPECT_FALSE(index.release_raw(r.entry));
}

TEST_F(RadixIndexTest, LeaseIsMovableAndReleasesOnce) {
    auto r = index.insert(kResident, ns, T{3}, 3);
    {
        Lease a = index.acquire(r.entry);
        EXPECT_EQ(index.info(r.entry)->leases, 1u);
        Lease b;
        b = std::move(a);
        Lease c(std::move(b));
        EXPECT_FALSE(a);
        EXPECT_FALSE(b);
        EXPECT_TRUE(c);
        EXPECT_EQ(index.info(r.entry)->leases, 1u);
        EXPECT_FALSE(index.evict_lru(kResident));
    }
    EXPECT_EQ(index.info(r.entry)->leases, 0u);
    EXPECT_TRUE(index.evict_lru(kResident));
    EXPECT_FALSE(index.acquire(12345));
}

TEST_F(RadixIndexTest, RemovalRenormalizesTheTree) {
    // root -> [1,2] -> {[3,4] , [5,6]} ; after removing [1,2,3,4], [1,2]+[5,6] merge.
    auto a = index.insert(kExact, ns, T{1, 2, 3, 4}, 1);
    auto b = index.insert(kExact, ns, T{1, 2, 5, 6}, 2);
    EXPECT_EQ(index.node_count(), 4u);  // root, split node, two leaves
    index.remove(a.entry);
    EXPECT_EQ(index.node_count(), 2u);
    EXPECT_EQ(index.tokens_of(b.entry), (T{1, 2, 5, 6}));
    // An inner node with a component survives as a unary node.
    auto c = index.insert(kExact, ns, T{1, 2}, 3);
    EXPECT_EQ(index.node_count(), 3u);
    index.remove(c.entry);
    EXPECT_EQ(index.node_count(), 2u);
    index.remove(b.entry);
    EXPECT_EQ(index.node_count(), 0u);
    EXPECT_EQ(index.namespace_count(), 0u);
}

TEST_F(RadixIndexTest, RemoveIfAndEntriesOnPath) {
    for (Token t = 1; t <= 6; ++t) {
        index.insert(kExact, ns, iota_tokens(static_cast<size_t>(t), 1), static_cast<uint64_t>(t));
    }
    auto path = index.entries_on_path(kExact, ns, iota_tokens(4, 1));
    ASSERT_EQ(path.size(), 4u);
    EXPECT_EQ(path.front().token_count, 1u);
    EXPECT_EQ(path.back().token_count, 4u);
    Lease held = index.acquire(path[1].entry);  // value 2
    auto res = index.remove_if(kExact, [](const EntryInfo& e) { return e.value % 2 == 0; });
    EXPECT_EQ(res.removed.size(), 2u);  // 4 and 6
    EXPECT_EQ(res.leased_skipped, 1u);  // 2
    auto res2 = index.remove_if(
        kExact, [](const EntryInfo& e) { return e.value == 2; }, LeasedRemoval::Defer);
    EXPECT_EQ(res2.deferred, 1u);
    EXPECT_EQ(index.entries_on_path(kExact, ns, iota_tokens(6, 1)).size(), 3u);  // 1,3,5
    EXPECT_EQ(index.size(kExact), 4u);  // includes the doomed one
}

TEST_F(RadixIndexTest, NamespacesAreSeparateTrees) {
    const NamespaceId other = test_namespace("tenant");
    index.insert(kExact, ns, T{1, 2}, 1);
    index.insert(kExact, other, T{1, 2}, 2);
    EXPECT_EQ(index.namespace_count(), 2u);
    EXPECT_EQ(index.peek_exact(ns, T{1, 2})->value, 1u);
    EXPECT_EQ(index.peek_exact(other, T{1, 2})->value, 2u);
    index.remove(kExact, other, T{1, 2});
    EXPECT_EQ(index.namespace_count(), 1u);
}

}  // namespace
}  // namespace skippy::cache
