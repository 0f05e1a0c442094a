// PrefixCacheStage: the exact prefix cache wired into one request's life on a lane, for
// every model family (dense, hybrid, recurrent), with one payload kind: KV token-range
// pages, plus the recurrent state exactly at the checkpoint where the model has one.
//
//   choose_lane  lane affinity: the idle lane (of the same namespace) whose state covers
//                the longest prefix of the prompt; else an empty or least recently used one.
//   plan         restore, longest first, from: the lane itself (no copy; dense lanes are
//                trimmed to the common prefix, hybrid/recurrent lanes only when their
//                recurrent state sits exactly there), a peer lane, the lane's attention KV
//                plus a stored recurrent checkpoint, or a stored entry imported in full. Runs
//                as a transaction: on any failure the lane is cleared, bad stored bytes are
//                quarantined, and the request prefills normally. Then the prefill chunks
//                (plan.h's exactness rule) and, for hybrid/recurrent models, checkpoints:
//                the recurrent state is exported exactly there (a small partial export,
//                when report() says the prefill reached one).
//   plan_turn_end  after a chat reply: the lane back to an exact position, the rest of the
//                turn in body chunks.
//   finish       released: notes what can be hit and is not stored yet: message boundaries
//                new in this request, the prompt end - 2 for requests without an end of
//                turn, and the end of the turn (hybrid/recurrent: also the prompt end, where
//                the next request restores when the client sends back a different reply).
//                The lane keeps its state for the next request, so the export is deferred
//                until that state is about to be replaced or the scheduler is idle; then the
//                scheduler thread makes one copy of the lane state (llama.cpp's export) and
//                paging, hashing, dedupe and insertion run on the record worker. Failed:
//                the lane forgets everything.
//
// Files: prefix_cache_stage.cpp (construction, lane choice, plan, reports, end of turn),
// prefix_cache_restore.cpp (restore and miss reasons), prefix_cache_peer.cpp (peer lanes,
// waits and pauses), prefix_cache_records.cpp (release and deferred records),
// prefix_cache_prefetch.cpp (disk and Redis promotion), prefix_cache_metrics.cpp.
//
// Thread safety: the StageBackend hooks run on the scheduler thread (which owns the
// InferenceContext). The exact-state cache and the record queue have their own mutexes and
// are shared with the record worker and /metrics; the scheduler thread only uses try_lock
// presence checks before exporting and never waits for the record worker. Lane states are
// scheduler-thread only.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cache/candidate_policy.h"
#include "cache/disk_store.h"
#include "cache/exact_state_cache.h"
#include "cache/namespace_id.h"
#include "cache/record_queue.h"
#include "cache/redis_store.h"
#include "runtime/model.h"
#include "server/observe/metrics_writer.h"
#include "stage/buffer_pool.h"
#include "stage/cache_config.h"
#include "stage/cache_telemetry.h"
#include "stage/stage_backend.h"
#include "stage/state_payload.h"

namespace skippy::stage {

class PrefixCacheStage final : public StageBackend {
  public:
    PrefixCacheStage(const CacheConfig& config, const runtime::Model& model,
                     const runtime::ContextOptions& context, cache::PayloadKind payload);
    ~PrefixCacheStage() override;

    SeqId choose_lane(std::span<const SeqId> idle, const PromptInfo& prompt) override;
    Plan plan(runtime::InferenceContext& context, SeqId lane, const PromptInfo& prompt,
              int32_t max_chunk) override;
    Plan plan_turn_end(runtime::InferenceContext& context, SeqId lane, const PromptInfo& prompt,
                       std::span<const Token> turn, int32_t max_chunk) override;
    void report(runtime::InferenceContext& context, SeqId lane, const PromptInfo& prompt,
                const LaneReport& what) override;
    void finish(runtime::InferenceContext& context, SeqId lane, const PromptInfo& prompt,
                const LaneFinish& how) override;
    bool waits_for_peer(const PromptInfo& prompt,
                        std::span<const std::span<const Token>> starting) const override;
    std::vector<int32_t> pauses(std::span<const PromptInfo> waiting) override;
    void prefetch(const PromptInfo& prompt) override;
    void set_busy(bool busy) override;
    bool has_idle_work() override;
    void idle(runtime::InferenceContext& context) override;
    // Lanes whose records still wait for their export (any thread; tests wait for 0).
    size_t lanes_pending() const { return lanes_pending_.load(std::memory_order_acquire); }
    // Bytes of captured states charged to the record queue (0 once the queue is idle).
    uint64_t queued_bytes() const { return queued_bytes_->load(); }

