#include "cache/block_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "test_util.h"

namespace skippy::cache {
namespace {

using Bytes = std::vector<uint8_t>;

Hash128 constant_hash(std::span<const uint8_t>) { return Hash128{42, 42}; }

BlockStoreOptions small_blocks(size_t block_bytes) {
    BlockStoreOptions o;
    o.block_bytes = block_bytes;
    return o;
}

Bytes to_bytes(const PayloadBytes& p) { return Bytes(p.span().begin(), p.span().end()); }

TEST(BlockStore, SingleBlockReconstructIsZeroCopy) {
    std::mt19937_64 rng(1);
    BlockStore store;
    const Bytes payload = test::random_bytes(rng, 1000);
    InsertOutcome in = store.insert(payload);
    ASSERT_TRUE(in.ok());
    EXPECT_EQ(in.payload.blocks.size(), 1u);
    EXPECT_EQ(in.report.new_blocks, 1u);
    EXPECT_EQ(in.report.logical_bytes, 1000u);
    ReconstructResult r = store.reconstruct(in.payload);
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r.bytes.zero_copy());
    EXPECT_EQ(to_bytes(r.bytes), payload);
    // The view stays valid after the store drops the block.
    ASSERT_EQ(store.release(in.payload), ReleaseError::None);
    EXPECT_EQ(store.stats().block_count, 0u);
    EXPECT_EQ(to_bytes(r.bytes), payload);
}

TEST(BlockStore, MultiBlockAssemblesOneBuffer) {
    std::mt19937_64 rng(2);
    BlockStore store(small_blocks(256));
    const Bytes payload = test::random_bytes(rng, 1000);
    InsertOutcome in = store.insert(payload);
    ASSERT_TRUE(in.ok());
    EXPECT_EQ(in.payload.blocks.size(), 4u);  // 256, 256, 256, 232
    EXPECT_EQ(*store.block_size(in.payload.blocks.back()), 232u);
    ReconstructResult r = store.reconstruct(in.payload);
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r.bytes.zero_copy());
    EXPECT_EQ(to_bytes(r.bytes), payload);
    EXPECT_GE(in.report.hash_seconds, 0.0);
    std::vector<uint8_t> into(5000, 1);  // larger than needed: shrunk to the payload
    EXPECT_EQ(store.snapshot(in.payload)->reconstruct_into(into), ReconstructError::None);
    EXPECT_EQ(into, payload);
}

TEST(BlockStore, IdenticalPayloadsShareBlocks) {
    std::mt19937_64 rng(3);
    BlockStore store(small_blocks(100));
    const Bytes payload = test::random_bytes(rng, 1000);
    InsertOutcome a = store.insert(payload);
    InsertOutcome b = store.insert(payload);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a.payload.blocks, b.payload.blocks);
    EXPECT_EQ(b.report.new_blocks, 0u);
    EXPECT_EQ(b.report.reused_blocks, 10u);
    EXPECT_EQ(b.report.new_bytes, 0u);
    const BlockStoreStats s = store.stats();
    EXPECT_EQ(s.physical_bytes, 1000u);
    EXPECT_EQ(s.logical_bytes, 2000u);
    EXPECT_EQ(s.block_count, 10u);
    EXPECT_EQ(s.new_blocks, 10u);
    EXPECT_EQ(s.reused_blocks, 10u);
    EXPECT_EQ(*store.refcount(a.payload.blocks[0]), 2u);
    ASSERT_EQ(store.release(a.payload), ReleaseError::None);
    EXPECT_EQ(store.stats().physical_bytes, 1000u);
    EXPECT_EQ(store.stats().logical_bytes, 1000u);
    ASSERT_EQ(store.release(b.payload), ReleaseError::None);
    EXPECT_EQ(store.stats().physical_bytes, 0u);
    EXPECT_EQ(store.stats().logical_bytes, 0u);
}

TEST(BlockStore, RepeatedBlockWithinOnePayload) {
    BlockStore store(small_blocks(4));
    const Bytes payload{1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4};
    InsertOutcome in = store.insert(payload);
    ASSERT_TRUE(in.ok());
    EXPECT_EQ(in.report.new_blocks, 1u);
    EXPECT_EQ(in.report.reused_blocks, 2u);
    EXPECT_EQ(*store.refcount(in.payload.blocks[0]), 3u);
    EXPECT_EQ(to_bytes(store.reconstruct(in.payload).bytes), payload);
    EXPECT_EQ(store.release(in.payload), ReleaseError::None);
    EXPECT_EQ(store.stats().block_count, 0u);
}

