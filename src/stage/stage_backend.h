// StageBackend: one request's life on a lane against the prefix cache, as data. The stage
// decides (which lane, what to restore, where chunks end, where to checkpoint, where a lane
// pauses, whether the end of the turn is worth prefilling); the scheduler executes those
// plans and reports what happened. Nothing else is exchanged and no hook has to be called
// in an order the scheduler must know:
//
//   per request
//     lane = choose_lane(idle, prompt)            the idle lane that holds most of the prompt
//     plan = plan(ctx, lane, prompt, max_chunk)   restore + chunk ends + checkpoints + turn_end
//     report(ctx, lane, prompt, {ChunkDone, n})   after every chunk of the plan it executes
//     report(ctx, lane, prompt, {PromptDone, n})  the prompt is in, its first token sampled
//     ... decode the reply ...
//     if (plan.turn_end) plan = plan_turn_end(ctx, lane, prompt, turn, max_chunk)
//                                                 n_restored < 0: nothing to do; else its
//                                                 chunks are executed and reported the same way
//     finish(ctx, lane, prompt, {how, canonical}) the lane is free (or its state is lost)
//   per scheduler step
//     waits_for_peer(prompt, starting)            a queued request waits for a busy lane
//     holds = pauses(waiting)                     where busy lanes stop in this step
//   background
//     prefetch(prompt)                            any thread, before the request is queued
//     set_busy / has_idle_work / idle             deferred records while nothing runs
//
// Thread safety: every hook but prefetch() runs on the scheduler thread, the one thread that
// owns the InferenceContext. Implementations share cache state with other threads (record
// worker, /metrics, prefetch) only through their own documented locks and never wait on them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/inference_context.h"
#include "stage/plan.h"

namespace skippy::stage {

using runtime::Pos;
using runtime::SeqId;
using runtime::Token;

// What the stage may know about a request's prompt.
struct PromptInfo {
    std::span<const Token> tokens;
    // Token counts where chat-template messages end (and where the generation prompt before
    // each earlier assistant message ends): where the next request of an agent or a chat
    // diverges, so where checkpoints pay off.
    std::vector<int32_t> message_boundaries;
    std::string cache_namespace;  // tenant key; empty = default namespace
    std::string routing_key;      // prompt_cache_key: lane affinity only, not a namespace
    bool cache_enabled = true;    // per-request opt-out
    // The scheduler can render the end of this turn after the reply (chat requests); the
    // plan says whether it will (Plan::turn_end).
    bool renders_turn_end = false;
};

// What the scheduler did with a plan (StageBackend::report).
struct LaneReport {
    enum class What : uint8_t {
        // A prefill chunk of the current plan ended at n_tokens (of the prompt, or of the
        // turn for an end-of-turn plan); `checkpoint`: the plan listed n_tokens there.
        ChunkDone,
        // The prompt (n_tokens) is prefilled and its first token sampled, not decoded yet:
        // the lane is exactly at the prompt end.
        PromptDone,
    };
    What what = What::ChunkDone;
    int32_t n_tokens = 0;
    bool turn_end = false;  // the chunk belongs to an end-of-turn plan
    bool checkpoint = false;
};

// How a request left its lane (StageBackend::finish).
struct LaneFinish {
    enum class How : uint8_t {
        // The lane is free; its first canonical.size() tokens are `canonical` and were
        // prefilled (their state is exact); anything after them was decoded.
        Released,
        // The same, and the lane's state is exactly the end of a turn (all of canonical).
        TurnEnd,
        // The request failed or was cancelled, or a plan did not add up: forget the lane.
        Failed,
    };
    How how = How::Released;
    std::span<const Token> canonical;
};

class StageBackend {
  public:
    virtual ~StageBackend() = default;

    // Once, before any request: binds the stage to the scheduler's context (its exactness
    // rule comes from the context's attention kernel and model family).
    void attach(runtime::InferenceContext& context, uint32_t n_lanes) {
        rule_ = ExactRule::for_model(context.flash_attn(),
                                     context.model().kind() != runtime::ModelKind::Dense);
        attached(context, n_lanes);
    }
    const ExactRule& rule() const { return rule_; }
    // A plan that prefills all of `prompt` from an empty lane (a miss; the scheduler's
    // fallback when a restore failed or a plan did not add up).
    Plan full_prefill(const PromptInfo& prompt, int32_t max_chunk) const {
        Plan p;
        p.chunk_ends = rule_.chunks(0, static_cast<int32_t>(prompt.tokens.size()),
                                    prompt.message_boundaries, max_chunk);
        return p;
    }

