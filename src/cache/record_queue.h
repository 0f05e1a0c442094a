// RecordQueue: a bounded queue with one worker thread that runs record jobs (hash, dedupe,
// insert, evict) off the request path. Admission never waits for the worker.
//
//   RecordQueue queue({.capacity = 4});
//   // request thread, after deciding to record (see ExactStateCache::try_contains):
//   if (queue.probe(page) == Admission::Queued) {              // cheap pre-check
//       std::vector<uint8_t> bytes = runtime.export_state(...); // only if admitted
//       Admission a = queue.submit({page, make_exact_record_job(cache, ...)});
//   }
//   queue.counters().dropped_full;  // telemetry
//
// A job is a page id plus a closure returning true on success; a closure that returns
// false or throws is counted as failed and the worker keeps running. A page id is "in
// flight" from admission until its job finished; a second submit of it answers
// AlreadyInFlight. submit()/probe() take only the queue's own short internal lock (never
// held while a job runs) and never block on a full queue: they answer DroppedFull.
//
// stop(drain=true) finishes queued jobs, stop(drain=false) drops them (counted as
// dropped); both join the worker. The destructor calls stop(true).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "cache/page_id.h"

namespace skippy::cache {

enum class Admission : uint8_t { Queued, DroppedFull, WorkerStopped, AlreadyInFlight };
const char* to_string(Admission admission);

struct RecordJob {
    PageId page;
    std::function<bool()> run;  // true = completed, false/throw = failed
};

struct RecordQueueOptions {
    size_t capacity = 4;  // queued jobs, not counting the one running
};

struct RecordQueueCounters {
    uint64_t queued = 0;   // admitted in total
    uint64_t dropped = 0;  // dropped_full + dropped_in_flight + dropped_stopped
    uint64_t dropped_full = 0;
    uint64_t dropped_in_flight = 0;
    uint64_t dropped_stopped = 0;  // submitted after stop, or discarded by stop(false)
    uint64_t completed = 0;
    uint64_t failed = 0;
    size_t pending = 0;  // queued or running now
};

class RecordQueue {
  public:
    explicit RecordQueue(RecordQueueOptions options = {});
    ~RecordQueue();
    RecordQueue(const RecordQueue&) = delete;
    RecordQueue& operator=(const RecordQueue&) = delete;

    Admission submit(RecordJob job);
    // What submit() would answer now, without queueing anything.
    Admission probe(PageId page) const;
    bool in_flight(PageId page) const;

    // Blocks until no job is queued or running (tests, shutdown, flush points).
    void wait_idle();
    void stop(bool drain = true);

    RecordQueueCounters counters() const;
    size_t capacity() const { return options_.capacity; }

  private:
    Admission admission_locked(PageId page) const;
    void worker_loop();

    const RecordQueueOptions options_;
    mutable std::mutex mu_;
    std::condition_variable work_cv_;
    std::condition_variable idle_cv_;
    std::deque<RecordJob> queue_;
    std::unordered_set<PageId, PageIdHash> in_flight_;
    bool stopping_ = false;
    bool drain_ = true;
    bool running_job_ = false;
    bool worker_done_ = false;
    RecordQueueCounters counters_;
    std::mutex join_mu_;
    std::thread worker_;  // last: started after everything above is initialized
};

}  // namespace skippy::cache