    std::string metrics_text() const;
    void write_metrics(metrics::MetricsWriter& out) const;
    cache::PayloadKind payload() const { return layout_.kind; }

    // ---- inspection (any thread; GET/DELETE /v1/cache, the dashboard) ----
    struct EntryView {
        cache::PageId page;
        size_t tokens = 0;
        uint64_t bytes = 0;  // payload bytes (before dedupe across entries)
        bool in_ram = false;
        bool on_disk = false;
        uint64_t hits = 0;
        int64_t stored_unix_ms = 0;
        int64_t last_hit_unix_ms = 0;
    };
    struct NamespaceView {
        cache::NamespaceId ns;
        std::vector<EntryView> entries;  // longest first
        uint64_t tokens = 0;
        uint64_t bytes = 0;
    };
    // Every namespace with stored entries (RAM and disk merged by page id), or only `only`.
    std::vector<NamespaceView> inventory(const cache::NamespaceId* only = nullptr) const;
    // Drops every entry of the namespace from RAM and disk; lanes holding its state stop
    // serving it (applied by the scheduler thread before its next lane choice). Returns
    // the entries removed.
    size_t flush_namespace(const cache::NamespaceId& ns);
    struct MemoryView {
        uint64_t ram_bytes = 0;  // unique block bytes
        uint64_t ram_logical_bytes = 0;
        uint64_t ram_budget = 0;  // --cache-max-bytes less the record queue's share
        size_t ram_entries = 0;
        size_t max_entries = 0;
        bool disk = false;
        bool disk_read_only = false;
        uint64_t disk_bytes = 0;
        uint64_t disk_budget = 0;
        size_t disk_entries = 0;
        size_t disk_queue = 0;
        bool redis = false;  // the shared tier is configured
        bool redis_up = false;
        size_t redis_queue = 0;
        uint64_t queue_bytes = 0;
        uint64_t queue_budget = 0;
        size_t queue_pending = 0;
        size_t queue_capacity = 0;
        size_t lane_tokens = 0;
        size_t lanes_pending = 0;
    };
    MemoryView memory() const;
    const CacheTelemetry& telemetry() const { return *telemetry_; }
    uint32_t min_tokens() const { return static_cast<uint32_t>(policy_.min_tokens); }
    // Test hooks.
    cache::ExactStateCache* exact_cache() { return exact_.get(); }
    cache::DiskStore* disk_store() { return disk_.get(); }
    // Start-up note about the disk tier (opened, read-only, locked by another process...).
    const std::string& disk_note() const { return disk_note_; }
    // The shared Redis tier (null: none), and its start-up note (empty when not configured).
    cache::RedisStore* redis_store() { return redis_.get(); }
    const std::string& redis_note() const { return redis_note_; }
    cache::RecordQueue* record_queue() { return queue_.get(); }
    cache::NamespaceId namespace_for(const std::string& key) const;
    // Forgets what the lanes hold (so the next restore comes from the stored entries). Any
    // thread: the scheduler thread applies it before it next picks a lane.
    void debug_forget_lanes();

  protected:
    void attached(runtime::InferenceContext& context, uint32_t n_lanes) override;