TEST(BlockStore, CutPointsLetALongerPrefixShareBlocks) {
    // Two KV pages: the longer prefix repeats the shorter one's token chunks.
    std::mt19937_64 rng(4);
    const Bytes c1 = test::random_bytes(rng, 300);
    const Bytes c2 = test::random_bytes(rng, 300);
    const Bytes c3 = test::random_bytes(rng, 300);
    Bytes short_page = c1;
    short_page.insert(short_page.end(), c2.begin(), c2.end());
    Bytes long_page = short_page;
    long_page.insert(long_page.end(), c3.begin(), c3.end());
    BlockStore store(small_blocks(1 << 20));
    const std::vector<size_t> short_cuts{300};
    const std::vector<size_t> long_cuts{300, 600};
    InsertOutcome a = store.insert(short_page, short_cuts);
    InsertOutcome b = store.insert(long_page, long_cuts);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(b.report.reused_blocks, 2u);
    EXPECT_EQ(b.report.new_blocks, 1u);
    EXPECT_EQ(store.stats().physical_bytes, 900u);
    EXPECT_EQ(to_bytes(store.reconstruct(b.payload).bytes), long_page);
    // Without cuts the 1 MiB block of the long page shares nothing.
    InsertOutcome c = store.insert(long_page);
    EXPECT_EQ(c.report.reused_blocks, 0u);
}

TEST(BlockStore, SegmentsLongerThanBlockSizeAreSplitFromTheCut) {
    BlockStore store(small_blocks(100));
    const Bytes payload(350, 7);
    const std::vector<size_t> cuts{30};
    PreparedPayload p = store.prepare(payload, cuts);
    ASSERT_EQ(p.error, InsertError::None);
    std::vector<size_t> sizes;
    for (const auto& b : p.blocks) {
        sizes.push_back(b.size);
    }
    EXPECT_EQ(sizes, (std::vector<size_t>{30, 100, 100, 100, 20}));
}

TEST(BlockStore, InvalidCutsChangeNothing) {
    BlockStore store(small_blocks(100));
    const Bytes payload(350, 7);
    for (const std::vector<size_t>& cuts :
         std::vector<std::vector<size_t>>{{0}, {350}, {400}, {100, 100}, {200, 100}}) {
        InsertOutcome in = store.insert(payload, cuts);
        EXPECT_EQ(in.error, InsertError::InvalidCuts);
        EXPECT_EQ(store.stats().block_count, 0u);
    }
}

TEST(BlockStore, HashCollisionWithDifferentBytesIsStoredSeparately) {
    BlockStoreOptions o = small_blocks(4);
    o.hasher = &constant_hash;  // every block collides
    BlockStore store(o);
    const Bytes a{1, 1, 1, 1, 2, 2, 2, 2};
    const Bytes b{2, 2, 2, 2, 3, 3, 3, 3};
    InsertOutcome ia = store.insert(a);
    ASSERT_TRUE(ia.ok());
    EXPECT_EQ(ia.report.new_blocks, 2u);
    EXPECT_EQ(ia.report.hash_collisions, 1u);
    InsertOutcome ib = store.insert(b);
    ASSERT_TRUE(ib.ok());
    EXPECT_EQ(ib.report.reused_blocks, 1u);  // {2,2,2,2} confirmed by bytes
    EXPECT_EQ(ib.report.new_blocks, 1u);
    EXPECT_EQ(ib.report.hash_collisions, 1u);
    EXPECT_EQ(store.stats().block_count, 3u);
    EXPECT_EQ(to_bytes(store.reconstruct(ia.payload).bytes), a);
    EXPECT_EQ(to_bytes(store.reconstruct(ib.payload).bytes), b);
    EXPECT_EQ(store.release(ia.payload), ReleaseError::None);
    EXPECT_EQ(to_bytes(store.reconstruct(ib.payload).bytes), b);
    EXPECT_EQ(store.release(ib.payload), ReleaseError::None);
    EXPECT_EQ(store.stats().block_count, 0u);
}

TEST(BlockStore, ReleaseIsValidatedBeforeAnyChange) {
    std::mt19937_64 rng(5);
    BlockStore store(small_blocks(10));
    InsertOutcome in = store.insert(test::random_bytes(rng, 50));
    ASSERT_TRUE(in.ok());
    const BlockStoreStats before = store.stats();

    std::vector<BlockId> with_missing = in.payload.blocks;
    with_missing.push_back(999999);
    EXPECT_EQ(store.release_blocks(with_missing), ReleaseError::MissingBlock);

    std::vector<BlockId> double_release = in.payload.blocks;
    double_release.push_back(in.payload.blocks[2]);
    EXPECT_EQ(store.release_blocks(double_release), ReleaseError::RefcountUnderflow);

    const BlockStoreStats after = store.stats();
    EXPECT_EQ(after.logical_bytes, before.logical_bytes);
    EXPECT_EQ(after.physical_bytes, before.physical_bytes);
    for (BlockId b : in.payload.blocks) {
        EXPECT_EQ(*store.refcount(b), 1u);
    }
    EXPECT_EQ(store.release(in.payload), ReleaseError::None);
    EXPECT_EQ(store.release(in.payload), ReleaseError::MissingBlock);
}

