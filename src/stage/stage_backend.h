// StageBackend: the hooks the scheduler calls during one request's life on a lane:
//   restore (lookup + import) -> prefill suffix, pausing at checkpoint positions ->
//   on_checkpoint (record) -> decode -> on_finish (record) ; make_room before batches.
//
// Thread safety: every hook is called on the scheduler thread, the one thread that owns
// the InferenceContext. Implementations share cache state with other threads (record
// worker, /metrics) only through their own documented locks.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/inference_context.h"

namespace skippy::stage {

using runtime::Pos;
using runtime::SeqId;
using runtime::Token;

// What the stage may know about a request's prompt.
struct PromptInfo {
    std::span<const Token> tokens;
    // Structural record positions (token counts): ends of chat-template messages.
    std::vector<int32_t> message_boundaries;
    std::string cache_namespace;  // tenant key; empty = default namespace
    bool cache_enabled = true;    // per-request opt-out
    // The scheduler will ask for the state at the end of this prompt after the reply
    // (restore_turn_start) to record the canonical end of the turn.
    bool track_turn_end = false;
};

struct RestoreResult {
    int32_t n_restored = 0;  // prompt tokens now present in the lane
    std::string decision = "miss";
};

class StageBackend {
  public:
    virtual ~StageBackend() = default;

    // Sequence ids beyond the lanes that the stage needs in the context (resident cache).
    virtual uint32_t spare_sequences() const = 0;
    // Called once, after the context exists, with the first spare sequence id.
    virtual void attach(runtime::InferenceContext& context, SeqId first_spare_seq,
                        uint32_t n_lanes) = 0;

    // Restores the longest cached prefix of the prompt into the empty lane. Must leave the
    // lane either holding exactly `n_restored` prompt tokens or empty (n_restored = 0).
    virtual RestoreResult restore(runtime::InferenceContext& context, SeqId lane,
                                  const PromptInfo& prompt) = 0;

    // Ascending token counts in (n_restored, prompt size] where the prefill must pause so
    // that on_checkpoint can export the lane state exactly there.
    virtual std::vector<int32_t> checkpoint_positions(const PromptInfo& prompt,
                                                      int32_t n_restored) = 0;
    virtual void on_checkpoint(runtime::InferenceContext& context, SeqId lane,
                               const PromptInfo& prompt, int32_t n_tokens) = 0;

    // The request completed; the lane holds `lane_tokens` (prompt + decoded reply tokens).
    virtual void on_finish(runtime::InferenceContext& context, SeqId lane,
                           std::span<const Token> lane_tokens, const PromptInfo& prompt) = 0;

    // Before a decode that needs `n_cells` free KV cells; may evict resident entries.
    virtual void make_room(runtime::InferenceContext& context, uint32_t n_cells) = 0;
    // A decode found no KV slot: evict one more entry. False when nothing is evictable.
    virtual bool evict_for_space(runtime::InferenceContext& context) = 0;

    // End-of-turn recording for stateful payloads: after the reply, the scheduler puts the
    // lane back to the state at the end of the prompt (kept at its checkpoint) and prefills
    // the conversation as the next request will render it, in canonical chunks, so the
    // checkpoint at the end of the assistant message is bit-identical to a cold prefill.
    virtual bool tracks_turn_end() const { return false; }

    // Lanes keep their state after a request: the scheduler does not clear a finished lane,
    // it tells the stage which of its tokens were prefilled canonically (`retained`, empty
    // when the lane was cleared), and restore() may reuse that state in place. restore()
    // must then leave the lane empty or holding exactly the restored prefix.
    virtual bool keeps_lane_state() const { return false; }
    virtual void lane_released(SeqId /*lane*/, std::span<const Token> /*retained*/) {}
    virtual bool restore_turn_start(runtime::InferenceContext& /*context*/, SeqId /*lane*/,
                                    const PromptInfo& /*prompt*/) {
        return false;
    }
};

// The stage used when the prefix cache is off: every request is a miss.
class NoCacheStage final : public StageBackend {
  public:
    uint32_t spare_sequences() const override { return 0; }
    void attach(runtime::InferenceContext&, SeqId, uint32_t) override {}
    RestoreResult restore(runtime::InferenceContext&, SeqId, const PromptInfo&) override {
        return {};
    }
    std::vector<int32_t> checkpoint_positions(const PromptInfo&, int32_t) override { return {}; }
    void on_checkpoint(runtime::InferenceContext&, SeqId, const PromptInfo&, int32_t) override {}
    void on_finish(runtime::InferenceContext&, SeqId, std::span<const Token>,
                   const PromptInfo&) override {}
    void make_room(runtime::InferenceContext&, uint32_t) override {}
    bool evict_for_space(runtime::InferenceContext&) override { return false; }
};

}  // namespace skippy::stage
