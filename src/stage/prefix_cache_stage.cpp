#include "stage/prefix_cache_stage.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "cache/exact_record_job.h"
#include "cache/prefix_identity.h"
#include "runtime/runtime_version.h"

namespace skippy::stage {

using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

cache::PageId page_of(const cache::NamespaceId& ns, std::span<const Token> tokens) {
    return cache::prefix_identity(ns, 0, tokens).page_id();
}

}  // namespace

const char* active_payload_name(ActivePayload payload) {
    switch (payload) {
        case ActivePayload::ResidentKv:
            return "resident-kv";
        case ActivePayload::KvRecurrent:
            return "kv-recurrent";
        case ActivePayload::FullState:
            return "full-state";
    }
    return "?";
}

PrefixCacheStage::PrefixCacheStage(const CacheConfig& config, const runtime::Model& model,
                                   const runtime::ContextOptions& context, ActivePayload payload)
    : config_(config), model_(model), payload_(payload) {
    policy_.stride = std::max<uint32_t>(1, config.stride);
    policy_.min_tokens = std::max<uint32_t>(1, config.min_tokens);
    policy_.record_limit = std::max<uint32_t>(1, config.record_limit);
    base_fields_.weights_digest = model.weights_digest();
    base_fields_.layer_begin = 0;
    base_fields_.layer_end = model.n_layer();
    base_fields_.runtime_version = runtime::runtime_version();
    base_fields_.k_type = context.type_k;
    base_fields_.v_type = context.type_v;
    base_fields_.flash_attn = context.flash_attn;
    base_fields_.unified_kv = true;
    base_fields_.n_ctx = context.n_ctx;
    base_fields_.devices = "cpu";
    base_fields_.platform = cache::current_platform();
    layout_.kind = payload == ActivePayload::FullState ? cache::PayloadKind::FullState
                                                       : cache::PayloadKind::KvRecurrent;
    layout_.n_layer = model.n_layer();
    layout_.k_type = context.type_k;
    layout_.v_type = context.type_v;
    layout_.attention_free = model.kind() == runtime::ModelKind::Recurrent;
    telemetry_ = std::make_unique<CacheTelemetry>(config.events_log_path);
    if (payload != ActivePayload::ResidentKv) {
        cache::ExactStateCacheOptions options;
        options.limits.max_entries = config.max_entries;
        options.limits.max_physical_bytes = config.max_bytes;
        exact_ = std::make_unique<cache::ExactStateCache>(options);
        cache::RecordQueueOptions queue_options;
        queue_options.capacity = std::max<uint32_t>(1, config.record_queue_capacity);
        queue_ = std::make_unique<cache::RecordQueue>(queue_options);
    }
}

PrefixCacheStage::~PrefixCacheStage() {
    if (queue_) {
        queue_->stop(false);
    }
}

uint32_t PrefixCacheStage::spare_sequences() const {
    return payload_ == ActivePayload::ResidentKv ? config_.resident_max_entries : 0;
}

