#include "cache/record_queue.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace skippy::cache {

const char* to_string(Admission admission) {
    switch (admission) {
        case Admission::Queued:
            return "queued";
        case Admission::DroppedFull:
            return "dropped_full";
        case Admission::WorkerStopped:
            return "worker_stopped";
        case Admission::AlreadyInFlight:
            return "already_in_flight";
    }
    return "?";
}

RecordQueue::RecordQueue(RecordQueueOptions options) : options_(options) {
    worker_ = std::thread([this] { worker_loop(); });
}

RecordQueue::~RecordQueue() { stop(true); }

Admission RecordQueue::admission_locked(PageId page) const {
    if (stopping_) {
        return Admission::WorkerStopped;
    }
    if (in_flight_.count(page) != 0) {
        return Admission::AlreadyInFlight;
    }
    if (queue_.size() >= options_.capacity) {
        return Admission::DroppedFull;
    }
    return Admission::Queued;
}

Admission RecordQueue::submit(RecordJob job) {
    Admission a;
    {
        std::lock_guard lock(mu_);
        a = admission_locked(job.page);
        switch (a) {
            case Admission::Queued:
                in_flight_.insert(job.page);
                queue_.push_back(std::move(job));
                ++counters_.queued;
                ++counters_.pending;
                break;
            case Admission::DroppedFull:
                ++counters_.dropped_full;
                ++counters_.dropped;
                break;
            case Admission::AlreadyInFlight:
                ++counters_.dropped_in_flight;
                ++counters_.dropped;
                break;
            case Admission::WorkerStopped:
                ++counters_.dropped_stopped;
                ++counters_.dropped;
                break;
        }
    }
    if (a == Admission::Queued) {
        work_cv_.notify_one();
    }
    return a;
}

Admission RecordQueue::probe(PageId page) const {
    std::lock_guard lock(mu_);
    return admission_locked(page);
}

bool RecordQueue::in_flight(PageId page) const {
    std::lock_guard lock(mu_);
    return in_flight_.count(page) != 0;
}

void RecordQueue::worker_loop() {
    // Recording must never slow down the requests that produced the state: on a machine
    // with as many compute threads as cores, the worker runs at a lower priority (Linux
    // threads have their own nice value).
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
    pthread_setname_np(pthread_self(), "skippy-record");  // (top -H, perf)
    std::unique_lock lock(mu_);
    for (;;) {
        work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty() || (stopping_ && !drain_)) {
            if (stopping_) {
                break;
            }
            continue;
        }
        RecordJob job = std::move(queue_.front());
        queue_.pop_front();
        running_job_ = true;
        lock.unlock();

        bool ok = false;
        try {
            ok = job.run ? job.run() : false;
        } catch (...) {
            ok = false;
        }
        job.run = nullptr;  // destroy captured state outside the lock

        lock.lock();
        running_job_ = false;
        in_flight_.erase(job.page);
        --counters_.pending;
        if (ok) {
            ++counters_.completed;
        } else {
            ++counters_.failed;
        }
        if (queue_.empty()) {
            idle_cv_.notify_all();
        }
    }
    // Discard what is left (stop without drain).
    for (const RecordJob& job : queue_) {
        in_flight_.erase(job.page);
        --counters_.pending;
        ++counters_.dropped_stopped;
        ++counters_.dropped;
    }
    queue_.clear();
    worker_done_ = true;
    idle_cv_.notify_all();
}

void RecordQueue::wait_idle() {
    std::unique_lock lock(mu_);
    idle_cv_.wait(lock, [&] { return (queue_.empty() && !running_job_) || worker_done_; });
}

void RecordQueue::stop(bool drain) {
    {
        std::lock_guard lock(mu_);
        if (!stopping_) {
            stopping_ = true;
            drain_ = drain;
        }
    }
    work_cv_.notify_all();
    std::lock_guard join_lock(join_mu_);
    if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) {
        worker_.join();
    }
}

RecordQueueCounters RecordQueue::counters() const {
    std::lock_guard lock(mu_);
    return counters_;
}

}  // namespace skippy::cache
