// BackgroundWork: one thread for work that no response waits for (the next turn's
// chat-template render), with a bounded queue: when it is full the work is dropped (it only
// saves later work).
//
// Thread safety: post() may be called from any thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "server/api/openai_request.h"

namespace skippy::server {

class BackgroundWork {
  public:
    BackgroundWork() : thread_([this] { run(); }) {}
    ~BackgroundWork() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
        }
        ready_.notify_all();
        thread_.join();
    }
    // The next turn's renders of a chat request whose first choice replied `reply`.
    void post_next_turn(const ParsedRequest& parsed, const std::string& reply) {
        if (parsed.prepare_next_turn) {
            post([prepare = parsed.prepare_next_turn, reply] { prepare(reply); });
        }
    }
    void post(std::function<void()> work) {
        if (!work) {
            return;
        }
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (stopping_ || queue_.size() >= kCapacity) {
                return;
            }
            queue_.push_back(std::move(work));
        }
        ready_.notify_one();
    }

  private:
    static constexpr size_t kCapacity = 64;
    void run() {
        std::unique_lock<std::mutex> lock(mutex_);
        for (;;) {
            ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
            if (stopping_) {
                return;
            }
            auto work = std::move(queue_.front());
            queue_.pop_front();
            lock.unlock();
            try {
                work();
            } catch (...) {
            }
            lock.lock();
        }
    }
    std::mutex mutex_;
    std::condition_variable ready_;
    std::deque<std::function<void()>> queue_;
    bool stopping_ = false;
    std::thread thread_;
};

}  // namespace skippy::server
