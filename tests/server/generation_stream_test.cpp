// GenerationStream: the consumer wakes when the producer pushes, not on its timeout.
#include "server/generation_stream.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace skippy::server {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

TEST(GenerationStream, WaiterWakesOnPushLongBeforeItsTimeout) {
    GenerationStream stream;
    std::thread producer([&] {
        std::this_thread::sleep_for(milliseconds(20));
        stream.push_delta("a", {1});
    });
    const auto start = steady_clock::now();
    auto events = stream.take_all(milliseconds(60000));
    const auto waited = steady_clock::now() - start;
    producer.join();
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events.front().text, "a");
    EXPECT_LT(waited, std::chrono::seconds(30));  // woken by the push, not the timeout
}

TEST(GenerationStream, TakeAllReturnsTheWholeBurstInOrder) {
    GenerationStream stream;
    stream.push_delta("a", {1});
    stream.push_delta("b", {2});
    GenerationStats stats;
    stats.finish_reason = "stop";
    stream.finish(stats);
    stream.push_delta("after the end", {3});  // dropped: the stream is closed
    auto events = stream.take_all(milliseconds(0));
    ASSERT_EQ(events.size(), 3u);
    EXPECT_EQ(events[0].text, "a");
    EXPECT_EQ(events[1].text, "b");
    EXPECT_EQ(events[2].kind, StreamEvent::Kind::Done);
    EXPECT_TRUE(stream.take_all(milliseconds(1)).empty());
    EXPECT_TRUE(stream.closed());
}

TEST(GenerationStream, TimeoutWithoutEventsIsEmpty) {
    GenerationStream stream;
    EXPECT_TRUE(stream.take_all(milliseconds(5)).empty());
    EXPECT_FALSE(stream.next(milliseconds(5)).has_value());
}

}  // namespace
}  // namespace skippy::server
