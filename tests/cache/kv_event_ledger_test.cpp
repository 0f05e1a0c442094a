#include "cache/kv_event_ledger.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "cache/exact_state_cache.h"
#include "cache/prefix_identity.h"
#include "test_util.h"

namespace skippy::cache {
namespace {

using T = std::vector<Token>;

PageId page_for(const NamespaceId& ns, const T& tokens) {
    return prefix_identity(ns, 0, tokens).page_id();
}

T with_tail(T tokens, size_t n, Token first) {
    for (size_t i = 0; i < n; ++i) {
        tokens.push_back(first + static_cast<Token>(i));
    }
    return tokens;
}

TEST(KvEventLedgerTest, StoredBlocksChainFromTheNamespaceRoot) {
    KvEventLedger ledger({.block_size = 4});
    const NamespaceId ns = test::test_namespace();
    const T tokens = test::iota_tokens(10);  // 2 full blocks, 2 tokens not advertised
    std::vector<KvEvent> out;
    ledger.add(ns, tokens, page_for(ns, tokens), out);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].type, KvEventType::BlockStored);
    ASSERT_EQ(out[0].block_hashes.size(), 2u);
    EXPECT_FALSE(out[0].parent_block_hash.has_value());
    EXPECT_EQ(out[0].token_ids, T(tokens.begin(), tokens.begin() + 8));
    const uint64_t b0 = KvEventLedger::chain(KvEventLedger::root_seed(ns), T{0, 1, 2, 3});
    EXPECT_EQ(out[0].block_hashes[0], b0);
    EXPECT_EQ(out[0].block_hashes[1], KvEventLedger::chain(b0, T{4, 5, 6, 7}));
    EXPECT_NE(b0, 0u);
    EXPECT_EQ(ledger.advertised_blocks(), 2u);

    // Another namespace: other hashes for the same tokens.
    const NamespaceId other = test::test_namespace("tenant-b");
    EXPECT_NE(ledger.chain_of(other, tokens), ledger.chain_of(ns, tokens));
    // Deterministic.
    EXPECT_EQ(KvEventLedger({.block_size = 4}).chain_of(ns, tokens), out[0].block_hashes);
}

TEST(KvEventLedgerTest, LongerEntryAdvertisesOnlyItsNewBlocksWithTheirParent) {
    KvEventLedger ledger({.block_size = 4});
    const NamespaceId ns = test::test_namespace();
    const T a = test::iota_tokens(8);
    const T b = with_tail(a, 9, 100);  // 17 tokens: blocks 0..3, two shared with a
    std::vector<KvEvent> out;
    ledger.add(ns, a, page_for(ns, a), out);
    ledger.add(ns, b, page_for(ns, b), out);
    ASSERT_EQ(out.size(), 2u);
    ASSERT_EQ(out[1].block_hashes.size(), 2u);
    ASSERT_TRUE(out[1].parent_block_hash.has_value());
    EXPECT_EQ(*out[1].parent_block_hash, out[0].block_hashes[1]);
    EXPECT_EQ(out[1].token_ids, T(b.begin() + 8, b.begin() + 16));
    EXPECT_EQ(ledger.advertised_blocks(), 4u);

    // A shorter entry inside an advertised chain adds nothing.
    const T c = test::iota_tokens(5);
    out.clear();
    ledger.add(ns, c, page_for(ns, c), out);
    EXPECT_TRUE(out.empty());
    // Adding a known entry again changes nothing.
    ledger.add(ns, b, page_for(ns, b), out);
    EXPECT_TRUE(out.empty());

    // Removing the long entry withdraws only its own blocks, deepest first.
    ledger.remove(ns, b, page_for(ns, b), out);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].type, KvEventType::BlockRemoved);
    const auto chain_b = ledger.chain_of(ns, b);
    EXPECT_EQ(out[0].block_hashes, (std::vector<uint64_t>{chain_b[3], chain_b[2]}));
    // Block 0 is still covered by a and c; removing a leaves c's block 0.
    out.clear();
    ledger.remove(ns, a, page_for(ns, a), out);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].block_hashes, (std::vector<uint64_t>{chain_b[1]}));
    out.clear();
    ledger.remove(ns, c, page_for(ns, c), out);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].block_hashes, (std::vector<uint64_t>{chain_b[0]}));
    EXPECT_EQ(ledger.advertised_blocks(), 0u);
    EXPECT_EQ(ledger.entries(), 0u);
    // Unknown entry: nothing.
    out.clear();
    ledger.remove(ns, c, page_for(ns, c), out);
    EXPECT_TRUE(out.empty());
}

TEST(KvEventLedgerTest, ShortEntryAdvertisesNothing) {
    KvEventLedger ledger({.block_size = 16});
    const NamespaceId ns = test::test_namespace();
    const T t = test::iota_tokens(15);
    std::vector<KvEvent> out;
    ledger.add(ns, t, page_for(ns, t), out);
    ledger.remove(ns, t, page_for(ns, t), out);
    EXPECT_TRUE(out.empty());
}