TEST(BlockStore, FailedInsertRollsBack) {
    std::mt19937_64 rng(6);
    BlockStore store(small_blocks(10));
    const Bytes first = test::random_bytes(rng, 30);
    InsertOutcome a = store.insert(first);
    ASSERT_TRUE(a.ok());
    // Second payload shares the first two blocks, then adds three new ones.
    Bytes second(first.begin(), first.begin() + 20);
    const Bytes tail = test::random_bytes(rng, 30);
    second.insert(second.end(), tail.begin(), tail.end());
    const BlockStoreStats before = store.stats();
    const std::vector<BlockId> ids_before = store.block_ids();

    store.debug_fail_next_commit_after(3);  // 2 reused + 1 new, then fail
    InsertOutcome failed = store.insert(second);
    EXPECT_EQ(failed.error, InsertError::InjectedFailure);
    EXPECT_TRUE(failed.payload.blocks.empty());
    EXPECT_EQ(store.stats().logical_bytes, before.logical_bytes);
    EXPECT_EQ(store.stats().physical_bytes, before.physical_bytes);
    EXPECT_EQ(store.block_ids(), ids_before);
    for (BlockId b : a.payload.blocks) {
        EXPECT_EQ(*store.refcount(b), 1u);
    }
    // The hook is one-shot.
    InsertOutcome ok = store.insert(second);
    ASSERT_TRUE(ok.ok());
    EXPECT_EQ(ok.report.reused_blocks, 2u);
}

TEST(BlockStore, CapacityLimitFailsAndRollsBack) {
    std::mt19937_64 rng(7);
    BlockStoreOptions o = small_blocks(10);
    o.max_physical_bytes = 60;
    BlockStore store(o);
    InsertOutcome a = store.insert(test::random_bytes(rng, 40));
    ASSERT_TRUE(a.ok());
    InsertOutcome b = store.insert(test::random_bytes(rng, 40));
    EXPECT_EQ(b.error, InsertError::CapacityExceeded);
    EXPECT_EQ(store.stats().physical_bytes, 40u);
    EXPECT_EQ(store.stats().logical_bytes, 40u);
    EXPECT_EQ(store.stats().block_count, 4u);
}

TEST(BlockStore, CorruptedBytesAreDetected) {
    std::mt19937_64 rng(8);
    for (size_t block_bytes : {size_t{1} << 20, size_t{64}}) {
        BlockStore store(small_blocks(block_bytes));
        const Bytes payload = test::random_bytes(rng, 500);
        InsertOutcome in = store.insert(payload);
        ASSERT_TRUE(in.ok());
        ASSERT_TRUE(store.debug_corrupt_block(in.payload.blocks.back(), 3));
        ReconstructResult r = store.reconstruct(in.payload);
        EXPECT_EQ(r.error, ReconstructError::ChecksumMismatch);
        EXPECT_EQ(r.bytes.size(), 0u);
        std::vector<uint8_t> into;
        EXPECT_EQ(store.snapshot(in.payload)->reconstruct_into(into),
                  ReconstructError::ChecksumMismatch);
        ReconstructResult unchecked = store.reconstruct(in.payload, /*verify=*/false);
        ASSERT_TRUE(unchecked.ok());
        EXPECT_NE(to_bytes(unchecked.bytes), payload);
        EXPECT_FALSE(store.debug_corrupt_block(in.payload.blocks.back(), 1u << 30));
        EXPECT_FALSE(store.debug_corrupt_block(123456, 0));
    }
}

TEST(BlockStore, WrongPayloadMetadataIsDetected) {
    std::mt19937_64 rng(9);
    BlockStore store(small_blocks(10));
    InsertOutcome in = store.insert(test::random_bytes(rng, 30));
    StoredPayload reordered = in.payload;
    std::swap(reordered.blocks[0], reordered.blocks[1]);
    EXPECT_EQ(store.reconstruct(reordered).error, ReconstructError::ChecksumMismatch);
    StoredPayload wrong_size = in.payload;
    wrong_size.size = 29;
    EXPECT_EQ(store.reconstruct(wrong_size).error, ReconstructError::SizeMismatch);
    StoredPayload missing = in.payload;
    missing.blocks.push_back(777777);
    EXPECT_EQ(store.reconstruct(missing).error, ReconstructError::MissingBlock);
}

TEST(BlockStore, EmptyPayload) {
    BlockStore store;
    InsertOutcome in = store.insert(Bytes{});
    ASSERT_TRUE(in.ok());
    EXPECT_TRUE(in.payload.blocks.empty());
    ReconstructResult r = store.reconstruct(in.payload);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r.bytes.size(), 0u);
    EXPECT_EQ(store.release(in.payload), ReleaseError::None);
}

