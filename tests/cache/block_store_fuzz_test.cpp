// Randomized state-machine test of BlockStore: refcounts, physical/logical bytes and block
// ownership are checked against a model after every operation.
// Depth: SKIPPY_FUZZ_SEEDS x SKIPPY_FUZZ_STEPS (default 4 x 10000).
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

#include "cache/block_store.h"
#include "test_util.h"

namespace skippy::cache {
namespace {

using Bytes = std::vector<uint8_t>;

// A weak hash (first byte and size only) to exercise the collision path heavily.
Hash128 weak_hash(std::span<const uint8_t> bytes) {
    return Hash128{bytes.empty() ? 0u : bytes[0] % 4u, bytes.size()};
}

class BlockStoreFuzz {
  public:
    BlockStoreFuzz(uint64_t seed, bool weak) : rng_(seed), store_(options(weak)) {
        for (int i = 0; i < 6; ++i) {
            chunks_.push_back(test::random_bytes(rng_, 8 + rng_() % 40));
        }
    }

    void run(uint64_t steps) {
        for (uint64_t step = 0; step < steps; ++step) {
            SCOPED_TRACE(::testing::Message() << "step " << step);
            const unsigned op = static_cast<unsigned>(rng_() % 100);
            if (live_.size() > kMaxLive) {
                do_release();
            } else if (op < 40) {
                do_insert(/*inject=*/false);
            } else if (op < 45) {
                do_insert(/*inject=*/true);
            } else if (op < 75) {
                do_release();
            } else if (op < 82) {
                do_bad_release();
            } else {
                do_reconstruct();
            }
            ASSERT_NO_FATAL_FAILURE(check());
            if (::testing::Test::HasFatalFailure()) {
                return;
            }
        }
        while (!live_.empty()) {
            ASSERT_EQ(store_.release(live_.back().stored), ReleaseError::None);
            live_.pop_back();
        }
        check();
        ASSERT_EQ(store_.stats().block_count, 0u);
    }

  private:
    static constexpr size_t kMaxLive = 40;
    struct Live {
        Bytes bytes;
        StoredPayload stored;
    };

    static BlockStoreOptions options(bool weak) {
        BlockStoreOptions o;
        o.block_bytes = 16;
        if (weak) {
            o.hasher = &weak_hash;
        }
        return o;
    }

    void do_insert(bool inject) {
        Bytes bytes;
        std::vector<size_t> cuts;
        const size_t n = rng_() % 5;
        for (size_t i = 0; i < n; ++i) {
            const Bytes& c = chunks_[rng_() % chunks_.size()];
            if (!bytes.empty() && rng_() % 2 == 0) {
                cuts.push_back(bytes.size());
            }
            bytes.insert(bytes.end(), c.begin(), c.end());
        }
        if (rng_() % 10 == 0) {
            Bytes noise = test::random_bytes(rng_, rng_() % 50);
            bytes.insert(bytes.end(), noise.begin(), noise.end());
        }
        const std::vector<BlockId> ids_before = store_.block_ids();
        const BlockStoreStats before = store_.stats();
        if (inject) {
            store_.debug_fail_next_commit_after(rng_() % 4);
        }
        InsertOutcome in = store_.insert(bytes, cuts);
        if (!in.ok()) {
            ASSERT_TRUE(inject);
            ASSERT_EQ(in.error, InsertError::InjectedFailure);
            ASSERT_EQ(store_.block_ids(), ids_before);
            ASSERT_EQ(store_.stats().logical_bytes, before.logical_bytes);
            ASSERT_EQ(store_.stats().physical_bytes, before.physical_bytes);
            return;
        }
        // (An injection beyond the block count is consumed by this successful commit.)
        ASSERT_EQ(in.report.new_blocks + in.report.reused_blocks, in.payload.blocks.size());
        ASSERT_EQ(in.report.logical_bytes, bytes.size());
        ASSERT_EQ(store_.stats().physical_bytes - before.physical_bytes, in.report.new_bytes);
        live_.push_back({std::move(bytes), in.payload});
    }

