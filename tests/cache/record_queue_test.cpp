#include "cache/record_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <thread>

#include "cache/exact_record_job.h"
#include "cache/exact_state_cache.h"
#include "cache/prefix_identity.h"
#include "test_util.h"

namespace skippy::cache {
namespace {

using namespace std::chrono_literals;

// A job that blocks the worker until `gate` is released.
struct Gate {
    std::promise<void> started;
    std::promise<void> open;
    std::shared_future<void> opened{open.get_future().share()};
    RecordJob job(PageId page) {
        return RecordJob{page, [this] {
                             started.set_value();
                             opened.wait();
                             return true;
                         }};
    }
};

RecordJob ok_job(PageId page, std::atomic<int>* runs = nullptr) {
    return RecordJob{page, [runs] {
                         if (runs) {
                             ++*runs;
                         }
                         return true;
                     }};
}

TEST(RecordQueue, RunsJobsAndCounts) {
    RecordQueue q;
    std::atomic<int> runs{0};
    EXPECT_EQ(q.submit(ok_job(PageId(1), &runs)), Admission::Queued);
    EXPECT_EQ(q.submit(ok_job(PageId(2), &runs)), Admission::Queued);
    q.wait_idle();
    EXPECT_EQ(runs.load(), 2);
    const RecordQueueCounters c = q.counters();
    EXPECT_EQ(c.queued, 2u);
    EXPECT_EQ(c.completed, 2u);
    EXPECT_EQ(c.pending, 0u);
    EXPECT_EQ(c.dropped, 0u);
    EXPECT_FALSE(q.in_flight(PageId(1)));
    EXPECT_EQ(q.capacity(), 4u);
}

TEST(RecordQueue, FullQueueDropsWithoutBlocking) {
    RecordQueue q({.capacity = 2});
    Gate gate;
    ASSERT_EQ(q.submit(gate.job(PageId(100))), Admission::Queued);
    gate.started.get_future().wait();  // worker busy, queue empty
    EXPECT_EQ(q.submit(ok_job(PageId(1))), Admission::Queued);
    EXPECT_EQ(q.submit(ok_job(PageId(2))), Admission::Queued);
    EXPECT_EQ(q.probe(PageId(3)), Admission::DroppedFull);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(q.submit(ok_job(PageId(3))), Admission::DroppedFull);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 100ms);
    EXPECT_EQ(q.counters().pending, 3u);
    gate.open.set_value();
    q.wait_idle();
    const RecordQueueCounters c = q.counters();
    EXPECT_EQ(c.dropped_full, 1u);
    EXPECT_EQ(c.dropped, 1u);
    EXPECT_EQ(c.completed, 3u);
}

TEST(RecordQueue, SamePageIsNotRecordedTwiceAtOnce) {
    RecordQueue q;
    Gate gate;
    ASSERT_EQ(q.submit(gate.job(PageId(7))), Admission::Queued);
    gate.started.get_future().wait();
    EXPECT_TRUE(q.in_flight(PageId(7)));  // running counts as in flight
    EXPECT_EQ(q.submit(ok_job(PageId(7))), Admission::AlreadyInFlight);
    EXPECT_EQ(q.submit(ok_job(PageId(8))), Admission::Queued);
    EXPECT_EQ(q.submit(ok_job(PageId(8))), Admission::AlreadyInFlight);  // queued
    gate.open.set_value();
    q.wait_idle();
    EXPECT_EQ(q.counters().dropped_in_flight, 2u);
    EXPECT_EQ(q.submit(ok_job(PageId(7))), Admission::Queued);  // finished: allowed again
    q.wait_idle();
}

TEST(RecordQueue, FailingJobsAreCountedAndWorkerKeepsRunning) {
    RecordQueue q;
    q.submit(RecordJob{PageId(1), []() -> bool { throw std::runtime_error("boom"); }});
    q.submit(RecordJob{PageId(2), [] { return false; }});
    q.submit(RecordJob{PageId(3), nullptr});
    std::atomic<int> runs{0};
    q.submit(ok_job(PageId(4), &runs));
    q.wait_idle();
    EXPECT_EQ(runs.load(), 1);
    EXPECT_EQ(q.counters().failed, 3u);
    EXPECT_EQ(q.counters().completed, 1u);
}

TEST(RecordQueue, StopDrainsOrDrops) {
    {
        RecordQueue q;
        std::atomic<int> runs{0};
        for (int i = 0; i < 4; ++i) {
            q.submit(ok_job(PageId(static_cast<uint64_t>(i)), &runs));
        }
        q.stop(/*drain=*/true);
        EXPECT_EQ(runs.load(), 4);
        EXPECT_EQ(q.submit(ok_job(PageId(9))), Admission::WorkerStopped);
        EXPECT_EQ(q.probe(PageId(9)), Admission::WorkerStopped);
        EXPECT_EQ(q.counters().dropped_stopped, 1u);
        q.wait_idle();  // returns after stop
    }
    {
        RecordQueue q({.capacity = 4});
        Gate gate;
        q.submit(gate.job(PageId(100)));
        gate.started.get_future().wait();
        std::atomic<int> runs{0};
        q.submit(ok_job(PageId(1), &runs));
        q.submit(ok_job(PageId(2), &runs));
        std::thread opener([&] {
            std::this_thread::sleep_for(20ms);
            gate.open.set_value();
        });
        q.stop(/*drain=*/false);
        opener.join();
        EXPECT_EQ(runs.load(), 0);
        const RecordQueueCounters c = q.counters();
        EXPECT_EQ(c.dropped_stopped, 2u);
        EXPECT_EQ(c.completed, 1u);
        EXPECT_EQ(c.pending, 0u);
        EXPECT_FALSE(q.in_flight(PageId(1)));
    }
}

TEST(RecordQueue, ExactRecordJobInsertsIntoCache) {
    ExactStateCacheOptions o;
    o.blocks.block_bytes = 128;
    ExactStateCache cache(o);
    RecordQueue q;
    const NamespaceId ns = test::test_namespace();
    std::mt19937_64 rng(5);
    const std::vector<Token> tokens = test::iota_tokens(256);
    const PageId page = prefix_identity(ns, 0, tokens).page_id();
    ExactRecordPayload p;
    p.ns = ns;
    p.tokens = tokens;
    p.page = page;
    p.bytes = test::random_bytes(rng, 1000);
    p.descriptor.kind = PayloadKind::KvPages;
    p.descriptor.token_end = 256;
    p.descriptor.layer_end = 8;
    p.descriptor.kv_bytes = 800;
    p.descriptor.recurrent_bytes = 200;
    p.descriptor.payload_bytes = 1000;
    p.cuts = {400, 800};
    std::atomic<int> done_calls{0};
    ASSERT_EQ(q.submit(make_exact_record_job(cache, p,
                                             [&](const ExactInsertResult& r) {
                                                 EXPECT_TRUE(r.stored());
                                                 ++done_calls;
                                             })),
              Admission::Queued);
    q.wait_idle();
    EXPECT_TRUE(cache.contains(ns, tokens, page));
    // Recording the same page again is a cheap success (already present).
    ASSERT_EQ(q.submit(make_exact_record_job(cache, p)), Admission::Queued);
    q.wait_idle();
    EXPECT_EQ(q.counters().completed, 2u);
    EXPECT_EQ(done_calls.load(), 1);
    // An invalid descriptor fails the job.
    p.page = PageId(1);
    p.descriptor.payload_bytes = 5;
    ASSERT_EQ(q.submit(make_exact_record_job(cache, p)), Admission::Queued);
    q.wait_idle();
    EXPECT_EQ(q.counters().failed, 1u);
}

TEST(RecordQueue, RequestPathSkipsWhenCacheIsBusy) {
    // The request path asks try_contains; with the cache locked it gets Unknown at once
    // and skips recording instead of waiting.
    ExactStateCache cache;
    RecordQueue q;
    const NamespaceId ns = test::test_namespace();
    const std::vector<Token> tokens = test::iota_tokens(100);
    const PageId page = prefix_identity(ns, 0, tokens).page_id();
    std::promise<void> locked, release;
    std::thread holder([&] {
        auto lock = cache.debug_lock();
        locked.set_value();
        release.get_future().wait();
    });
    locked.get_future().wait();
    const auto start = std::chrono::steady_clock::now();
    bool submitted = false;
    if (cache.try_contains(ns, tokens, page) == Presence::Absent &&
        q.probe(page) == Admission::Queued) {
        submitted = true;
    }
    const auto elapsed = std::chrono::steady_clock::now() - start;
    release.set_value();
    holder.join();
    EXPECT_FALSE(submitted);
    EXPECT_LT(elapsed, 100ms);
    EXPECT_EQ(cache.try_contains(ns, tokens, page), Presence::Absent);
}

}  // namespace
}  // namespace skippy::cache