TEST(BlockStore, SnapshotOutlivesRelease) {
    std::mt19937_64 rng(10);
    BlockStore store(small_blocks(16));
    const Bytes payload = test::random_bytes(rng, 100);
    InsertOutcome in = store.insert(payload);
    auto snap = store.snapshot(in.payload);
    ASSERT_TRUE(snap);
    ASSERT_EQ(store.release(in.payload), ReleaseError::None);
    ReconstructResult r = snap->reconstruct();
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(to_bytes(r.bytes), payload);
}

TEST(BlockStore, PrepareInPlaceGivesTheJoinedPayloadsBlocksWithoutACopy) {
    std::mt19937_64 rng(11);
    BlockStore store(small_blocks(100));
    const Bytes payload = test::random_bytes(rng, 350);
    const std::vector<size_t> cuts{30, 250};
    InsertOutcome in = store.insert(payload, cuts);
    ASSERT_TRUE(in.ok());
    const auto snap = store.snapshot(in.payload);
    ASSERT_TRUE(snap);
    ReconstructError error = ReconstructError::MissingBlock;
    const std::optional<PreparedPayload> in_place =
        snap->prepare_in_place(small_blocks(100), cuts, &error);
    EXPECT_EQ(error, ReconstructError::None);
    ASSERT_TRUE(in_place);
    const PreparedPayload joined = store.prepare(payload, cuts);
    EXPECT_EQ(in_place->size, payload.size());
    EXPECT_EQ(in_place->checksum, joined.checksum);
    EXPECT_EQ(in_place->checksum, in.payload.checksum);
    ASSERT_EQ(in_place->blocks.size(), joined.blocks.size());
    const auto parts = snap->parts();
    for (size_t i = 0; i < joined.blocks.size(); ++i) {
        const PreparedPayload::Block& b = in_place->blocks[i];
        EXPECT_EQ(b.offset, joined.blocks[i].offset);
        EXPECT_EQ(b.size, joined.blocks[i].size);
        EXPECT_EQ(b.hash, joined.blocks[i].hash);
        EXPECT_EQ(b.data, parts[i].data());  // the stored block itself
        EXPECT_TRUE(std::equal(b.span().begin(), b.span().end(), payload.begin() + b.offset));
    }
    // A store with other blocks gets none (the caller joins a copy): another block size,
    // other cuts, another hasher.
    BlockStoreOptions other_hash = small_blocks(100);
    other_hash.hasher = &constant_hash;
    for (const auto& [options, other_cuts] :
         std::vector<std::pair<BlockStoreOptions, std::vector<size_t>>>{
             {small_blocks(64), cuts},
             {small_blocks(100), {30}},
             {small_blocks(100), {}},
             {small_blocks(100), {30, 250, 300}},
             {other_hash, cuts}}) {
        error = ReconstructError::MissingBlock;
        EXPECT_FALSE(snap->prepare_in_place(options, other_cuts, &error));
        EXPECT_EQ(error, ReconstructError::None);
    }
    // BlockStore::prepare of the snapshot: the stored blocks where they line up, else a copy
    // joined into the caller's buffer; the same blocks either way.
    for (const size_t block_bytes : {size_t{100}, size_t{64}}) {
        std::vector<uint8_t> buffer;
        error = ReconstructError::MissingBlock;
        const PreparedPayload p =
            BlockStore(small_blocks(block_bytes)).prepare(*snap, cuts, buffer, &error);
        EXPECT_EQ(error, ReconstructError::None);
        const PreparedPayload want = BlockStore(small_blocks(block_bytes)).prepare(payload, cuts);
        EXPECT_EQ(p.checksum, want.checksum);
        ASSERT_EQ(p.blocks.size(), want.blocks.size());
        EXPECT_EQ(p.blocks[1].data, block_bytes == 100 ? parts[1].data() : buffer.data() + 30);
        EXPECT_EQ(buffer.empty(), block_bytes == 100);
    }
    // Bad bytes are an error, not a fallback.
    ASSERT_TRUE(store.debug_corrupt_block(in.payload.blocks[1], 5));
    EXPECT_FALSE(snap->prepare_in_place(small_blocks(100), cuts, &error));
    EXPECT_EQ(error, ReconstructError::ChecksumMismatch);
    for (const size_t block_bytes : {size_t{100}, size_t{64}}) {
        std::vector<uint8_t> buffer;
        error = ReconstructError::None;
        EXPECT_TRUE(BlockStore(small_blocks(block_bytes))
                        .prepare(*snap, cuts, buffer, &error)
                        .blocks.empty());
        EXPECT_EQ(error, ReconstructError::ChecksumMismatch);
    }
}

}  // namespace
}  // namespace skippy::cache
