// PrefixCacheStage: the exact prefix cache wired into one request's life.
//
//   restore:  lookup identities longest first -> exact-state hit (import payload into the
//             lane) or resident hit (seq_cp from the cache sequence) -> else miss. Runs as
//             a transaction: on any failure the lane is cleared and the request prefills
//             normally; bad stored bytes quarantine the entry.
//   record:   resident-kv: at the end of a request the lane's tokens are copied into a
//             spare cache sequence. kv-recurrent / full-state: at checkpoint positions
//             (record ladder + chat-message boundaries + end of turn) the state is exported
//             and handed to the bounded record queue; never blocks the request.
//   evict:    resident entries are dropped before a batch that would not fit.
//
// Thread safety: the StageBackend hooks run on the scheduler thread (which owns the
// InferenceContext). The caches are shared with the record worker and /metrics through
// their own internal mutexes; the request path only uses try_lock-based presence checks
// before exporting, so it never waits for the record worker.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/candidate_policy.h"
#include "cache/exact_record_job.h"
#include "cache/exact_state_cache.h"
#include "cache/namespace_id.h"
#include "cache/record_queue.h"
#include "cache/resident_cache.h"
#include "runtime/model.h"
#include "stage/cache_config.h"
#include "stage/cache_telemetry.h"
#include "stage/stage_backend.h"
#include "stage/state_payload.h"

namespace skippy::stage {

enum class ActivePayload { ResidentKv, KvRecurrent, FullState };
const char* active_payload_name(ActivePayload payload);

class PrefixCacheStage final : public StageBackend {
  public:
    PrefixCacheStage(const CacheConfig& config, const runtime::Model& model,
                     const runtime::ContextOptions& context, ActivePayload payload);
    ~PrefixCacheStage() override;

    uint32_t spare_sequences() const override;
    void attach(runtime::InferenceContext& context, SeqId first_spare_seq,
                uint32_t n_lanes) override;
    RestoreResult restore(runtime::InferenceContext& context, SeqId lane,
                          const PromptInfo& prompt) override;
    std::vector<int32_t> checkpoint_positions(const PromptInfo& prompt,
                                              int32_t n_restored) override;
    void on_checkpoint(runtime::InferenceContext& context, SeqId lane, const PromptInfo& prompt,
                       int32_t n_tokens) override;
    void on_finish(runtime::InferenceContext& context, SeqId lane,
                   std::span<const Token> lane_tokens, const PromptInfo& prompt) override;
    void make_room(runtime::InferenceContext& context, uint32_t n_cells) override;
    bool evict_for_space(runtime::InferenceContext& context) override;
    bool tracks_turn_end() const override;
    bool keeps_lane_state() const override;
    void lane_released(SeqId lane, std::span<const Token> retained) override;
    bool restore_turn_start(runtime::InferenceContext& context, SeqId lane,
                            const PromptInfo& prompt) override;

    std::string metrics_text() const;
    ActivePayload payload() const { return payload_; }
    // Test hooks: the caches and the queue.
    cache::ExactStateCache* exact_cache() { return exact_.get(); }
    cache::ResidentCache* resident_cache() { return resident_.get(); }
    cache::RecordQueue* record_queue() { return queue_.get(); }
    cache::NamespaceId namespace_for(const std::string& key) const;

  private:
    RestoreResult restore_into_lane(runtime::InferenceContext& context, SeqId lane,
                                    const PromptInfo& prompt);
    bool lookups_enabled(const PromptInfo& prompt) const;
    bool records_enabled(const PromptInfo& prompt) const;
    RestoreResult restore_exact(runtime::InferenceContext& context, SeqId lane,
                                const PromptInfo& prompt, const cache::NamespaceId& ns,
                                LookupEvent& event);
    RestoreResult restore_resident(runtime::InferenceContext& context, SeqId lane,
                                   const PromptInfo& prompt, const cache::NamespaceId& ns,
                                   LookupEvent& event);
    void record_exact(runtime::InferenceContext& context, SeqId lane, std::span<const Token> tokens,
                      const cache::NamespaceId& ns);
    void drop_sequences(runtime::InferenceContext& context, const std::vector<int32_t>& seqs);

    CacheConfig config_;
    const runtime::Model& model_;
    ActivePayload payload_;
    cache::CandidatePolicy policy_;
    cache::IdentityFields base_fields_;
    PayloadLayout layout_;
    uint32_t n_ctx_ = 0;
    uint32_t n_lanes_ = 0;
    std::unique_ptr<cache::ExactStateCache> exact_;
    std::unique_ptr<cache::RecordQueue> queue_;
    std::unique_ptr<cache::ResidentCache> resident_;
    std::vector<int32_t> lane_shared_tokens_;  // per lane: cells shared with a resident entry
    std::vector<std::vector<uint8_t>> turn_start_state_;  // per lane: state at the prompt end
    // Per idle lane: tokens whose state the lane still holds, prefilled canonically (the
    // attention KV of a prefix of them can be kept and only the recurrent state imported).
    std::vector<std::vector<Token>> retained_tokens_;
    // Records handed to the queue but maybe not inserted yet, so that the very next request
    // of a conversation (an agent's immediate follow-up) can restore them already.
    // Scheduler thread only; bounded; entries leave once the cache holds them.
    // Shared with the queued job (no copy of the bytes).
    std::deque<std::shared_ptr<const cache::ExactRecordPayload>> recent_records_;
    bool import_payload(runtime::InferenceContext& context, SeqId lane,
                        std::span<const uint8_t> bytes, const cache::PayloadDescriptor& descriptor,
                        size_t n_tokens, std::string& reason, bool in_place);
    std::unique_ptr<CacheTelemetry> telemetry_;
};

}  // namespace skippy::stage
