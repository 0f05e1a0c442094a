// BlockMemory: large blocks in their own mappings, a freed one reused by the next block of
// the same page count, idle mappings bounded and trimmed.
#include "cache/block_memory.h"

#include <gtest/gtest.h>

#include <cstring>

namespace skippy::cache {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(BlockMemoryTest, ReusesAFreedMappingOfTheSameSize) {
    BlockMemory memory(
        BlockMemoryOptions{.min_mapped_bytes = 64 << 10, .max_idle_bytes = 8 * kMiB});
    auto a = memory.allocate(kMiB);
    std::memset(a.get(), 0xab, kMiB);  // writable, all of it
    const uint8_t* where = a.get();
    EXPECT_EQ(memory.stats().maps, 1u);
    EXPECT_EQ(memory.stats().mapped_bytes, kMiB);
    a.reset();
    EXPECT_EQ(memory.stats().idle_bytes, kMiB);
    auto b = memory.allocate(kMiB);
    EXPECT_EQ(b.get(), where);
    EXPECT_EQ(memory.stats().reuses, 1u);
    EXPECT_EQ(memory.stats().maps, 1u);
    EXPECT_EQ(memory.stats().idle_bytes, 0u);
    // Another page count: a mapping of its own (a larger idle one is not handed out).
    b.reset();
    auto c = memory.allocate(kMiB - 8192);
    EXPECT_NE(c.get(), where);
    EXPECT_EQ(memory.stats().maps, 2u);
    EXPECT_EQ(memory.stats().mapped_bytes, 2 * kMiB - 8192);
}

TEST(BlockMemoryTest, SmallBlocksComeFromMalloc) {
    BlockMemory memory(BlockMemoryOptions{.min_mapped_bytes = 64 << 10, .max_idle_bytes = kMiB});
    auto a = memory.allocate(1000);
    ASSERT_NE(a.get(), nullptr);
    std::memset(a.get(), 1, 1000);
    EXPECT_EQ(memory.stats().maps, 0u);
    EXPECT_EQ(memory.stats().mapped_bytes, 0u);
}

TEST(BlockMemoryTest, IdleMappingsAreBoundedAndTrimmedOldestFirst) {
    BlockMemory memory(
        BlockMemoryOptions{.min_mapped_bytes = 64 << 10, .max_idle_bytes = 2 * kMiB});
    auto a = memory.allocate(kMiB);
    auto b = memory.allocate(kMiB);
    auto c = memory.allocate(kMiB);
    const uint8_t* newest = c.get();
    a.reset();
    b.reset();
    c.reset();  // over the bound: the oldest idle one is unmapped
    EXPECT_EQ(memory.stats().idle_bytes, 2 * kMiB);
    EXPECT_EQ(memory.stats().mapped_bytes, 2 * kMiB);
    memory.trim_idle(kMiB);
    EXPECT_EQ(memory.stats().idle_bytes, kMiB);
    EXPECT_EQ(memory.allocate(kMiB).get(), newest);  // the newest stayed
    memory.trim_idle(0);
    EXPECT_EQ(memory.stats().idle_bytes, 0u);
    EXPECT_EQ(memory.stats().mapped_bytes, 0u);
}

}  // namespace
}  // namespace skippy::cache
