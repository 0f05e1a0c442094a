// Scheduler: owns the InferenceContext on one thread and runs continuous batching over
// `lanes` request lanes (sequence ids 0..lanes-1, each its own KV stream). Every iteration
// it admits queued requests to idle lanes (the stage picks the lane that holds most of the
// prompt and returns a plan: what it restored, where prefill chunks end, where to take
// checkpoints), then runs one llama_decode with the decode steps of all generating lanes,
// then prefill chunks (one lane per llama_decode, so a chunk is never split or mixed with
// other lanes' tokens: plan.h's exactness rule), samples, streams and finishes requests.
// After a chat reply, the lane prefills the conversation as the next request will render it
// (the end of the turn) at the lowest priority, once the server has been idle for a while
// (an agent that sends its next request at once would otherwise race that work for the
// cores while its request is parsed; its prompt then restores the prompt end and prefills
// the reply with the new messages); that work yields to waiting requests.
//
// Thread safety: submit(), stats() and stop() may be called from any thread; they touch
// only the admission queue under `queue_mutex_` (and submit() the stage's thread-safe
// prefetch, before queueing). Everything else runs on the scheduler thread, which is the
// only thread that calls into the InferenceContext or the stage's other hooks.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "runtime/inference_context.h"
#include "runtime/sampler.h"
#include "server/schedule/generation_stream.h"
#include "stage/stage_backend.h"

namespace skippy::server {

struct GenerationRequest {
    std::vector<runtime::Token> prompt;
    int32_t max_tokens = 256;
    runtime::SamplingParams sampling;
    std::vector<std::string> stop;
    bool ignore_eos = false;
    std::vector<int32_t> message_boundaries;  // where chat-template messages end
    // Tenant key (API key and cache_salt): requests of different tenants never share state.
    std::string cache_namespace;
    // Routing hint (OpenAI's prompt_cache_key): requests with the same key prefer the lane
    // the last one used; it never separates cached state.
    std::string routing_key;
    bool cache_enabled = true;
    // Streamed requests that asked for it (return_progress): prompt processing progress
    // events, at the start and after every prefill chunk.
    bool return_progress = false;
    // Chat requests: tokens of the conversation with `reply` appended as the assistant
    // message, as the next request of this conversation will render it.
    std::function<std::vector<runtime::Token>(const std::string& reply)> render_turn_end;
    // Called on the scheduler thread with the logits each token is sampled from (tests of
    // exactness compare them bitwise; logprobs can build on it).
    std::function<void(std::span<const float> logits)> on_logits;
    // Called on the scheduler thread with each sampled token (including a final
    // end-of-generation token), right after on_logits: the span it got is still valid.
    std::function<void(runtime::Token token)> on_sampled;
    // Tokens of the output format (a chat template's tool-call markers) whose text is
    // generated even when they are special tokens; sorted.
    std::vector<runtime::Token> preserved_tokens;
};

struct SchedulerOptions {
    uint32_t lanes = 4;
    runtime::ContextOptions context;  // n_seq_max = lanes; n_ctx = all lanes' cells
    uint32_t max_queue_depth = 64;    // requests waiting for a lane beyond this are refused
    std::chrono::milliseconds queue_timeout{60000};
};

struct SchedulerStats {
    uint32_t lanes = 0;
    uint32_t lanes_busy = 0;
    uint32_t queued = 0;
    uint64_t requests_completed = 0;
    uint64_t requests_cancelled = 0;
    uint64_t requests_failed = 0;
    uint64_t requests_rejected = 0;
    uint64_t prompt_tokens = 0;
    uint64_t cached_tokens = 0;
    uint64_t completion_tokens = 0;
    uint64_t decode_calls = 0;
    uint32_t turn_ends_deferred = 0;  // lanes whose end of turn waits for an idle moment
};

enum class Admission { Accepted, QueueFull, Stopped };

class Scheduler {
  public:
    Scheduler(const runtime::Model& model, SchedulerOptions options,
              std::unique_ptr<stage::StageBackend> stage);
    ~Scheduler();
    Scheduler(const Scheduler&) = delete;
    Scheduler& operator=(const Scheduler&) = delete;

    // Never blocks on inference. The stream receives the output or an error.
    Admission submit(GenerationRequest request, std::shared_ptr<GenerationStream> stream);
    SchedulerStats stats() const;
    void stop();

    uint32_t n_ctx() const { return n_ctx_; }  // cells of one lane (a request's context)
    const SchedulerOptions& options() const { return options_; }
    stage::StageBackend& stage() { return *stage_; }

  private:
    struct Pending;
    struct Slot;
    void run();
    void admit_pending(std::deque<Pending>& pending);
    bool start_slot(Slot& slot, Pending&& pending);
    void step();
    void decode_steps();
    void prefill_chunk(Slot& slot);
    // The lane is free again; its first `canonical` tokens of `tokens` were prefilled.
    void release_slot(Slot& slot, size_t canonical, bool turn_end);
    void finish_slot(Slot& slot, const std::string& finish_reason);
    void fail_slot(Slot& slot, int status, const std::string& type, const std::string& message);
    void free_slot(Slot& slot);  // the slot's bookkeeping; the lane's state is the stage's
    // The request failed or its plan did not add up: the stage forgets the lane's state.
    void forget_lane(Slot& slot);
    void sample_slot(Slot& slot, int32_t batch_index);
    bool start_turn_end(Slot& slot, const std::string& reply);
    // Runs one deferred end of turn (the server is idle); false when there is none.
    bool start_deferred_turn_end();
    // True when `prompt` continues a conversation whose lane is still recording its turn.
    bool continues_post_turn(const std::vector<runtime::Token>& prompt) const;
    // The stage would rather have the request wait for a busy lane's prefill (its prefix),
    // or for one of the requests starting in this step.
    // Before a step: pauses of busy lanes for the requests that wait to copy them (holds_).
    void hold_for_waiting();
    int32_t hold_at(runtime::SeqId lane) const;  // -1: the lane does not pause in this step
    bool waits_for_peer(const GenerationRequest& request,
                        const std::deque<Pending>& starting) const;
    // Ends turn-end work that holds a lane a waiting request needs.
    void yield_post_turn();
    void notify_prompt_done(Slot& slot);
    // A PromptProgress event when the request asked for them.
    void send_progress(Slot& slot);

    const runtime::Model& model_;
    SchedulerOptions options_;
    std::unique_ptr<stage::StageBackend> stage_;
    std::unique_ptr<runtime::InferenceContext> context_;
    uint32_t n_ctx_ = 0;
    std::vector<std::unique_ptr<Slot>> slots_;
    std::vector<int32_t> holds_;  // scheduler thread: this step's pauses, by lane

    mutable std::mutex queue_mutex_;
    std::condition_variable queue_cv_;
    std::deque<Pending> incoming_;
    bool stopping_ = false;
    bool foreground_busy_ = false;  // scheduler thread: last set_busy() told the stage
    bool yield_lock_free_ = false;  // scheduler thread: turn-end work must yield a lane
    std::atomic<uint32_t> lanes_busy_{0};
    std::atomic<uint32_t> queued_{0};
    // Counters written by the scheduler thread, read by stats().
    std::atomic<uint64_t> completed_{0}, cancelled_{0}, failed_{0}, rejected_{0};
    std::atomic<uint64_t> prompt_tokens_{0}, cached_tokens_{0}, completion_tokens_{0};
    std::atomic<uint64_t> decode_calls_{0};
    std::atomic<uint32_t> turn_ends_deferred_{0};
    std::thread thread_;
};

}  // namespace skippy::server
