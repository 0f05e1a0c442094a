// GenerationStream: the channel between the scheduler thread (producer) and the HTTP
// handler thread that waits for one request's output (consumer).
//
// Thread safety: all methods are safe to call concurrently; one mutex guards the event queue.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/model.h"

namespace skippy::server {

struct GenerationStats {
    int32_t prompt_tokens = 0;
    int32_t cached_tokens = 0;      // prompt tokens restored from the prefix cache
    int32_t completion_tokens = 0;  // reply tokens (a final end-of-generation token is not counted)
    std::string finish_reason;      // "stop" or "length"
    std::string stop_sequence;      // the stop string that ended the reply ("" for none)
    std::string cache_decision;     // exact_hit / resident_hit / miss / off ...
    std::string cache_tier;         // where a hit came from: lane / ram / disk ("none": no hit)
    std::string miss_reason;        // no hit: why (never_seen, evicted, below_min_tokens, ...)
    std::string miss_tier;          // evicted / quarantined: the tier that lost it ("none")
    int32_t diverged_at = -1;       // prompt tokens before the first difference with the
                                    // nearest cached prefix of the tenant (-1: no lookup)
    double queue_ms = 0;
    double restore_ms = 0;  // choosing and restoring the cached prefix (the stage's plan)
    double time_to_first_token_ms = 0;
    double total_ms = 0;
};

// Prompt processing progress (llama-server's `prompt_progress`): prompt tokens in all,
// restored from the cache, in the lane so far (restored + prefilled), and the time since
// the request got its lane.
struct PromptProgress {
    int32_t total = 0;
    int32_t cache = 0;
    int32_t processed = 0;
    int64_t time_ms = 0;
};

struct StreamEvent {
    enum class Kind { Delta, Done, Error, Progress };
    Kind kind = Kind::Delta;
    PromptProgress progress;             // Progress
    std::string text;                    // Delta: new text; Done: the whole reply
    std::vector<runtime::Token> tokens;  // Delta: tokens that produced it
    GenerationStats stats;               // Done
    int http_status = 500;               // Error
    std::string error_type;              // Error
    std::string error_message;           // Error
};

class GenerationStream {
  public:
    // ---- producer side (scheduler thread) ----
    void push_delta(std::string text, std::vector<runtime::Token> tokens);
    void push_progress(const PromptProgress& progress);
    void finish(const GenerationStats& stats, std::string reply = {});
    void fail(int http_status, std::string type, std::string message);

    // ---- consumer side (HTTP thread) ----
    // Waits up to `timeout` for the next event; nullopt on timeout. Wakes as soon as the
    // producer pushes (condition variable), the timeout only bounds how long the consumer
    // goes without a chance to look at its client (disconnect detection).
    std::optional<StreamEvent> next(std::chrono::milliseconds timeout);
    // Like next(), but takes every queued event at once (a burst of tokens costs one wake-up
    // and one write); empty on timeout.
    std::deque<StreamEvent> take_all(std::chrono::milliseconds timeout);
    // ---- first-output handoff (streamed responses) ----
    // A streamed response writes each delta to its client as soon as its handler takes it.
    // After the first delta the producer gives that handler the CPU for the write (up to
    // `limit`) before it starts the next decode step: while every core decodes, the woken
    // handler waits for a time slice (0.1-7 ms measured on 2 cores), and that wait is the
    // client's time to first token. Once per stream; a no-op unless expect_handoff() was
    // called (a non-streamed response writes only at the end).
    void expect_handoff();                                // consumer, before submitting
    void handed_off();                                    // consumer, after a write
    void await_handoff(std::chrono::microseconds limit);  // producer, after pushing a delta

    // The client went away: the scheduler frees the lane at its next iteration.
    void cancel() { cancelled_.store(true, std::memory_order_relaxed); }

    bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }
    bool closed() const;

  private:
    void push(StreamEvent event);
    mutable std::mutex mutex_;
    std::condition_variable ready_;
    std::deque<StreamEvent> events_;
    bool closed_ = false;
    std::condition_variable handoff_;
    bool handoff_expected_ = false;
    bool handed_off_ = false;
    std::atomic<bool> cancelled_{false};
};

}  // namespace skippy::server
