#include "stage/buffer_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

namespace skippy::stage {
namespace {

TEST(BufferPool, TakeReusesTheSmallestIdleBufferThatFits) {
    auto pool = std::make_shared<BufferPool>(1 << 20, 4);
    std::vector<uint8_t> big(4096, 1);
    std::vector<uint8_t> small(1024, 2);
    const uint8_t* big_data = big.data();
    const uint8_t* small_data = small.data();
    pool->give(std::move(big));
    pool->give(std::move(small));
    EXPECT_EQ(pool->idle_bytes(), 4096u + 1024u);
    std::vector<uint8_t> a = pool->take(1000);
    EXPECT_EQ(a.size(), 1000u);
    EXPECT_EQ(a.data(), small_data);  // the smallest that fits, not the big one
    std::vector<uint8_t> b = pool->take(3000);
    EXPECT_EQ(b.data(), big_data);
    EXPECT_EQ(pool->idle_bytes(), 0u);
    std::vector<uint8_t> c = pool->take(1000);  // nothing idle: a new buffer, with headroom
    EXPECT_EQ(c.size(), 1000u);
    EXPECT_GE(c.capacity(), 1250u);
    const uint8_t* c_data = c.data();
    pool->give(std::move(c));
    EXPECT_EQ(pool->take(1200).data(), c_data);  // a state grown a little fits it
}

TEST(BufferPool, TakeEmptyGivesTheLargestCapacityForAppending) {
    auto pool = std::make_shared<BufferPool>(1 << 20, 4);
    std::vector<uint8_t> big(8192, 1);
    const uint8_t* data = big.data();
    pool->give(std::vector<uint8_t>(100, 3));
    pool->give(std::move(big));
    std::vector<uint8_t> out = pool->take_empty();
    EXPECT_TRUE(out.empty());
    EXPECT_GE(out.capacity(), 8192u);
    out.insert(out.end(), 8192, 7);  // appends into the recycled pages
    EXPECT_EQ(out.data(), data);
}

TEST(BufferPool, BoundsDropTheSmallestIdleBuffers) {
    auto pool = std::make_shared<BufferPool>(10000, 2);
    pool->give(std::vector<uint8_t>(1000));
    pool->give(std::vector<uint8_t>(3000));
    pool->give(std::vector<uint8_t>(2000));  // three idle > 2 buffers: the 1000 one goes
    EXPECT_EQ(pool->idle_bytes(), 5000u);
    pool->give(std::vector<uint8_t>(20000));  // over the byte bound by itself: not kept
    EXPECT_EQ(pool->idle_bytes(), 5000u);
    pool->give(std::vector<uint8_t>(9000));  // 14000 > 10000: smallest dropped until it fits
    EXPECT_EQ(pool->idle_bytes(), 9000u);
    EXPECT_EQ(pool->take(8000).capacity(), 9000u);
}

TEST(BufferPool, TrimIdleAndCappedHeadroom) {
    auto pool = std::make_shared<BufferPool>(1 << 20, 8);
    pool->give(std::vector<uint8_t>(1000));
    pool->give(std::vector<uint8_t>(3000));
    pool->give(std::vector<uint8_t>(2000));
    pool->trim_idle(4000);  // the smallest go first: 1000, then 2000
    EXPECT_EQ(pool->idle_bytes(), 3000u);
    pool->trim_idle(0);
    EXPECT_EQ(pool->idle_bytes(), 0u);
    EXPECT_EQ(pool->take(1000, 1100).capacity(), 1100u);  // headroom within the cap
    EXPECT_GE(pool->take(1000, 10).capacity(), 1000u);    // never below the size
}

TEST(BufferPool, SharedBufferReturnsWhenTheLastOwnerDrops) {
    auto pool = std::make_shared<BufferPool>(1 << 20, 4);
    std::vector<uint8_t> buf(512, 9);
    const uint8_t* data = buf.data();
    auto shared = pool->share(std::move(buf));
    auto copy = shared;
    EXPECT_EQ((*shared)[0], 9);
    shared.reset();
    EXPECT_EQ(pool->idle_bytes(), 0u);  // still owned
    copy.reset();
    EXPECT_EQ(pool->idle_bytes(), 512u);
    EXPECT_EQ(pool->take(512).data(), data);
}

TEST(BufferPool, SharedBufferOutlivingThePoolIsFreed) {
    auto pool = std::make_shared<BufferPool>(1 << 20, 4);
    auto shared = pool->share(std::vector<uint8_t>(64, 1));
    pool.reset();
    shared.reset();  // no pool to give it to: freed (ASan checks for a leak or a bad free)
}

TEST(BufferPool, ConcurrentTakeAndGiveKeepTheAccounting) {
    auto pool = std::make_shared<BufferPool>(1 << 24, 8);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&pool, t] {
            for (int i = 0; i < 2000; ++i) {
                std::vector<uint8_t> b = pool->take(static_cast<size_t>(1024 * (1 + (i + t) % 7)));
                b[0] = static_cast<uint8_t>(i);
                if (i % 3 == 0) {
                    auto s = pool->share(std::move(b));
                } else {
                    pool->give(std::move(b));
                }
            }
        });
    }
    for (auto& th : threads) {
        th.join();
    }
    size_t sum = 0;
    std::vector<std::vector<uint8_t>> drained;
    while (pool->idle_bytes() > 0) {
        drained.push_back(pool->take_empty());
        sum += drained.back().capacity();
        ASSERT_LE(drained.size(), 8u);
    }
    EXPECT_LE(sum, size_t{1} << 24);
}

}  // namespace
}  // namespace skippy::stage
