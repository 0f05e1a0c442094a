#include "cache/exact_state_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include "cache/prefix_identity.h"
#include "test_util.h"

namespace skippy::cache {
namespace {

using Bytes = std::vector<uint8_t>;
using T = std::vector<Token>;

PayloadDescriptor full_state(size_t tokens, size_t bytes) {
    PayloadDescriptor d;
    d.kind = PayloadKind::FullState;
    d.token_begin = 0;
    d.token_end = static_cast<uint32_t>(tokens);
    d.layer_begin = 0;
    d.layer_end = 32;
    d.k_type = "f16";
    d.v_type = "f16";
    d.payload_bytes = bytes;
    return d;
}

class ExactStateCacheTest : public ::testing::Test {
  protected:
    ExactStateCacheOptions options(size_t max_entries, uint64_t max_bytes, size_t block = 64) {
        ExactStateCacheOptions o;
        o.limits.max_entries = max_entries;
        o.limits.max_physical_bytes = max_bytes;
        o.blocks.block_bytes = block;
        return o;
    }
    PageId page_for(const T& tokens) { return prefix_identity(ns, 0, tokens).page_id(); }
    ExactInsertResult put(ExactStateCache& cache, const T& tokens, const Bytes& bytes) {
        return cache.insert(ns, tokens, page_for(tokens), full_state(tokens.size(), bytes.size()),
                            bytes);
    }
    void check(const ExactStateCache& cache) {
        auto err = cache.debug_check();
        EXPECT_FALSE(err.has_value()) << *err;
    }