void PrefixCacheStage::attach(runtime::InferenceContext& context, SeqId first_spare_seq,
                              uint32_t n_lanes) {
    n_ctx_ = context.n_ctx();
    n_lanes_ = n_lanes;
    lane_shared_tokens_.assign(n_lanes, 0);
    turn_start_state_.assign(n_lanes, {});
    retained_tokens_.assign(n_lanes, {});
    if (payload_ == ActivePayload::ResidentKv) {
        cache::ResidentCacheOptions options;
        options.seq_id_count = static_cast<int32_t>(context.n_seq_max());
        for (SeqId s = 0; s < first_spare_seq; ++s) {
            options.reserved_seq_ids.push_back(s);
        }
        options.max_entries = config_.resident_max_entries;
        options.token_budget =
            config_.resident_token_budget > 0 ? config_.resident_token_budget : n_ctx_;
        resident_ = std::make_unique<cache::ResidentCache>(options);
    }
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

RestoreResult PrefixCacheStage::restore(runtime::InferenceContext& context, SeqId lane,
                                        const PromptInfo& prompt) {
    RestoreResult result = restore_into_lane(context, lane, prompt);
    if (result.n_restored == 0) {
        context.seq_clear(lane);  // the lane may still hold an earlier request's state
    }
    if (static_cast<size_t>(lane) < retained_tokens_.size()) {
        retained_tokens_[static_cast<size_t>(lane)].clear();  // the lane is in use now
    }
    return result;
}

RestoreResult PrefixCacheStage::restore_into_lane(runtime::InferenceContext& context, SeqId lane,
                                                  const PromptInfo& prompt) {
    if (static_cast<size_t>(lane) < lane_shared_tokens_.size()) {
        lane_shared_tokens_[static_cast<size_t>(lane)] = 0;
        turn_start_state_[static_cast<size_t>(lane)].clear();
    }
    LookupEvent event;
    event.payload = active_payload_name(payload_);
    event.prompt_tokens = static_cast<int32_t>(prompt.tokens.size());
    event.suffix_tokens = event.prompt_tokens;
    if (!lookups_enabled(prompt)) {
        event.decision = "skipped";
        event.reason = config_.mode == CacheMode::LookupRecord ? "request opted out" : "mode";
        telemetry_->lookup(event);
        return RestoreResult{0, "off"};
    }
    const auto reusable = cache::reusable_prefix_len(prompt.tokens.size());
    event.candidates = cache::lookup_candidates(reusable, policy_).size();
    RestoreResult result;
    if (reusable >= policy_.min_tokens) {
        const cache::NamespaceId ns = namespace_for(prompt.cache_namespace);
        result = payload_ == ActivePayload::ResidentKv
                     ? restore_resident(context, lane, prompt, ns, event)
                     : restore_exact(context, lane, prompt, ns, event);
    } else {
        event.decision = "miss";
        event.reason = "prompt shorter than min_tokens";
    }
    event.restored_tokens = result.n_restored;
    event.suffix_tokens = event.prompt_tokens - result.n_restored;
    telemetry_->lookup(event);
    return result;
}

RestoreResult PrefixCacheStage::restore_resident(runtime::InferenceContext& context, SeqId lane,
                                                 const PromptInfo& prompt,
                                                 const cache::NamespaceId& ns, LookupEvent& event) {
    const auto t0 = Clock::now();
    const auto query = prompt.tokens.first(cache::reusable_prefix_len(prompt.tokens.size()));
    std::optional<cache::ResidentHit> hit = resident_->acquire_longest(ns, query);
    event.lookup_ms = ms_since(t0);
    if (!hit || hit->matched_len < policy_.min_tokens) {
        event.decision = "miss";
        return {};
    }
    const auto matched = static_cast<Pos>(hit->matched_len);
    event.page_id = page_of(ns, query.first(hit->matched_len)).str();
    const auto t1 = Clock::now();
    // Transaction: copy the prefix, check it landed, or leave the lane empty.
    context.seq_copy(hit->seq_id, lane, 0, matched);
    event.import_ms = ms_since(t1);
    if (context.seq_pos_max(lane) != matched - 1) {
        context.seq_clear(lane);
        event.decision = "resident_error";
        event.reason = "sequence copy did not produce the prefix";
        const int32_t broken_seq = hit->seq_id;
        hit.reset();  // release the lease so the broken entry can be removed
        const auto removed = resident_->remove_seq(broken_seq);
        if (removed.status == cache::RemoveStatus::Removed) {
            drop_sequences(context, {removed.seq_id});
        }
        return {};
    }
    lane_shared_tokens_[static_cast<size_t>(lane)] = matched;
    event.decision = "resident_hit";
    return RestoreResult{matched, "resident_hit"};
}

RestoreResult PrefixCacheStage::restore_exact(runtime::InferenceContext& context, SeqId lane,
                                              const PromptInfo& prompt,
                                              const cache::NamespaceId& ns, LookupEvent& event) {
    const auto t0 = Clock::now();
    const auto query = prompt.tokens.first(cache::reusable_prefix_len(prompt.tokens.size()));
    // True when the idle lane still holds the first n query tokens, canonically prefilled.
    // Taken out of the lane's record: whatever happens next, the lane is in use after this.
    std::vector<Token> retained = std::move(retained_tokens_[static_cast<size_t>(lane)]);
    retained_tokens_[static_cast<size_t>(lane)].clear();
    auto lane_holds = [&](size_t n) {
        return retained.size() >= n &&
               std::equal(query.begin(), query.begin() + static_cast<long>(n), retained.begin());
    };
    std::optional<cache::ExactHit> hit = exact_->acquire_longest(ns, query);
    // A just-recorded state the worker has not inserted yet may be longer than the hit.
    const cache::ExactRecordPayload* recent = nullptr;
    for (auto it = recent_records_.begin(); it != recent_records_.end();) {
        const cache::ExactRecordPayload& r = **it;
        if (exact_->try_contains(r.ns, r.tokens, r.page) == cache::Presence::Present) {
            it = recent_records_.erase(it);
            continue;
        }
        const size_t n = r.tokens.size();
        if (r.ns == ns && n <= query.size() && n >= policy_.min_tokens &&
            n > (hit ? hit->len : 0) && (recent == nullptr || n > recent->tokens.size()) &&
            std::equal(r.tokens.begin(), r.tokens.end(), query.begin())) {
            recent = &r;
        }
        ++it;
    }
    event.lookup_ms = ms_since(t0);
    if (recent != nullptr) {
        hit.reset();
        event.page_id = recent->page.str();
        event.bytes = recent->bytes.size();
        std::string reason;
        const auto t1 = Clock::now();
        if (import_payload(context, lane, recent->bytes, recent->descriptor, recent->tokens.size(),
                           reason, lane_holds(recent->tokens.size()))) {
            event.import_ms = ms_since(t1);
            event.decision = "exact_hit";
            event.reason = "recent record (queued, not yet inserted)";
            return RestoreResult{static_cast<int32_t>(recent->tokens.size()), "exact_hit"};
        }
        // Our own fresh export failed to import: drop it and use the cache instead.
        context.seq_clear(lane);
        retained.clear();  // the lane no longer holds anything to reuse in place
        std::erase_if(recent_records_, [&](const auto& r) { return r.get() == recent; });
        hit = exact_->acquire_longest(ns, query);
    }
    if (!hit || hit->len < policy_.min_tokens) {
        event.decision = "miss";
        return {};
    }
    const auto key = query.first(hit->len);
    event.page_id = hit->page.str();
    event.bytes = hit->payload_bytes;
    auto quarantine = [&](const std::string& why) {
        context.seq_clear(lane);
        event.decision = "exact_error";
        event.reason = why;
        const auto status = exact_->quarantine(ns, key, hit->page);
        event.quarantined = status == cache::QuarantineStatus::Removed ||
                            status == cache::QuarantineStatus::Deferred;
        hit.reset();
        return RestoreResult{};
    };
    if (page_of(ns, key) != hit->page) {
        return quarantine("token range mismatch: page id differs from the prefix identity");
    }
    const auto t1 = Clock::now();
    cache::ReconstructResult bytes = exact_->reconstruct(hit->lease);
    event.reconstruct_ms = ms_since(t1);
    if (!bytes.ok()) {
        return quarantine(std::string("reconstruct failed: ") + cache::to_string(bytes.error));
    }
    std::string reason;
    const auto t2 = Clock::now();
    const bool imported = import_payload(context, lane, bytes.bytes.span(), hit->descriptor,
                                         hit->len, reason, lane_holds(hit->len));
    event.import_ms = ms_since(t2);
    if (!imported) {
        return quarantine(reason);
    }
    event.decision = "exact_hit";
    return RestoreResult{static_cast<int32_t>(hit->len), "exact_hit"};
}

bool PrefixCacheStage::import_payload(runtime::InferenceContext& context, SeqId lane,
                                      std::span<const uint8_t> bytes,
                                      const cache::PayloadDescriptor& descriptor, size_t n_tokens,
                                      std::string& reason, bool in_place) {
    if (in_place && descriptor.kind == cache::PayloadKind::KvRecurrent &&
        descriptor.recurrent_bytes > 0 && descriptor.kv_bytes > 0) {
        // The lane holds this prefix's attention KV already (prefilled canonically): import
        // only the recurrent state taken at the prefix end, then drop the lane's later
        // cells (the recurrent part now ends at the prefix, so the removal is allowed).
        const auto recurrent = decode_payload(bytes, descriptor, static_cast<uint32_t>(n_tokens),
                                              layout_, &reason, PayloadPart::RecurrentOnly);
        if (!recurrent) {
            return false;  // the stored bytes are inconsistent: quarantine
        }
        if (context.state_import(*recurrent, lane, runtime::StateScope::PartialOnly) &&
            context.seq_remove(lane, static_cast<Pos>(n_tokens), -1) &&
            context.seq_pos_max(lane) == static_cast<Pos>(n_tokens) - 1) {
            return true;
        }
    }
    context.seq_clear(lane);  // a full import starts from an empty lane
    const auto blob =
        decode_payload(bytes, descriptor, static_cast<uint32_t>(n_tokens), layout_, &reason);
    if (!blob) {
        return false;
    }
    if (!context.state_import(*blob, lane, runtime::StateScope::Full)) {
        reason = "state import failed";
        return false;
    }
    if (context.seq_pos_max(lane) != static_cast<Pos>(n_tokens) - 1) {
        reason = "imported state has the wrong length";
        return false;
    }
    return true;
}

std::vector<int32_t> PrefixCacheStage::checkpoint_positions(const PromptInfo& prompt,
                                                            int32_t n_restored) {
    if (payload_ == ActivePayload::ResidentKv || !records_enabled(prompt)) {
        return {};
    }
    std::vector<size_t> structural(prompt.message_boundaries.begin(),
                                   prompt.message_boundaries.end());
    std::vector<int32_t> out;
    for (size_t len : cache::record_ladder(prompt.tokens.size(), structural, policy_)) {
        if (static_cast<int32_t>(len) > n_restored) {
            out.push_back(static_cast<int32_t>(len));
        }
    }
    return out;
}

void PrefixCacheStage::on_checkpoint(runtime::InferenceContext& context, SeqId lane,
                                     const PromptInfo& prompt, int32_t n_tokens) {
    if (!records_enabled(prompt) || !exact_) {
        return;
    }
    if (prompt.track_turn_end && static_cast<size_t>(n_tokens) == prompt.tokens.size() &&
        static_cast<size_t>(lane) < turn_start_state_.size()) {
        turn_start_state_[static_cast<size_t>(lane)] =
            context.state_export(lane, runtime::StateScope::Full);
    }
    record_exact(context, lane, prompt.tokens.first(static_cast<size_t>(n_tokens)),
                 namespace_for(prompt.cache_namespace));
}

void PrefixCacheStage::record_exact(runtime::InferenceContext& context, SeqId lane,
                                    std::span<const Token> tokens, const cache::NamespaceId& ns) {
    RecordEvent event;
    event.payload = active_payload_name(payload_);
    event.tokens = static_cast<int32_t>(tokens.size());
    const cache::PageId page = page_of(ns, tokens);
    event.page_id = page.str();
    // Cheap, non-blocking admission checks before paying for the export.
    if (exact_->try_contains(ns, tokens, page) == cache::Presence::Present) {
        event.decision = "already_present";
        telemetry_->record(event);
        return;
    }
    const cache::Admission probe = queue_->probe(page);
    if (probe != cache::Admission::Queued) {
        event.decision = probe == cache::Admission::DroppedFull       ? "dropped_full"
                         : probe == cache::Admission::AlreadyInFlight ? "in_flight"
                                                                      : "worker_stopped";
        telemetry_->record(event);
        return;
    }
    const auto t0 = Clock::now();
    EncodedPayload encoded;
    try {
        encoded = export_payload(context, lane, static_cast<uint32_t>(tokens.size()), layout_);
    } catch (const std::exception& e) {
        event.decision = "failed";
        event.reason = e.what();
        telemetry_->record(event);
        return;
    }
    event.export_ms = ms_since(t0);
    event.bytes = encoded.bytes.size();
    auto payload = std::make_shared<const cache::ExactRecordPayload>(cache::ExactRecordPayload{
        ns, std::vector<Token>(tokens.begin(), tokens.end()), page, encoded.descriptor,
        std::move(encoded.bytes), std::move(encoded.cuts)});
    CacheTelemetry* telemetry = telemetry_.get();
    cache::ExactStateCache* exact = exact_.get();
    const RecordEvent queued_event = event;
    auto job = cache::make_exact_record_job(
        *exact_, payload, [telemetry, exact, queued_event](const cache::ExactInsertResult& r) {
            RecordEvent done = queued_event;
            done.decision = r.stored() ? "stored" : "failed";
            if (!r.stored()) {
                done.reason = cache::to_string(r.status);
            }
            done.new_blocks = r.blocks.new_blocks;
            done.reused_blocks = r.blocks.reused_blocks;
            done.hash_ms = r.blocks.hash_seconds * 1000.0;
            done.evicted = r.evicted.size();
            if (auto stats = exact->try_stats()) {
                done.entries = stats->entries;
            }
            telemetry->record(done);
        });
    const cache::Admission admission = queue_->submit(std::move(job));
    event.decision = admission == cache::Admission::Queued ? "queued" : "dropped_full";
    if (admission == cache::Admission::Queued) {
        recent_records_.push_back(std::move(payload));
        const size_t cap = std::max<size_t>(4, 2 * static_cast<size_t>(n_lanes_));
        while (recent_records_.size() > cap) {
            recent_records_.pop_front();
        }
    }
    telemetry_->record(event);
}

void PrefixCacheStage::on_finish(runtime::InferenceContext& context, SeqId lane,
                                 std::span<const Token> lane_tokens, const PromptInfo& prompt) {
    if (!records_enabled(prompt) || lane_tokens.size() < policy_.min_tokens) {
        return;
    }
    const cache::NamespaceId ns = namespace_for(prompt.cache_namespace);
    if (payload_ != ActivePayload::ResidentKv) {
        // Not recorded for exact payloads: the reply was decoded token by token, and the
        // recurrent kernels round differently than for the prefill of the next turn, so a
        // state taken here would not be bit-identical to an uncached run. The next turn
        // restores the checkpoint at the end of this prompt (its generation prompt).
        return;
    }
    RecordEvent event;
    event.payload = active_payload_name(payload_);
    event.tokens = static_cast<int32_t>(lane_tokens.size());
    const cache::ResidentInsertResult r = resident_->insert(ns, lane_tokens);
    drop_sequences(context, r.evicted);
    event.evicted = r.evicted.size();
    switch (r.status) {
        case cache::ResidentInsertStatus::Inserted:
            context.seq_clear(r.seq_id);
            context.seq_copy(lane, r.seq_id, 0, static_cast<Pos>(r.stored_len));
            if (context.seq_pos_max(r.seq_id) != static_cast<Pos>(r.stored_len) - 1) {
                const auto removed = resident_->remove_seq(r.seq_id);
                if (removed.status == cache::RemoveStatus::Removed) {
                    drop_sequences(context, {removed.seq_id});
                }
                event.decision = "failed";
                event.reason = "sequence copy failed";
            } else {
                event.decision = "resident_inserted";
            }
            break;
        case cache::ResidentInsertStatus::AlreadyCovered:
            event.decision = "resident_covered";
            break;
        default:
            event.decision = "resident_no_capacity";
            event.reason = cache::to_string(r.status);
            break;
    }
    event.entries = resident_->stats().entries;
    telemetry_->record(event);
}

void PrefixCacheStage::drop_sequences(runtime::InferenceContext& context,
                                      const std::vector<int32_t>& seqs) {
    if (seqs.empty()) {
        return;
    }
    for (int32_t s : seqs) {
        context.seq_clear(s);
    }
    resident_->confirm_dropped(seqs);
}

void PrefixCacheStage::make_room(runtime::InferenceContext& context, uint32_t n_cells) {
    if (!resident_) {
        return;
    }
    // Estimate of used cells: resident paths with shared prefixes counted once (a resident
    // entry shares the cells of the prefix it was restored from) + what lanes hold beyond
    // the prefix they share with a resident entry.
    uint64_t used = resident_->stats().distinct_tokens;
    for (uint32_t lane = 0; lane < n_lanes_; ++lane) {
        const auto held = static_cast<int64_t>(context.seq_pos_max(static_cast<SeqId>(lane)) + 1);
        used += static_cast<uint64_t>(std::max<int64_t>(0, held - lane_shared_tokens_[lane]));
    }
    if (used + n_cells <= n_ctx_) {
        return;
    }
    const auto evicted = resident_->evict_tokens(used + n_cells - n_ctx_);
    drop_sequences(context, evicted);
    telemetry_->resident_evictions(evicted.size());
}

bool PrefixCacheStage::keeps_lane_state() const {
    return payload_ == ActivePayload::KvRecurrent && config_.mode == CacheMode::LookupRecord;
}

void PrefixCacheStage::lane_released(SeqId lane, std::span<const Token> retained) {
    if (static_cast<size_t>(lane) < retained_tokens_.size()) {
        retained_tokens_[static_cast<size_t>(lane)].assign(retained.begin(), retained.end());
    }
}

bool PrefixCacheStage::tracks_turn_end() const {
    return payload_ != ActivePayload::ResidentKv && config_.mode != CacheMode::Off;
}

bool PrefixCacheStage::restore_turn_start(runtime::InferenceContext& context, SeqId lane,
                                          const PromptInfo& prompt) {
    if (static_cast<size_t>(lane) >= turn_start_state_.size()) {
        return false;
    }
    std::vector<uint8_t> state = std::move(turn_start_state_[static_cast<size_t>(lane)]);
    turn_start_state_[static_cast<size_t>(lane)].clear();
    context.seq_clear(lane);
    if (state.empty() || !context.state_import(state, lane, runtime::StateScope::Full) ||
        context.seq_pos_max(lane) != static_cast<Pos>(prompt.tokens.size()) - 1) {
        context.seq_clear(lane);
        return false;
    }
    return true;
}

bool PrefixCacheStage::evict_for_space(runtime::InferenceContext& context) {
    if (!resident_) {
        // Idle lanes that kept their state give their cells back first.
        for (size_t lane = 0; lane < retained_tokens_.size(); ++lane) {
            if (!retained_tokens_[lane].empty()) {
                retained_tokens_[lane].clear();
                context.seq_clear(static_cast<SeqId>(lane));
                return true;
            }
        }
        return false;
    }
    const auto evicted = resident_->evict_tokens(1);
    drop_sequences(context, evicted);
    telemetry_->resident_evictions(evicted.size());
    return !evicted.empty();
}

std::string PrefixCacheStage::metrics_text() const {
    std::string out = telemetry_->metrics_text();
    auto gauge = [&](const char* name, const char* help, double v) {
        out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n" + name +
               " " + std::to_string(v) + "\n";
    };
    if (resident_) {
        const auto s = resident_->stats();
        gauge("skippy_cache_resident_entries", "Resident prefixes held in spare sequences.",
              static_cast<double>(s.entries));
        gauge("skippy_cache_resident_tokens", "Tokens held by resident prefixes.",
              static_cast<double>(s.tokens));
    }
    if (exact_) {
        if (auto s = exact_->try_stats()) {
            gauge("skippy_cache_exact_entries", "Exact-state entries.",
                  static_cast<double>(s->entries));
            gauge("skippy_cache_physical_bytes", "Unique block bytes of exact-state payloads.",
                  static_cast<double>(s->blocks.physical_bytes));
            gauge("skippy_cache_logical_bytes", "Payload bytes referenced by entries.",
                  static_cast<double>(s->blocks.logical_bytes));
            gauge("skippy_cache_blocks", "Stored blocks.",
                  static_cast<double>(s->blocks.block_count));
        }
        const auto q = queue_->counters();
        gauge("skippy_cache_record_queue_pending", "Record jobs queued or running.",
              static_cast<double>(q.pending));
        gauge("skippy_cache_record_worker_failures", "Record jobs that failed in the worker.",
              static_cast<double>(q.failed));
    }
    return out;
}

}  // namespace skippy::stage
