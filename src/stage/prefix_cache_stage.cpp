#include "stage/prefix_cache_stage.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "cache/prefix_identity.h"
#include "runtime/runtime_version.h"
#include "runtime/seq_state_format.h"
#include "stage/lane_record_job.h"

namespace skippy::stage {

namespace {

// A hybrid/recurrent turn with no checkpoint to restart its end from is prefilled again
// from the start when it is at most this long (a short first exchange).
constexpr int32_t kTurnEndFromStart = 512;

}  // namespace

PrefixCacheStage::PrefixCacheStage(const CacheConfig& config, const runtime::Model& model,
                                   const runtime::ContextOptions& context,
                                   cache::PayloadKind payload)
    : config_(config), model_(model) {
    policy_.min_tokens = std::max<uint32_t>(2, config.min_tokens);
    policy_.record_limit = std::max<uint32_t>(1, config.record_limit);
    base_fields_.weights_digest = model.weights_digest();
    base_fields_.layer_begin = 0;
    base_fields_.layer_end = model.n_layer();
    base_fields_.runtime_version = runtime::runtime_version();
    base_fields_.k_type = context.type_k;
    base_fields_.v_type = context.type_v;
    base_fields_.flash_attn =
        runtime::resolve_flash_attn(context.flash_attn, model.kind()) == runtime::FlashAttn::On;
    base_fields_.unified_kv = false;
    base_fields_.n_ctx = 0;  // pages do not depend on the context size or the lane count
    // Backend kind per layer, split and device kinds; "cpu" without devices (devices.h).
    base_fields_.devices = model.placement().identity();
    if (model.repacked()) {
        // Repacked weights run other kernels (gemm over padded row groups): other bits.
        base_fields_.devices += "+repack";
    }
    base_fields_.platform = cache::current_platform();
    layout_.kind = payload;
    layout_.n_layer = model.n_layer();
    layout_.k_type = context.type_k;
    layout_.v_type = context.type_v;
    layout_.has_attention = model.kind() != runtime::ModelKind::Recurrent;
    layout_.has_recurrent =
        model.kind() == runtime::ModelKind::Hybrid || model.kind() == runtime::ModelKind::Recurrent;
    match_ = layout_.has_recurrent ? cache::PrefixMatch::Stored : cache::PrefixMatch::Common;
    telemetry_ = std::make_unique<CacheTelemetry>(config.events_log_path);
    // Tests of the restore_failed / quarantined paths: the next N imports of stored entries
    // fail as a corrupt one would.
    if (const char* n = std::getenv("SKIPPY_TEST_FAIL_RESTORES")) {
        failing_restores_.store(std::atoi(n));
    }
    // Captured states waiting in the record queue count against --cache-max-bytes: they get
    // an eighth of it, the stored entries the rest.
    queue_budget_bytes_ = config.max_bytes / 8;
    queued_bytes_ = std::make_shared<std::atomic<uint64_t>>(0);
    // Idle buffers and queued captures share the queue's eighth (trimmed where buffers are
    // taken and given back by the stage).
    buffers_ = std::make_shared<BufferPool>(queue_budget_bytes_, 8);
    cache::ExactStateCacheOptions options;
    options.limits.max_entries = config.max_entries;
    options.limits.max_physical_bytes = config.max_bytes - queue_budget_bytes_;
    options.on_change = config.on_entry_change;
    exact_ = std::make_unique<cache::ExactStateCache>(options);
    cache::RecordQueueOptions queue_options;
    queue_options.capacity = std::max<uint32_t>(1, config.record_queue_capacity);
    queue_ = std::make_unique<cache::RecordQueue>(queue_options);
    if (config.disk && config.mode != CacheMode::Off && !config.disk_dir.empty()) {
        cache::DiskStoreOptions disk;
        disk.dir = config.disk_dir;
        disk.max_bytes = config.disk_max_bytes;
        disk.min_free_bytes = config.disk_min_free;
        cache::DiskOpenResult opened = cache::DiskStore::open(std::move(disk));
        if (opened.store) {
            disk_ = std::move(opened.store);
            const auto st = disk_->stats();
            disk_note_ = "disk=" + config.disk_dir + " (" + cache::to_string(disk_->mode()) + ", " +
                         std::to_string(st.entries) + " entries, reconciled in " +
                         std::to_string(st.reconcile_ms) + " ms)";
            if (!opened.message.empty()) {
                disk_note_ += " " + opened.message;
            }
        } else {
            disk_note_ = "disk=off (" + opened.message + "; serving from RAM only)";
        }
    } else {
        disk_note_ = "disk=off";
    }
    if (!config.redis_url.empty() && config.mode != CacheMode::Off) {
        // Not fatal when Redis is down: the store retries with a back-off.
        cache::RedisStoreOptions redis;
        redis.url = config.redis_url;
        redis.prefix = config.redis_prefix;
        redis.timeout = std::chrono::milliseconds(std::max<uint32_t>(1, config.redis_timeout_ms));
        cache::RedisOpenResult opened = cache::RedisStore::open(std::move(redis));
        if (opened.store) {
            redis_ = std::move(opened.store);
            redis_note_ = "redis=" + redis_->url().redacted() + " (" + opened.message + ")";
        } else {
            redis_note_ = "redis=off (" + opened.message + ")";
        }
    }
}

PrefixCacheStage::~PrefixCacheStage() {
    // Queued records finish (they also feed the disk and Redis tiers), then the writers drain.
    queue_->stop(true);
    if (disk_) {
        disk_->close(true);
    }
    if (redis_) {
        redis_->close(true);
    }
}

void PrefixCacheStage::attached(runtime::InferenceContext& context, uint32_t n_lanes) {
    lanes_.assign(n_lanes, LaneState{});
    layout_.n_stream = context.n_seq_max();
    context_cells_per_lane_ = context.n_ctx_seq();
}

cache::NamespaceId PrefixCacheStage::namespace_for(const std::string& key) const {
    cache::IdentityFields fields = base_fields_;
    if (!key.empty()) {
        fields.namespace_key = key;
    }
    return cache::NamespaceId::from_fields(fields);
}

bool PrefixCacheStage::lookups_enabled(const PromptInfo& prompt) const {
    return config_.mode == CacheMode::LookupRecord && prompt.cache_enabled;
}

bool PrefixCacheStage::records_enabled(const PromptInfo& prompt) const {
    return config_.mode != CacheMode::Off && prompt.cache_enabled;
}

void PrefixCacheStage::debug_forget_lanes() {
    forget_lanes_.store(true, std::memory_order_release);  // applied on the scheduler thread
}

void PrefixCacheStage::apply_forget_lanes() {
    if (forget_lanes_.exchange(false, std::memory_order_acq_rel)) {
        for (auto& lane : lanes_) {
            lane = LaneState{};
        }
        update_lane_gauge();
    }
    if (forget_namespaces_pending_.exchange(false, std::memory_order_acq_rel)) {
        std::vector<cache::NamespaceId> flushed;
        {
            std::lock_guard<std::mutex> lock(forget_mutex_);
            flushed.swap(forget_namespaces_);
        }
        for (auto& lane : lanes_) {
            if (lane.has_ns &&
                std::find(flushed.begin(), flushed.end(), lane.ns) != flushed.end()) {
                // No longer served to anyone (a running request keeps its cells; its lane
                // is matched again only after its next plan), nothing recorded from it.
                lane.has_ns = false;
                lane.pending.clear();
                lane.checkpoints.clear();
            }
        }
        update_lane_gauge();
    }
}

int32_t PrefixCacheStage::body_end(const PromptInfo& prompt) const {
    return rule_.body_end(static_cast<int32_t>(prompt.tokens.size()), prompt.message_boundaries);
}

bool PrefixCacheStage::lane_serves(const LaneState& lane, int32_t p, int32_t b, int32_t n) const {
    if (p <= lane.body_end) {
        return rule_.can_restore(p, b, n);
    }
    // The lane's tail: prefilled for a prompt with the same body end, in chunks of >= 2.
    return lane.tail_exact && lane.body_end == b && p <= n - 2;
}

int32_t PrefixCacheStage::lane_match(const LaneState& lane, const cache::NamespaceId& ns,
                                     const PromptInfo& prompt) const {
    if (!lane.has_ns || !(lane.ns == ns)) {
        return 0;  // another tenant's state is never reused
    }
    const auto n = static_cast<int32_t>(prompt.tokens.size());
    const int32_t b = body_end(prompt);
    const int32_t c = common_prefix(lane.tokens, prompt.tokens, std::max(n - 1, 0));
    int32_t best = 0;
    if (!layout_.has_recurrent) {
        // Attention KV of any prefix is exact: trim the lane to the longest that serves.
        best = rule_.best_restore(std::min(c, lane.body_end), b, n);
        if (c > lane.body_end && lane_serves(lane, std::min(c, n - 2), b, n)) {
            best = std::max(best, std::min(c, n - 2));
        }
    } else {
        // Only where the recurrent state is: the lane's end, or a checkpoint.
        auto consider = [&](int32_t p) {
            if (p <= c && p > best && lane_serves(lane, p, b, n)) {
                best = p;
            }
        };
        consider(lane.recurrent_at);
        for (const auto& cp : lane.checkpoints) {
            consider(cp.n_tokens);
        }
    }
    return best >= static_cast<int32_t>(policy_.min_tokens) ? best : 0;
}

SeqId PrefixCacheStage::choose_lane(std::span<const SeqId> idle, const PromptInfo& prompt) {
    apply_forget_lanes();
    const bool lookup = lookups_enabled(prompt);
    const cache::NamespaceId ns = namespace_for(prompt.cache_namespace);
    SeqId best = idle.front();
    int32_t best_match = -1;
    bool best_empty = false;
    uint64_t best_used = UINT64_MAX;
    bool best_routed = false;
    for (SeqId lane : idle) {
        const LaneState& s = lanes_[static_cast<size_t>(lane)];
        const int32_t match = lookup ? lane_match(s, ns, prompt) : 0;
        const bool empty = s.tokens.empty();
        // The routing hint (prompt_cache_key): the lane the key's last request used.
        const bool routed = !prompt.routing_key.empty() && s.routing_key == prompt.routing_key;
        // Longest match first; then the routing hint's lane; then an empty lane; then the
        // least recently used one, so that the states other conversations will come back to
        // survive longest.
        const bool better = match != best_match     ? match > best_match
                            : routed != best_routed ? routed
                            : empty != best_empty   ? empty
                                                    : s.last_used < best_used;
        if (better) {
            best = lane;
            best_match = match;
            best_routed = routed;
            best_empty = empty;
            best_used = s.last_used;
        }
    }
    return best;
}

Plan PrefixCacheStage::plan(runtime::InferenceContext& context, SeqId lane,
                            const PromptInfo& prompt, int32_t max_chunk) {
    LaneState& state = lanes_[static_cast<size_t>(lane)];
    state.last_used = ++clock_;
    state.routing_key = prompt.routing_key;
    const cache::NamespaceId ns = namespace_for(prompt.cache_namespace);
    if (!state.pending.empty()) {
        // Records waiting for this lane's state survive only if the new prompt keeps all of
        // them (the same conversation going on); otherwise they are exported now.
        const int32_t keep = lookups_enabled(prompt) ? lane_match(state, ns, prompt) : 0;
        if (keep < state.pending.back()) {
            flush_lane(context, lane);
        }
    }
    const auto n = static_cast<int32_t>(prompt.tokens.size());
    const int32_t held_common =
        state.has_ns && state.ns == ns ? common_prefix(state.tokens, prompt.tokens, n) : 0;
    LookupEvent event;
    event.payload = cache::to_string(layout_.kind);
    event.prompt_tokens = n;
    Plan plan;
    int32_t restored = 0;
    if (!lookups_enabled(prompt)) {
        event.decision = CacheDecision::Off;
        event.reason = "cache_off";
        plan.decision = CacheDecision::Off;
        context.seq_clear(lane);
    } else {
        restored = restore(context, lane, prompt, ns, event);
        plan.decision = event.decision;
        plan.tier = event.tier;
    }
    event.restored_tokens = restored;
    event.suffix_tokens = n - restored;
    plan.miss_reason = event.reason;
    plan.miss_tier = event.miss_tier;
    plan.diverged_at = event.diverged_at;
    telemetry_->lookup(event);
    // The lane's checkpoints are states of the tokens it held: only those inside what that
    // shares with this prompt (and inside what was restored) are states of this prompt too.
    // (A restore from the store or a peer replaced the lane's cells; a checkpoint the lane
    // took for another prompt past the shared head would restore that prompt's state.)
    const int32_t valid = std::min(restored, held_common);
    std::erase_if(state.checkpoints, [&](const Checkpoint& cp) { return cp.n_tokens > valid; });
    state.has_ns = true;
    state.ns = ns;
    state.tokens.assign(prompt.tokens.begin(), prompt.tokens.begin() + restored);
    state.recurrent_at = restored;
    state.n_restored = restored;
    plan.n_restored = restored;
    // The end of the turn is worth prefilling wherever its state is recorded.
    state.turn_end_follows = prompt.renders_turn_end && records_enabled(prompt);
    plan.turn_end = state.turn_end_follows;
    // Other lanes may copy what this one prefills (not from a request that opted out).
    state.busy = records_enabled(prompt);
    state.prompt.assign(prompt.tokens.begin(),
                        state.busy ? prompt.tokens.end() : prompt.tokens.begin());
    state.prefilled = restored;
    // The regimes of this prefill (plan.h): a restore inside the body leaves a valid rest
    // (restore() and lane_match() chose it so); one in the lane's tail keeps its body end.
    const int32_t b = body_end(prompt);
    state.body_end = restored > b || rule_.can_restore(restored, b, n) ? b : restored;
    const int32_t tail = n - std::max(restored, b);  // 1: a decode step; 64: tiled
    state.tail_exact = tail != 1 && tail < rule_.body_min;
    std::vector<int32_t> pauses;
    state.turn_start = -1;
    const bool checkpoints = layout_.has_recurrent && records_enabled(prompt);
    std::vector<int32_t> recorded;  // (sorted)
    if (checkpoints) {
        // The recurrent state is only ever available where the prefill pauses.
        recorded = record_positions(prompt, restored, state.turn_end_follows);
        // Each pause costs one more decode call now (~6 ms on the bench models, 2 cores), so
        // a state that would save a later prompt fewer than min_tokens over the state below
        // it (the restore, or the previous pause) is not taken: the reply between the last
        // turn's prompt end and the new message, a short tool call.
        const auto min_gain = static_cast<int32_t>(policy_.min_tokens);
        int32_t kept = restored;
        std::erase_if(recorded, [&](int32_t r) {
            if (r - kept < min_gain) {
                return true;
            }
            kept = r;
            return false;
        });
        // The head this prompt shares with another lane's (running or held), or with what
        // this lane held before it (the same head sent again after the other request ended
        // reuses that lane in place): prompts seen to share a head are likely to share it
        // again, and a model with recurrent state can restore only where a checkpoint was
        // taken, so the state there is recorded too. (Only when it saves at least min_tokens
        // over the nearest state below it: two chat prompts share their system prompt and
        // the next message's opening tokens.)
        const int32_t head = std::max(held_common, shared_head(lane, ns, prompt.tokens));
        int32_t below = restored;
        for (int32_t r : recorded) {
            below = r <= head ? std::max(below, r) : below;
        }
        if (head <= b && head >= min_gain && head - below >= min_gain) {
            recorded.insert(std::upper_bound(recorded.begin(), recorded.end(), head), head);
        }
        pauses = recorded;
        if (b < n && b > restored) {
            pauses.push_back(b);  // where the end of the turn restarts (plan_turn_end)
        }
        std::sort(pauses.begin(), pauses.end());
    }
    plan.chunk_ends = plan_chunks(restored, n, pauses, max_chunk, rule_.body_min, b);
    if (checkpoints && b < n && b > restored) {
        // A state at least one body chunk before b. With a turn end to follow, that turn end
        // restarts there when the reply is short (a lane-only checkpoint). Without one (a
        // completion) it is stored: a request that extends this prompt by less than a body
        // chunk cannot restore b (the rest would be too short for the body's chunks), but
        // it can restore here. The last chunk end that far back serves; else one more pause.
        const int32_t limit = b - rule_.body_min;
        const auto last_before = [&] {
            int32_t at = -1;
            for (int32_t e : plan.chunk_ends) {
                at = e > restored && e <= limit ? e : at;
            }
            return at;
        };
        int32_t before = last_before();
        if (before < 0 && limit - restored >= rule_.body_min) {
            pauses.push_back(limit);
            std::sort(pauses.begin(), pauses.end());
            plan.chunk_ends = plan_chunks(restored, n, pauses, max_chunk, rule_.body_min, b);
            before = last_before();
        }
        if (before > 0) {
            if (state.turn_end_follows &&
                !std::binary_search(recorded.begin(), recorded.end(), before)) {
                state.turn_start = before;  // (a record position stays a stored one)
            }
            if (!std::binary_search(pauses.begin(), pauses.end(), before)) {
                pauses.insert(std::upper_bound(pauses.begin(), pauses.end(), before), before);
            }
        }
    }
    for (int32_t p : pauses) {
        if (p < n && std::binary_search(plan.chunk_ends.begin(), plan.chunk_ends.end(), p)) {
            plan.checkpoints.push_back(p);
        }
    }
    state.chunk_ends = plan.chunk_ends;  // where a request waiting for this lane may copy it
    return plan;
}

int32_t PrefixCacheStage::shared_head(SeqId lane, const cache::NamespaceId& ns,
                                      std::span<const Token> tokens) const {
    int32_t head = 0;
    const auto n = static_cast<int32_t>(tokens.size());
    for (size_t i = 0; i < lanes_.size(); ++i) {
        const LaneState& other = lanes_[i];
        if (static_cast<SeqId>(i) == lane || !other.has_ns || !(other.ns == ns)) {
            continue;
        }
        const std::vector<Token>& theirs = other.busy ? other.prompt : other.tokens;
        head = std::max(head, common_prefix(theirs, tokens, n));
    }
    return head;
}

std::shared_ptr<const std::vector<uint8_t>> PrefixCacheStage::export_recurrent(
    runtime::InferenceContext& context, SeqId lane) {
    const auto scope =
        layout_.has_attention ? runtime::StateScope::PartialOnly : runtime::StateScope::Full;
    std::vector<uint8_t> blob = buffers_->take(context.state_size(lane, scope));
    if (!context.state_export_into(lane, scope, blob)) {
        buffers_->give(std::move(blob));
        return nullptr;
    }
    return buffers_->share(std::move(blob));  // back to the pool when the last owner drops it
}

void PrefixCacheStage::report(runtime::InferenceContext& context, SeqId lane,
                              const PromptInfo& prompt, const LaneReport& what) {
    switch (what.what) {
        case LaneReport::What::ChunkDone:
            if (LaneState& state = lanes_[static_cast<size_t>(lane)];
                state.busy && !what.turn_end) {
                state.prefilled = what.n_tokens;  // a peer may copy up to here
            }
            if (what.checkpoint) {
                take_checkpoint(context, lane, prompt, what.n_tokens);
            }
            return;
        case LaneReport::What::PromptDone:
            prompt_done(context, lane, prompt);
            return;
    }
}

void PrefixCacheStage::finish(runtime::InferenceContext& context, SeqId lane,
                              const PromptInfo& prompt, const LaneFinish& how) {
    if (how.how == LaneFinish::How::Failed) {
        discard(context, lane);
    } else {
        release(context, lane, prompt, how.canonical, how.how == LaneFinish::How::TurnEnd);
    }
}

void PrefixCacheStage::take_checkpoint(runtime::InferenceContext& context, SeqId lane,
                                       const PromptInfo& prompt, int32_t n_tokens) {
    if (!layout_.has_recurrent || !records_enabled(prompt)) {
        return;
    }
    // Only the recurrent state is copied here (small); the attention KV of these tokens does
    // not change while the lane goes on, so it is taken from the lane's export at release.
    if (auto blob = export_recurrent(context, lane)) {
        lanes_[static_cast<size_t>(lane)].checkpoints.push_back({n_tokens, std::move(blob)});
    }
}

void PrefixCacheStage::prompt_done(runtime::InferenceContext& context, SeqId lane,
                                   const PromptInfo& prompt) {
    const auto n = static_cast<int32_t>(prompt.tokens.size());
    const LaneState& state = lanes_[static_cast<size_t>(lane)];
    if (!layout_.has_recurrent || !state.turn_end_follows || !records_enabled(prompt) ||
        state.body_end < n) {
        return;  // (a prompt with a tail has a checkpoint at its body end instead)
    }
    // A checkpoint at the prompt end: the end of the turn restarts from it, and the next
    // request of the conversation, which shares this prompt whole (a generation prompt is
    // one of its message boundaries) but not always the reply (a client that edits or
    // re-renders it, or one that comes back before the end of the turn ran), restores it.
    take_checkpoint(context, lane, prompt, n);
}

Plan PrefixCacheStage::plan_turn_end(runtime::InferenceContext& context, SeqId lane,
                                     const PromptInfo& prompt, std::span<const Token> turn,
                                     int32_t max_chunk) {
    Plan plan;
    plan.n_restored = -1;  // no end-of-turn work
    LaneState& state = lanes_[static_cast<size_t>(lane)];
    const auto n = static_cast<int32_t>(prompt.tokens.size());
    const auto end = static_cast<int32_t>(turn.size());
    // The lane's cells change from here on: no peer copies from it until it is released.
    state.prompt.clear();
    state.prefilled = 0;
    state.chunk_ends.clear();
    if (!state.turn_end_follows || end < n + 2) {
        return plan;
    }
    if (state.tokens.size() != prompt.tokens.size() ||
        !std::equal(state.tokens.begin(), state.tokens.end(), prompt.tokens.begin())) {
        return plan;  // the lane moved on (or was forgotten) since the reply
    }
    // The reply's cells were decoded token by token: drop them, the scheduler prefills the
    // assistant message canonically, in body chunks (plan.h): from the end of the prompt's
    // body, or from earlier when the rest is shorter than the body minimum (prompt cells
    // prefilled again come out bit-identical: the exactness rule).
    int32_t from = std::min(state.body_end, end - rule_.body_min);
    bool whole = false;  // the lane was cleared: the whole turn is prefilled
    if (layout_.has_recurrent) {
        // Only where the recurrent state was taken: the prompt end, or an earlier checkpoint.
        const Checkpoint* start = nullptr;
        for (const auto& cp : state.checkpoints) {
            if (cp.n_tokens <= from && (start == nullptr || cp.n_tokens > start->n_tokens)) {
                start = &cp;
            }
        }
        if (start == nullptr || start->n_tokens < static_cast<int32_t>(policy_.min_tokens)) {
            if (end > kTurnEndFromStart) {
                return plan;
            }
            // A short conversation: its whole turn is prefilled again.
            context.seq_clear(lane);
            whole = true;
            from = 0;
        } else {
            from = start->n_tokens;
            const auto scope = layout_.has_attention ? runtime::StateScope::PartialOnly
                                                     : runtime::StateScope::Full;
            if (!context.state_import(*start->recurrent, lane, scope)) {
                context.seq_clear(lane);
                state.tokens.clear();
                return plan;
            }
        }
    }
    if (!whole && (from < 1 || !context.seq_remove(lane, from, -1) ||
                   context.seq_pos_max(lane) != from - 1)) {
        context.seq_clear(lane);
        state.tokens.clear();
        return plan;
    }
    plan.n_restored = from;
    // The rest of the turn in body chunks: the state every later prompt computes there.
    plan.chunk_ends = plan_chunks(from, end, {}, max_chunk, rule_.body_min);
    return plan;
}

void PrefixCacheStage::discard(runtime::InferenceContext& context, SeqId lane) {
    context.seq_clear(lane);
    LaneState& state = lanes_[static_cast<size_t>(lane)];
    const uint64_t used = state.last_used;
    state = LaneState{};
    state.last_used = used;
    update_lane_gauge();
}

}  // namespace skippy::stage