    NamespaceId ns = test::test_namespace();
    std::mt19937_64 rng{1};
};

TEST_F(ExactStateCacheTest, InsertAcquireReconstruct) {
    ExactStateCache cache(options(8, 1 << 20));
    const T short_tokens = test::iota_tokens(100);
    const T long_tokens = test::iota_tokens(200);
    const Bytes a = test::random_bytes(rng, 300);
    const Bytes b = test::random_bytes(rng, 500);
    EXPECT_EQ(put(cache, short_tokens, a).status, ExactInsertStatus::Inserted);
    ExactInsertResult rb = put(cache, long_tokens, b);
    EXPECT_EQ(rb.status, ExactInsertStatus::Inserted);
    EXPECT_EQ(rb.blocks.new_blocks, 8u);

    const T prompt = test::iota_tokens(250);
    auto hit = cache.acquire_longest(ns, std::span(prompt).first(249));
    ASSERT_TRUE(hit);
    EXPECT_EQ(hit->len, 200u);
    EXPECT_EQ(hit->page, page_for(long_tokens));
    EXPECT_EQ(hit->descriptor, full_state(200, 500));
    EXPECT_EQ(hit->payload_bytes, 500u);
    ReconstructResult r = cache.reconstruct(hit->lease);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(Bytes(r.bytes.span().begin(), r.bytes.span().end()), b);

    std::vector<uint8_t> reused(7, 0xee);
    EXPECT_EQ(cache.reconstruct_into(hit->lease, reused), ReconstructError::None);
    EXPECT_EQ(reused, b);
    // A lease of another owner (or an empty one) does not open this cache's entries.
    RadixIndex other;
    const EntryId foreign = other.insert(ComponentKind::Exact, ns, long_tokens, 0).entry;
    Lease foreign_lease = other.acquire(foreign);
    EXPECT_EQ(cache.reconstruct(foreign_lease).error, ReconstructError::MissingBlock);
    EXPECT_EQ(cache.reconstruct(Lease()).error, ReconstructError::MissingBlock);

    auto shorter = cache.acquire_longest(ns, std::span(prompt).first(150));
    ASSERT_TRUE(shorter);
    EXPECT_EQ(shorter->len, 100u);
    EXPECT_FALSE(cache.acquire_longest(ns, std::span(prompt).first(99)));
    EXPECT_FALSE(cache.acquire_longest(test::test_namespace("x"), prompt));
    const ExactStateStats s = cache.stats();
    EXPECT_EQ(s.hits, 2u);
    EXPECT_EQ(s.misses, 2u);
    EXPECT_EQ(s.entries, 2u);
    check(cache);
}

TEST_F(ExactStateCacheTest, InsertStatuses) {
    ExactStateCache cache(options(8, 1 << 20));
    const T tokens = test::iota_tokens(50);
    const Bytes bytes = test::random_bytes(rng, 100);
    EXPECT_EQ(put(cache, tokens, bytes).status, ExactInsertStatus::Inserted);
    EXPECT_EQ(put(cache, tokens, bytes).status, ExactInsertStatus::AlreadyPresent);
    EXPECT_TRUE(cache.contains(ns, tokens, page_for(tokens)));
    EXPECT_FALSE(cache.contains(ns, tokens, PageId(1)));

    // Another page at the same path: leased -> refused, unleased -> replaced.
    auto hit = cache.acquire_longest(ns, tokens);
    ASSERT_TRUE(hit);
    const Bytes other = test::random_bytes(rng, 100);
    EXPECT_EQ(cache.insert(ns, tokens, PageId(7), full_state(50, 100), other).status,
              ExactInsertStatus::Leased);
    hit.reset();
    EXPECT_EQ(cache.insert(ns, tokens, PageId(7), full_state(50, 100), other).status,
              ExactInsertStatus::Replaced);
    EXPECT_TRUE(cache.contains(ns, tokens, PageId(7)));
    EXPECT_EQ(cache.stats().blocks.physical_bytes, 100u);

    ExactInsertResult bad = cache.insert(ns, tokens, PageId(8), full_state(50, 99), other);
    EXPECT_EQ(bad.status, ExactInsertStatus::InvalidDescriptor);
    EXPECT_EQ(bad.invalid_reason, "size mismatch");
    EXPECT_EQ(cache.insert(ns, tokens, PageId(8), full_state(49, 100), other).status,
              ExactInsertStatus::InvalidDescriptor);
    PayloadDescriptor kv = full_state(50, 100);
    kv.kind = PayloadKind::KvPages;
    kv.kv_bytes = 60;
    kv.recurrent_bytes = 30;
    EXPECT_EQ(cache.insert(ns, tokens, PageId(8), kv, other).status,
              ExactInsertStatus::InvalidDescriptor);
    kv.recurrent_bytes = 40;
    EXPECT_EQ(cache.insert(ns, tokens, PageId(8), kv, other).status, ExactInsertStatus::Replaced);
    EXPECT_EQ(cache.insert(ns, T{}, PageId(8), full_state(0, 100), other).status,
              ExactInsertStatus::EmptyKey);
    EXPECT_EQ(cache.insert(ns, tokens, PageId(9), full_state(50, 0), Bytes{}).status,
              ExactInsertStatus::InvalidDescriptor);
    check(cache);
}

TEST_F(ExactStateCacheTest, EntryLimitEvictsLeastRecentlyUsed) {
    ExactStateCache cache(options(2, 1 << 20));
    const T a = test::iota_tokens(10, 0), b = test::iota_tokens(10, 100),
            c = test::iota_tokens(10, 200);
    put(cache, a, test::random_bytes(rng, 100));
    put(cache, b, test::random_bytes(rng, 100));
    ASSERT_TRUE(cache.acquire_longest(ns, a));  // a is now more recent than b
    ExactInsertResult r = put(cache, c, test::random_bytes(rng, 100));
    EXPECT_EQ(r.status, ExactInsertStatus::Inserted);
    ASSERT_EQ(r.evicted.size(), 1u);
    EXPECT_EQ(r.evicted[0], page_for(b));
    EXPECT_TRUE(cache.contains(ns, a, page_for(a)));
    EXPECT_FALSE(cache.contains(ns, b, page_for(b)));
    EXPECT_EQ(cache.stats().evictions, 1u);
    check(cache);
}

TEST_F(ExactStateCacheTest, PhysicalByteLimitCountsSharedBlocksOnce) {
    ExactStateCache cache(options(100, 1000, 100));
    const Bytes shared = test::random_bytes(rng, 600);
    Bytes longer = shared;
    const Bytes tail = test::random_bytes(rng, 300);
    longer.insert(longer.end(), tail.begin(), tail.end());
    put(cache, test::iota_tokens(10), shared);
    ExactInsertResult r = put(cache, test::iota_tokens(20), longer);
    EXPECT_EQ(r.status, ExactInsertStatus::Inserted);
    EXPECT_EQ(r.blocks.reused_blocks, 6u);
    EXPECT_TRUE(r.evicted.empty());
    EXPECT_EQ(cache.stats().blocks.physical_bytes, 900u);
    EXPECT_EQ(cache.stats().blocks.logical_bytes, 1500u);
    // 300 new bytes exceed the 1000-byte limit.
    ExactInsertResult r2 = put(cache, test::iota_tokens(30), test::random_bytes(rng, 300));
    EXPECT_EQ(r2.status, ExactInsertStatus::Inserted);
    // LRU order: the 600-byte entry goes first (frees nothing, its blocks are shared),
    // then the 900-byte one.
    EXPECT_EQ(r2.evicted.size(), 2u);
    EXPECT_LE(cache.stats().blocks.physical_bytes, 1000u);
    check(cache);
}

TEST_F(ExactStateCacheTest, NewEntryIsNeverEvictedForItself) {
    ExactStateCache cache(options(4, 1000, 100));
    put(cache, test::iota_tokens(10), test::random_bytes(rng, 400));
    put(cache, test::iota_tokens(20), test::random_bytes(rng, 400));
    // Too big for the whole cache: refused without flushing the others.
    ExactInsertResult big = put(cache, test::iota_tokens(30), test::random_bytes(rng, 1100));
    EXPECT_EQ(big.status, ExactInsertStatus::NoCapacity);
    EXPECT_TRUE(big.evicted.empty());
    EXPECT_EQ(cache.stats().entries, 2u);
    // Fits only after evicting both: both go, the new one stays.
    ExactInsertResult fits = put(cache, test::iota_tokens(40), test::random_bytes(rng, 900));
    EXPECT_EQ(fits.status, ExactInsertStatus::Inserted);
    EXPECT_EQ(fits.evicted.size(), 2u);
    EXPECT_EQ(cache.stats().entries, 1u);
    check(cache);
}

TEST_F(ExactStateCacheTest, LeasedEntriesAreNotEvicted) {
    ExactStateCache cache(options(1, 1 << 20));
    const T a = test::iota_tokens(10);
    put(cache, a, test::random_bytes(rng, 100));
    EXPECT_EQ(cache.stats().leased_entries, 0u);
    auto hit = cache.acquire_longest(ns, a);
    ASSERT_TRUE(hit);
    EXPECT_EQ(cache.stats().leased_entries, 1u);
    ExactInsertResult r = put(cache, test::iota_tokens(10, 50), test::random_bytes(rng, 100));
    EXPECT_EQ(r.status, ExactInsertStatus::NoCapacity);
    EXPECT_TRUE(cache.contains(ns, a, page_for(a)));
    EXPECT_TRUE(cache.reconstruct(hit->lease).ok());
    hit.reset();
    EXPECT_EQ(cache.stats().leased_entries, 0u);
    EXPECT_EQ(put(cache, test::iota_tokens(10, 50), test::random_bytes(rng, 100)).status,
              ExactInsertStatus::Inserted);
    check(cache);
}

TEST_F(ExactStateCacheTest, CorruptionIsDetectedAndQuarantined) {
    ExactStateCache cache(options(8, 1 << 20));
    const T tokens = test::iota_tokens(64);
    const PageId page = page_for(tokens);
    put(cache, tokens, test::random_bytes(rng, 1000));
    ASSERT_TRUE(cache.debug_corrupt(ns, tokens, 777));
    auto hit = cache.acquire_longest(ns, tokens);
    ASSERT_TRUE(hit);
    ReconstructResult r = cache.reconstruct(hit->lease);
    EXPECT_EQ(r.error, ReconstructError::ChecksumMismatch);
    // Quarantine while still leased: hidden now, freed at release.
    EXPECT_EQ(cache.quarantine(ns, tokens, PageId(page.value() + 1)),
              QuarantineStatus::PageMismatch);
    EXPECT_EQ(cache.quarantine(ns, tokens, page), QuarantineStatus::Deferred);
    EXPECT_FALSE(cache.acquire_longest(ns, tokens));
    EXPECT_FALSE(cache.contains(ns, tokens, page));
    EXPECT_EQ(cache.stats().hidden_entries, 1u);
    EXPECT_GT(cache.stats().blocks.physical_bytes, 0u);
    EXPECT_EQ(cache.quarantine(ns, tokens, page), QuarantineStatus::NotFound);
    // Re-recording the page while the doomed entry is still leased is refused.
    EXPECT_EQ(put(cache, tokens, test::random_bytes(rng, 1000)).status, ExactInsertStatus::Leased);
    hit.reset();
    EXPECT_EQ(cache.stats().entries, 0u);
    EXPECT_EQ(cache.stats().blocks.physical_bytes, 0u);
    EXPECT_EQ(cache.stats().quarantined, 1u);
    // Unleased quarantine removes at once.
    put(cache, tokens, test::random_bytes(rng, 1000));
    EXPECT_EQ(cache.quarantine(ns, tokens, page), QuarantineStatus::Removed);
    EXPECT_EQ(cache.stats().blocks.block_count, 0u);
    check(cache);
}

TEST_F(ExactStateCacheTest, TryVariantsReturnImmediatelyWhenBusy) {
    ExactStateCache cache(options(8, 1 << 20));
    const T tokens = test::iota_tokens(64);
    put(cache, tokens, test::random_bytes(rng, 100));
    EXPECT_EQ(cache.try_contains(ns, tokens, page_for(tokens)), Presence::Present);
    EXPECT_EQ(cache.try_contains(ns, tokens, PageId(3)), Presence::Absent);

    std::promise<void> locked, release;
    std::thread holder([&] {
        auto lock = cache.debug_lock();
        locked.set_value();
        release.get_future().wait();
    });
    locked.get_future().wait();
    const auto start = std::chrono::steady_clock::now();
    const Presence p = cache.try_contains(ns, tokens, page_for(tokens));
    const TryExactPeek peek = cache.try_peek_longest(ns, tokens);
    const auto stats = cache.try_stats();
    const auto elapsed = std::chrono::steady_clock::now() - start;
    release.set_value();
    holder.join();
    EXPECT_EQ(p, Presence::Unknown);
    EXPECT_TRUE(peek.busy);
    EXPECT_FALSE(stats.has_value());
    EXPECT_LT(elapsed, std::chrono::milliseconds(100));
    EXPECT_EQ(cache.try_contains(ns, tokens, page_for(tokens)), Presence::Present);
}

TEST_F(ExactStateCacheTest, QuarantineIsSafeAgainstConcurrentLookups) {
    ExactStateCache cache(options(16, 1 << 22, 256));
    const T tokens = test::iota_tokens(128);
    const T query = test::iota_tokens(200);
    const PageId page = page_for(tokens);
    const Bytes bytes = test::random_bytes(rng, 4096);
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> reads{0}, wrong{0};
    std::vector<std::thread> readers;
    for (int t = 0; t < 3; ++t) {
        readers.emplace_back([&] {
            while (!stop.load()) {
                auto hit = cache.acquire_longest(ns, query);
                if (!hit) {
                    continue;
                }
                ReconstructResult r = cache.reconstruct(hit->lease);
                if (r.ok()) {
                    ++reads;
                    if (hit->page != page ||
                        Bytes(r.bytes.span().begin(), r.bytes.span().end()) != bytes) {
                        ++wrong;
                    }
                }
                if (reads % 3 == 0) {
                    cache.quarantine(ns, tokens, page);  // readers quarantine too
                }
            }
        });
    }
    std::thread writer([&] {
        for (int i = 0; i < 2000; ++i) {
            (void)cache.insert(ns, tokens, page, full_state(tokens.size(), bytes.size()), bytes);
            (void)cache.quarantine(ns, tokens, page);
        }
        stop = true;
    });
    writer.join();
    for (auto& r : readers) {
        r.join();
    }
    EXPECT_EQ(wrong.load(), 0u);
    (void)cache.quarantine(ns, tokens, page);
    EXPECT_EQ(cache.stats().entries, 0u);
    EXPECT_EQ(cache.stats().blocks.block_count, 0u);
    check(cache);
}

TEST_F(ExactStateCacheTest, RandomOperationsKeepBlocksConsistent) {
    ExactStateCache cache(options(6, 4000, 128));
    std::vector<Bytes> chunks;
    for (int i = 0; i < 5; ++i) {
        chunks.push_back(test::random_bytes(rng, 256));
    }
    std::vector<std::optional<ExactHit>> leases;
    const uint64_t steps = std::min<uint64_t>(test::fuzz_steps(), 4000);
    for (uint64_t step = 0; step < steps; ++step) {
        const T tokens = test::iota_tokens(1 + rng() % 12, static_cast<Token>(rng() % 3));
        switch (rng() % 5) {
            case 0:
            case 1: {
                Bytes b;
                for (size_t i = 0, n = 1 + rng() % 6; i < n; ++i) {
                    const Bytes& c = chunks[rng() % chunks.size()];
                    b.insert(b.end(), c.begin(), c.end());
                }
                (void)put(cache, tokens, b);
                break;
            }
            case 2:
                if (auto hit = cache.acquire_longest(ns, tokens); hit && leases.size() < 4) {
                    leases.push_back(std::move(hit));
                }
                break;
            case 3:
                if (!leases.empty()) {
                    leases.erase(leases.begin() + static_cast<ptrdiff_t>(rng() % leases.size()));
                }
                break;
            case 4:
                (void)cache.quarantine(ns, tokens, page_for(tokens));
                break;
        }
        auto err = cache.debug_check();
        ASSERT_FALSE(err.has_value()) << "step " << step << ": " << *err;
        const ExactStateStats s = cache.stats();
        ASSERT_LE(s.entries, 6u);
        ASSERT_LE(s.blocks.physical_bytes, 4000u);
    }
    leases.clear();
    check(cache);
}

}  // namespace
}  // namespace skippy::cache