  private:
    // The recurrent state at n_tokens of the lane's prefill, kept as a lane checkpoint
    // (plan.checkpoints; hybrid/recurrent only).
    void take_checkpoint(runtime::InferenceContext& context, SeqId lane, const PromptInfo& prompt,
                         int32_t n_tokens);
    // The prompt is prefilled and its first token sampled (LaneReport::PromptDone).
    void prompt_done(runtime::InferenceContext& context, SeqId lane, const PromptInfo& prompt);
    // finish(): the lane is free and keeps `canonical` (release), or forgets it (discard).
    void release(runtime::InferenceContext& context, SeqId lane, const PromptInfo& prompt,
                 std::span<const Token> canonical, bool turn_end);
    void discard(runtime::InferenceContext& context, SeqId lane);
    // Miss reasons (prefix_cache_restore.cpp): the longest prefix of the prompt the tenant
    // has anywhere, and why nothing was restored.
    int32_t diverged_at(const PromptInfo& prompt, const cache::NamespaceId& ns) const;
    std::string why_missed(const PromptInfo& prompt, const cache::NamespaceId& ns, int32_t limit,
                           LookupEvent& event) const;
    // The longest head `tokens` shares with what another lane runs or holds (same namespace).
    int32_t shared_head(SeqId lane, const cache::NamespaceId& ns,
                        std::span<const Token> tokens) const;
    // The lane's recurrent state (partial-only export; all of it without attention), in a
    // recycled buffer. Null if llama.cpp wrote nothing.
    std::shared_ptr<const std::vector<uint8_t>> export_recurrent(runtime::InferenceContext& context,
                                                                 SeqId lane);
    struct Checkpoint {
        int32_t n_tokens = 0;
        // Partial-only export at n_tokens (hybrid/recurrent), shared with the record job.
        std::shared_ptr<const std::vector<uint8_t>> recurrent;
    };
    struct LaneState {
        bool has_ns = false;
        cache::NamespaceId ns;
        std::vector<Token> tokens;  // prefilled tokens whose state the lane holds
        // plan.h's regimes: tokens[0, body_end) were computed in the body regime, the rest
        // in the tail of a prompt with this body end (reusable only for the same body end,
        // and only when tail_exact: no single-token tail chunk).
        int32_t body_end = 0;
        bool tail_exact = false;
        // Position of the lane's recurrent state when it is exactly the end of `tokens`
        // (prefilled, nothing decoded after it); -1 otherwise.
        int32_t recurrent_at = -1;
        // Taken during the last request on this lane, kept while the lane keeps its state:
        // a next request that shares the prefix imports only one of these.
        std::vector<Checkpoint> checkpoints;
        int32_t n_restored = 0;  // of the current request
        // The current request's end of turn will be prefilled after its reply (Plan::turn_end).
        bool turn_end_follows = false;
        // A checkpoint only for the end of this turn (not recorded): -1 if none.
        int32_t turn_start = -1;
        std::vector<int32_t> pending;  // positions to record, export deferred
        uint64_t last_used = 0;
        std::string routing_key;  // prompt_cache_key of the last request (lane affinity)
        // While a request runs on the lane: its prompt, and how much of it is prefilled. The
        // body part of that (tokens[0, min(prefilled, body_end))) is exact state another
        // lane may copy (prefix_cache_peer.cpp).
        bool busy = false;
        std::vector<Token> prompt;
        int32_t prefilled = 0;
        // The chunk ends of that prefill (its plan): where a request that waits for it may
        // have it pause (hybrid/recurrent, prefix_cache_peer.cpp).
        std::vector<int32_t> chunk_ends;
    };
    struct PeerMatch {
        SeqId lane = -1;
        int32_t tokens = 0;
    };
    // Hybrid/recurrent: the busy lane a request can copy the most from at a pause of its
    // prefill (`tokens`: that point, 0 if none), and whether the lane is there now.
    struct PeerPause {
        SeqId lane = -1;
        int32_t tokens = 0;
        bool ready = false;
    };

    bool lookups_enabled(const PromptInfo& prompt) const;
    bool records_enabled(const PromptInfo& prompt) const;
    // The longest prefix of the prompt the lane can serve in place (0: none).
    int32_t lane_match(const LaneState& lane, const cache::NamespaceId& ns,
                       const PromptInfo& prompt) const;
    // Whether the lane's state of its first p tokens is exact for a prompt of n tokens with
    // body end b (plan.h).
    bool lane_serves(const LaneState& lane, int32_t p, int32_t b, int32_t n) const;
    int32_t body_end(const PromptInfo& prompt) const;
    std::vector<int32_t> record_positions(const PromptInfo& prompt, int32_t n_restored,
                                          bool turn_end_follows) const;
    int32_t restore(runtime::InferenceContext& context, SeqId lane, const PromptInfo& prompt,
                    const cache::NamespaceId& ns, LookupEvent& event);
    bool import_entry(runtime::InferenceContext& context, SeqId lane, const cache::ExactHit& hit,
                      bool recurrent_only, std::string& reason, LookupEvent& event);
    // The longest prefix of the prompt another lane holds as exact state for it (dense: a
    // busy or idle lane; hybrid/recurrent: a busy lane paused there), and the copy of it
    // into `lane` (prefix_cache_peer.cpp).
    PeerMatch best_peer(SeqId lane, const cache::NamespaceId& ns, const PromptInfo& prompt) const;
    // The prefix a busy lane's prompt shares with `prompt` that it has or will have prefilled
    // in the body regime.
    int32_t busy_lane_reach(const LaneState& lane, const cache::NamespaceId& ns,
                            std::span<const Token> prompt, int32_t limit) const;
    bool copy_from_peer(runtime::InferenceContext& context, SeqId lane, const PeerMatch& peer,
                        LookupEvent& event);
    // The longest r <= `want` where the busy lane's prefill can pause (a chunk end of its
    // plan, or a split of one of its body chunks into two of at least the body minimum)
    // and whose state is exact for a prompt of n tokens with body end b (0: none).
    int32_t pause_point(const LaneState& lane, int32_t want, int32_t b, int32_t n) const;
    PeerPause best_pause(const cache::NamespaceId& ns, const PromptInfo& prompt) const;
    // The pause a waiting request asks of a busy lane (pauses(); tokens 0: none): the same
    // test as waits_for_recurrent_peer, so a lane is held only for a request that waits.
    PeerPause pause_for(const PromptInfo& prompt) const;
    // What the request gets without waiting: an idle lane's match, or a stored entry within
    // `up_to` tokens (peeked only when the store's lock is free).
    int32_t available_now(const cache::NamespaceId& ns, const PromptInfo& prompt,
                          int32_t up_to) const;
    // Whether a request waits for a peer that will have `coming` tokens of its prompt when it
    // gets `have` without waiting (dense and hybrid/recurrent alike).
    bool worth_waiting(int32_t coming, int32_t have) const;
    bool waits_for_recurrent_peer(const PromptInfo& prompt,
                                  std::span<const std::span<const Token>> starting) const;
    void update_lane_gauge();
    void apply_forget_lanes();
    void flush_lane(runtime::InferenceContext& context, SeqId lane);
    void trim_checkpoints(LaneState& state) const;
    void submit_records(runtime::InferenceContext& context, SeqId lane, LaneState& state,
                        std::vector<int32_t> positions, bool turn_end);