    void do_release() {
        if (live_.empty()) {
            return;
        }
        const size_t i = rng_() % live_.size();
        ASSERT_EQ(store_.release(live_[i].stored), ReleaseError::None);
        live_.erase(live_.begin() + static_cast<ptrdiff_t>(i));
    }

    void do_bad_release() {
        const std::vector<BlockId> ids_before = store_.block_ids();
        const BlockStoreStats before = store_.stats();
        std::vector<BlockId> batch;
        if (!live_.empty()) {
            batch = live_[rng_() % live_.size()].stored.blocks;
        }
        ReleaseError expect;
        if (rng_() % 2 == 0 || batch.empty()) {
            batch.push_back(1u << 30);
            expect = ReleaseError::MissingBlock;
        } else {
            // One more reference to a block than exists anywhere.
            const BlockId b = batch[rng_() % batch.size()];
            const uint32_t refs = *store_.refcount(b);
            batch.erase(std::remove(batch.begin(), batch.end(), b), batch.end());
            batch.insert(batch.end(), refs + 1, b);
            expect = ReleaseError::RefcountUnderflow;
        }
        std::shuffle(batch.begin(), batch.end(), rng_);
        ASSERT_EQ(store_.release_blocks(batch), expect);
        ASSERT_EQ(store_.block_ids(), ids_before);
        ASSERT_EQ(store_.stats().logical_bytes, before.logical_bytes);
        ASSERT_EQ(store_.stats().physical_bytes, before.physical_bytes);
    }

    void do_reconstruct() {
        if (live_.empty()) {
            return;
        }
        const Live& l = live_[rng_() % live_.size()];
        ReconstructResult r = store_.reconstruct(l.stored);
        ASSERT_TRUE(r.ok()) << to_string(r.error);
        ASSERT_EQ(Bytes(r.bytes.span().begin(), r.bytes.span().end()), l.bytes);
        ASSERT_EQ(r.bytes.zero_copy(), l.stored.blocks.size() == 1);
        Bytes into;
        ASSERT_EQ(store_.snapshot(l.stored)->reconstruct_into(into), ReconstructError::None);
        ASSERT_EQ(into, l.bytes);
    }

    void check() {
        std::map<BlockId, uint32_t> refs;
        uint64_t logical = 0;
        for (const Live& l : live_) {
            for (BlockId b : l.stored.blocks) {
                ++refs[b];
                auto size = store_.block_size(b);
                ASSERT_TRUE(size.has_value()) << "live payload references a freed block";
                logical += *size;
            }
        }
        const std::vector<BlockId> ids = store_.block_ids();
        ASSERT_EQ(ids.size(), refs.size()) << "unreferenced or missing blocks";
        uint64_t physical = 0;
        for (BlockId b : ids) {
            ASSERT_EQ(*store_.refcount(b), refs[b]);
            physical += *store_.block_size(b);
        }
        const BlockStoreStats s = store_.stats();
        ASSERT_EQ(s.logical_bytes, logical);
        ASSERT_EQ(s.physical_bytes, physical);
        ASSERT_EQ(s.block_count, ids.size());
    }

    std::mt19937_64 rng_;
    BlockStore store_;
    std::vector<Bytes> chunks_;
    std::vector<Live> live_;
};

TEST(BlockStoreFuzz, RefcountsBytesAndOwnershipStayConsistent) {
    const uint64_t seeds = test::fuzz_seeds();
    const uint64_t steps = test::fuzz_steps();
    for (uint64_t seed = 1; seed <= seeds; ++seed) {
        for (bool weak : {false, true}) {
            SCOPED_TRACE(::testing::Message() << "seed " << seed << " weak_hash " << weak);
            BlockStoreFuzz fuzz(seed, weak);
            fuzz.run(steps);
            if (HasFatalFailure()) {
                return;
            }
        }
    }
}

}  // namespace
}  // namespace skippy::cache