    // ---- per request ----
    // One of `idle` (not empty) for this prompt.
    virtual SeqId choose_lane(std::span<const SeqId> idle, const PromptInfo& prompt) = 0;
    // Restores the best cached prefix into `lane` and plans the prefill of the rest. The
    // lane holds exactly plan.n_restored prompt tokens afterwards.
    virtual Plan plan(runtime::InferenceContext& context, SeqId lane, const PromptInfo& prompt,
                      int32_t max_chunk) = 0;
    // End of turn (only when plan.turn_end): the reply is out; put the lane back to a
    // prefilled position (the end of the prompt, or earlier so that the chunk is long enough
    // to be exact) from which the scheduler prefills `turn` (the conversation as the next
    // request will render it). n_restored = that position (-1 = no end-of-turn work), chunk
    // ends up to turn.size() of at most `max_chunk` tokens, checkpoints.
    virtual Plan plan_turn_end(runtime::InferenceContext& /*context*/, SeqId /*lane*/,
                               const PromptInfo& /*prompt*/, std::span<const Token> /*turn*/,
                               int32_t /*max_chunk*/) {
        Plan none;
        none.n_restored = -1;
        return none;
    }
    virtual void report(runtime::InferenceContext& /*context*/, SeqId /*lane*/,
                        const PromptInfo& /*prompt*/, const LaneReport& /*what*/) {}
    virtual void finish(runtime::InferenceContext& context, SeqId lane, const PromptInfo& prompt,
                        const LaneFinish& how) = 0;

    // ---- per scheduler step ----
    // Whether a queued request should wait before it is given a lane: a busy lane is
    // prefilling a longer prefix of its prompt than anything cached has, or one of the
    // requests given a lane in this same step (`starting`) will, and it can copy that prefix
    // once it is there instead of computing it again.
    virtual bool waits_for_peer(const PromptInfo& /*prompt*/,
                                std::span<const std::span<const Token>> /*starting*/) const {
        return false;
    }
    // Before each step, for the requests that wait and could be given a lane (head of the
    // queue first): where each lane's prefill stops in this step (indexed by lane; -1 or
    // missing: nowhere), splitting a chunk there if needed (the stage pauses a lane only
    // where both halves are exact chunks). Models with recurrent state have it only where a
    // prefill pauses, so a waiting request copies the lane's state at that point.
    virtual std::vector<int32_t> pauses(std::span<const PromptInfo> /*waiting*/) { return {}; }

    // ---- background ----
    // Any thread (the HTTP thread that submits the request), before the request is queued:
    // may bring a longer cached prefix up from a slower tier (disk and network I/O happen
    // here, never on the scheduler thread).
    virtual void prefetch(const PromptInfo& /*prompt*/) {}
    // Requests are computing (true) or the scheduler went idle (false); background I/O may
    // wait for the idle side.
    virtual void set_busy(bool /*busy*/) {}
    // Deferred work (records) the stage would like to do while no request is running.
    virtual bool has_idle_work() { return false; }
    virtual void idle(runtime::InferenceContext& /*context*/) {}

  protected:
    virtual void attached(runtime::InferenceContext& /*context*/, uint32_t /*n_lanes*/) {}
    ExactRule rule_;  // plan.h's exactness rule for the attached context
};

// The stage used when the prefix cache is off: every request is a miss on an empty lane.
class NoCacheStage final : public StageBackend {
  public:
    SeqId choose_lane(std::span<const SeqId> idle, const PromptInfo&) override {
        return idle.front();
    }
    Plan plan(runtime::InferenceContext& context, SeqId lane, const PromptInfo& prompt,
              int32_t max_chunk) override {
        context.seq_clear(lane);
        Plan p = full_prefill(prompt, max_chunk);
        p.decision = CacheDecision::Off;
        p.miss_reason = "cache_off";
        return p;
    }
    void finish(runtime::InferenceContext& context, SeqId lane, const PromptInfo&,
                const LaneFinish&) override {
        context.seq_clear(lane);
    }
};

}  // namespace skippy::stage
