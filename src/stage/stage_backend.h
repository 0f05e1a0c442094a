// StageBackend: one request's life on a lane against the prefix cache. The scheduler asks
// for a lane (affinity), then for a plan (the stage restores the prefix while planning),
// executes it (prefill chunks, checkpoints, decode), and hands the lane back when the
// request (and, for chat, the canonical end of its turn) is done:
//
//   lane = choose_lane(idle, prompt)          -> the idle lane that holds most of the prompt
//   plan = plan(ctx, lane, prompt)            -> restore + chunk ends + checkpoints
//   checkpoint(ctx, lane, prompt, n)          -> at each plan.checkpoints position
//   prefilled(lane, n)                        -> at each chunk end of the prompt
//   (between steps) waits_for_peer / hold_for_peer / hold_point: a queued request that
//   shares a head with a busy lane waits for it, and that lane pauses where it is copied
//   ... decode the reply ...
//   plan = begin_turn_end(ctx, lane, prompt, turn, max_chunk); if (plan.n_restored >= 0)
//       prefill turn[plan.n_restored, end) in its chunks    -> checkpoint() at its checkpoints
//   release(ctx, lane, canonical)             -> records what is new; the lane keeps it
//
// Thread safety: every hook runs on the scheduler thread, the one thread that owns the
// InferenceContext. Implementations share cache state with other threads (record worker,
// /metrics) only through their own documented locks and never wait on them.
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
    // The scheduler will prefill the end of this turn after the reply (chat requests).
    bool turn_end_follows = false;
};

class StageBackend {
  public:
    virtual ~StageBackend() = default;

    virtual void attach(runtime::InferenceContext& context, uint32_t n_lanes) = 0;
    // One of `idle` (not empty) for this prompt.
    virtual SeqId choose_lane(std::span<const SeqId> idle, const PromptInfo& prompt) = 0;
    // Restores the best cached prefix into `lane` and plans the prefill of the rest. The
    // lane holds exactly plan.n_restored prompt tokens afterwards.
    virtual Plan plan(runtime::InferenceContext& context, SeqId lane, const PromptInfo& prompt,
                      int32_t max_chunk) = 0;
    // The prefill of the prompt reached `n_tokens` (every chunk end; not for turn ends).
    virtual void prefilled(SeqId /*lane*/, int32_t /*n_tokens*/) {}
    // Whether a queued request should wait before it is given a lane: a busy lane is
    // prefilling a longer prefix of its prompt than anything cached has, or one of the
    // requests given a lane in this same step (`starting`) will, and it can copy that prefix
    // once it is there instead of computing it again (checked each scheduler step).
    virtual bool waits_for_peer(const PromptInfo& /*prompt*/,
                                std::span<const std::span<const Token>> /*starting*/) const {
        return false;
    }
    // Pauses for waiting requests (models with recurrent state, whose state exists only where
    // a prefill pauses): before each step the scheduler clears them, then calls hold_for_peer
    // for each request that waits and could be given a lane; during the step a lane's prefill
    // stops when it reaches hold_point(lane) (-1: none), splitting a chunk there if needed
    // (the stage holds a lane only where both halves are exact chunks), so that the waiting
    // request copies the lane's state at that point before the step after.
    virtual void clear_holds() {}
    virtual void hold_for_peer(const PromptInfo& /*prompt*/) {}
    virtual int32_t hold_point(SeqId /*lane*/) const { return -1; }
    // The prefill reached plan checkpoint `n_tokens`.
    virtual void checkpoint(runtime::InferenceContext& /*context*/, SeqId /*lane*/,
                            const PromptInfo& /*prompt*/, int32_t /*n_tokens*/) {}
    // End of turn: the reply is out; put the lane back to a prefilled position (the end of
    // the prompt, or earlier so that the chunk is long enough to be exact) from which the
    // scheduler prefills `turn` (the conversation as the next request will render it).
    // Returns the plan for that: n_restored = that position (-1 = no end-of-turn work),
    // chunk ends up to turn.size() of at most `max_chunk` tokens, checkpoints.
    virtual Plan begin_turn_end(runtime::InferenceContext& /*context*/, SeqId /*lane*/,
                                const PromptInfo& /*prompt*/, std::span<const Token> /*turn*/,
                                int32_t /*max_chunk*/) {
        Plan none;
        none.n_restored = -1;
        return none;
    }
    // The lane is free again. Its first `canonical.size()` tokens are `canonical` and were
    // prefilled (their state is exact); anything after them was decoded. `turn_end`: the
    // lane's state is exactly the end of a turn (canonical holds all of it).
    virtual void release(runtime::InferenceContext& context, SeqId lane, const PromptInfo& prompt,
                         std::span<const Token> canonical, bool turn_end) = 0;
    // The request failed or was cancelled: forget the lane's state.
    virtual void discard(runtime::InferenceContext& context, SeqId lane) {
        context.seq_clear(lane);
    }
    // The prompt is prefilled and its first token sampled; the lane state is still exactly
    // the end of the prompt (the sampled token is not decoded yet).
    virtual void prompt_done(runtime::InferenceContext& /*context*/, SeqId /*lane*/,
                             const PromptInfo& /*prompt*/) {}
    // Any thread (the HTTP thread that submits the request), before the request is queued:
    // may bring a longer cached prefix up from a slower tier (disk I/O happens here, never
    // on the scheduler thread).
    virtual void prefetch(const PromptInfo& /*prompt*/) {}
    // Scheduler thread: requests are computing (true) or the scheduler went idle (false);
    // background I/O may wait for the idle side.
    virtual void set_busy(bool /*busy*/) {}
    // Deferred work (records) the stage would like to do while no request is running.
    virtual bool has_idle_work() { return false; }
    virtual void idle(runtime::InferenceContext& /*context*/) {}
    // Whether end-of-turn work is worth doing for this request.
    virtual bool wants_turn_end(const PromptInfo& /*prompt*/) const { return false; }
};

// The stage used when the prefix cache is off: every request is a miss on an empty lane.
class NoCacheStage final : public StageBackend {
  public:
    void attach(runtime::InferenceContext&, uint32_t) override {}
    SeqId choose_lane(std::span<const SeqId> idle, const PromptInfo&) override {
        return idle.front();
    }
    Plan plan(runtime::InferenceContext& context, SeqId lane, const PromptInfo& prompt,
              int32_t max_chunk) override {
        context.seq_clear(lane);
        Plan p;
        p.decision = CacheDecision::Off;
        p.miss_reason = "cache_off";
        const auto rule = ExactRule::for_model(context.flash_attn(),
                                               context.model().kind() != runtime::ModelKind::Dense);
        const auto n = static_cast<int32_t>(prompt.tokens.size());
        p.chunk_ends = plan_chunks(0, n, {}, max_chunk, rule.body_min,
                                   rule.body_end(n, prompt.message_boundaries));
        return p;
    }
    void release(runtime::InferenceContext& context, SeqId lane, const PromptInfo&,
                 std::span<const Token>, bool) override {
        context.seq_clear(lane);
    }
};

}  // namespace skippy::stage