TEST(KvEventLedgerTest, CheckpointOnlyAdvertisesEntriesEndingOnABlockBoundary) {
    KvEventLedger ledger({.block_size = 4, .checkpoint_only = true});
    const NamespaceId ns = test::test_namespace();
    const T off = test::iota_tokens(10);
    const T on = test::iota_tokens(12);
    std::vector<KvEvent> out;
    ledger.add(ns, off, page_for(ns, off), out);
    EXPECT_TRUE(out.empty());
    EXPECT_TRUE(ledger.chain_of(ns, off).empty());
    ledger.add(ns, on, page_for(ns, on), out);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].block_hashes.size(), 3u);
    EXPECT_EQ(out[0].token_ids, on);
    out.clear();
    ledger.remove(ns, off, page_for(ns, off), out);
    EXPECT_TRUE(out.empty());
}

TEST(KvEventLedgerTest, ClearWithdrawsEverythingThenAllBlocksCleared) {
    KvEventLedger ledger({.block_size = 2});
    const NamespaceId ns = test::test_namespace();
    const T a = test::iota_tokens(6);
    const T b = test::iota_tokens(4, 50);
    std::vector<KvEvent> out;
    ledger.add(ns, a, page_for(ns, a), out);
    ledger.add(ns, b, page_for(ns, b), out);
    out.clear();
    ledger.clear(out);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0].type, KvEventType::BlockRemoved);
    EXPECT_EQ(out[0].block_hashes.size(), 5u);
    EXPECT_EQ(out[1].type, KvEventType::AllBlocksCleared);
    EXPECT_EQ(ledger.advertised_blocks(), 0u);
    out.clear();
    ledger.remove(ns, a, page_for(ns, a), out);
    EXPECT_TRUE(out.empty());
}

// The cache's observer feeding a ledger: insert, eviction, replacement, quarantine and
// namespace removal keep the advertised blocks equal to the stored entries' blocks.
TEST(KvEventLedgerTest, FollowsTheExactStateCache) {
    const NamespaceId ns = test::test_namespace();
    KvEventLedger ledger({.block_size = 8});
    std::vector<KvEvent> events;
    std::vector<EntryChange::Cause> causes;
    ExactStateCacheOptions o;
    o.limits.max_entries = 2;
    o.limits.max_physical_bytes = 1 << 20;
    o.blocks.block_bytes = 64;
    o.on_change = [&](const EntryChange& c) {
        causes.push_back(c.cause);
        if (c.kind == EntryChange::Kind::Added) {
            ledger.add(c.ns, c.tokens, c.page, events);
        } else {
            ledger.remove(c.ns, c.tokens, c.page, events);
        }
    };
    ExactStateCache cache(o);
    auto put = [&](const T& tokens, PageId page) {
        std::vector<uint8_t> bytes(100, static_cast<uint8_t>(tokens.size()));
        PayloadDescriptor d;
        d.kind = PayloadKind::FullState;
        d.token_end = static_cast<uint32_t>(tokens.size());
        d.layer_end = 32;
        d.k_type = "f16";
        d.v_type = "f16";
        d.payload_bytes = bytes.size();
        return cache.insert(ns, tokens, page, d, bytes).status;
    };
    const T a = test::iota_tokens(16);
    const T b = test::iota_tokens(24);
    const T c = test::iota_tokens(32, 1000);
    EXPECT_EQ(put(a, page_for(ns, a)), ExactInsertStatus::Inserted);
    EXPECT_EQ(put(b, page_for(ns, b)), ExactInsertStatus::Inserted);
    EXPECT_EQ(ledger.advertised_blocks(), 3u);
    // c evicts a (LRU); a's blocks stay advertised through b.
    EXPECT_EQ(put(c, page_for(ns, c)), ExactInsertStatus::Inserted);
    EXPECT_EQ(causes.back(), EntryChange::Cause::Evicted);
    EXPECT_EQ(ledger.advertised_blocks(), 7u);
    EXPECT_EQ(ledger.entries(), 2u);
    // Replacing b (another page at the same path): Added before Removed, no flapping.
    events.clear();
    EXPECT_EQ(put(b, PageId(12345)), ExactInsertStatus::Replaced);
    EXPECT_TRUE(events.empty());
    EXPECT_EQ(causes.back(), EntryChange::Cause::Replaced);
    // Quarantine withdraws c's blocks.
    EXPECT_EQ(cache.quarantine(ns, c, page_for(ns, c)), QuarantineStatus::Removed);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].type, KvEventType::BlockRemoved);
    EXPECT_EQ(events[0].block_hashes.size(), 4u);
    // Namespace removal withdraws the rest.
    EXPECT_EQ(cache.remove_namespace(ns), 1u);
    EXPECT_EQ(causes.back(), EntryChange::Cause::NamespaceRemoved);
    EXPECT_EQ(ledger.advertised_blocks(), 0u);
    EXPECT_EQ(ledger.entries(), 0u);
}

}  // namespace
}  // namespace skippy::cache
