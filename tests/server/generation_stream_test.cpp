// GenerationStream: the consumer wakes when the producer pushes, not on its timeout.
#include "server/schedule/generation_stream.h"

#include <gtest/gtest.h>

#include <atomic>
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

// The first-output handoff: after the first delta of a streamed response, the producer
// waits until the consumer has written it (or the limit), and only then.
TEST(GenerationStream, TheProducerWaitsForTheFirstWriteOfAStreamedResponse) {
    GenerationStream stream;
    stream.expect_handoff();
    std::atomic<bool> written{false};
    std::thread consumer([&] {
        auto events = stream.take_all(milliseconds(60000));
        std::this_thread::sleep_for(milliseconds(20));  // the write
        written = true;
        stream.handed_off();
    });
    stream.push_delta("a", {1});
    const auto start = steady_clock::now();
    stream.await_handoff(std::chrono::seconds(60));
    const auto waited = steady_clock::now() - start;
    EXPECT_TRUE(written.load());                  // not before the write
    EXPECT_LT(waited, std::chrono::seconds(30));  // woken by it, not by the limit
    consumer.join();
    // Once per stream: the next delta does not wait.
    stream.push_delta("b", {2});
    const auto again = steady_clock::now();
    stream.await_handoff(std::chrono::seconds(60));
    EXPECT_LT(steady_clock::now() - again, std::chrono::seconds(30));
}

TEST(GenerationStream, HandoffIsBoundedAndOnlyForStreamsThatAskForIt) {
    GenerationStream plain;  // a non-streamed response: never waits
    plain.push_delta("a", {1});
    auto start = steady_clock::now();
    plain.await_handoff(std::chrono::seconds(60));
    EXPECT_LT(steady_clock::now() - start, std::chrono::seconds(30));

    GenerationStream silent;  // streamed, but the consumer never writes: the limit ends it
    silent.expect_handoff();
    silent.push_delta("a", {1});
    start = steady_clock::now();
    silent.await_handoff(std::chrono::milliseconds(5));
    EXPECT_GE(steady_clock::now() - start, std::chrono::milliseconds(5));
    start = steady_clock::now();
    silent.await_handoff(std::chrono::seconds(60));  // once per stream
    EXPECT_LT(steady_clock::now() - start, std::chrono::seconds(30));
}

}  // namespace
}  // namespace skippy::server