    CacheConfig config_;
    const runtime::Model& model_;
    cache::CandidatePolicy policy_;
    cache::IdentityFields base_fields_;
    PayloadLayout layout_;
    size_t context_cells_per_lane_ = SIZE_MAX;  // set by attach(), read by prefetch()
    // Attention KV of a prefix does not depend on what follows it: a dense entry serves every
    // prompt that shares a prefix with it (imported whole, then trimmed). Hybrid/recurrent
    // entries serve only where their recurrent state was taken.
    cache::PrefixMatch match_ = cache::PrefixMatch::Stored;
    std::unique_ptr<cache::ExactStateCache> exact_;
    std::unique_ptr<cache::DiskStore> disk_;  // null: no disk tier
    std::string disk_note_;
    std::unique_ptr<cache::RedisStore> redis_;  // null: no shared tier
    std::string redis_note_;
    // Pages promoted from disk or Redis by prefetch() and not restored yet (tier reporting).
    struct Promoted {
        cache::PageId page;
        CacheTier tier = CacheTier::Disk;
    };
    mutable std::mutex promoted_mutex_;
    std::vector<Promoted> promoted_;
    std::atomic<uint64_t> disk_promotions_{0}, disk_read_failures_{0};
    std::atomic<uint64_t> redis_promotions_{0};
    metrics::Histogram redis_read_seconds_{metrics::latency_buckets_seconds()};
    // prefetch(): Redis has a longer exact prefix than RAM and disk; read, verify, promote.
    void prefetch_redis(const PromptInfo& prompt, const cache::NamespaceId& ns, size_t local_len);
    void note_promoted(cache::PageId page, CacheTier tier);
    std::unique_ptr<cache::RecordQueue> queue_;
    std::unique_ptr<CacheTelemetry> telemetry_;
    std::vector<LaneState> lanes_;
    uint64_t clock_ = 0;
    // Bytes of captured states waiting in the record queue (they count against the budget).
    std::shared_ptr<std::atomic<uint64_t>> queued_bytes_;
    // Recycled state buffers (captures, checkpoints, encoded payloads, import blobs, peer
    // copies); its idle bytes count against the queue's share of the budget.
    std::shared_ptr<BufferPool> buffers_;
    uint64_t queue_budget_bytes_ = 0;
    // What the queue's share has left for new captures and idle buffers (0 when full).
    uint64_t queue_room() const {
        const uint64_t queued = queued_bytes_->load();
        return queued < queue_budget_bytes_ ? queue_budget_bytes_ - queued : 0;
    }
    std::atomic<size_t> lane_tokens_{0};  // written by the scheduler thread, read by /metrics
    std::atomic<size_t> lanes_pending_{0};
    std::atomic<bool> forget_lanes_{false};
    // Namespaces flushed by flush_namespace(), applied to the lanes by the scheduler thread.
    std::mutex forget_mutex_;
    std::vector<cache::NamespaceId> forget_namespaces_;
    std::atomic<bool> forget_namespaces_pending_{false};
    std::atomic<int> failing_restores_{0};  // SKIPPY_TEST_FAIL_RESTORES
};

}  // namespace skippy::stage
