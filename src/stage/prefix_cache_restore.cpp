// Restore (plan() calls it): the longest exact prefix of the prompt into the lane, from the
// lane itself, a peer lane (prefix_cache_peer.cpp) or a stored entry, longest first; a
// failed import clears the lane and quarantines the entry.
#include <algorithm>
#include <chrono>

#include "stage/prefix_cache_stage.h"

namespace skippy::stage {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

int32_t PrefixCacheStage::restore(runtime::InferenceContext& context, SeqId lane,
                                  const PromptInfo& prompt, const cache::NamespaceId& ns,
                                  LookupEvent& event) {
    LaneState& state = lanes_[static_cast<size_t>(lane)];
    const auto n = static_cast<int32_t>(prompt.tokens.size());
    const int32_t b = body_end(prompt);
    const int32_t limit = rule_.restore_limit(b, n);
    const auto t0 = Clock::now();
    const int32_t in_lane = lane_match(state, ns, prompt);
    const int32_t lane_common =
        state.has_ns && state.ns == ns ? common_prefix(state.tokens, prompt.tokens, limit) : 0;
    std::optional<cache::ExactHit> hit;
    auto lookup = [&](int32_t len) {
        hit.reset();
        if (len >= static_cast<int32_t>(policy_.min_tokens)) {
            // A Common hit is trimmed after import.
            hit =
                exact_->acquire_longest(ns, prompt.tokens.first(static_cast<size_t>(len)), match_);
            if (hit && hit->stored_len > context.n_ctx_seq()) {
                hit.reset();  // recorded by a server with longer lanes
            }
        }
    };
    if (in_lane < limit) {
        lookup(limit);  // (a lane that holds all the prompt can take needs no store lookup)
    }
    if (hit && rule_.has_tail() && !rule_.can_restore(static_cast<int32_t>(hit->len), b, n)) {
        // Stored entries are all body: one that ends just before the body end leaves a
        // rest too short for the body's chunks.
        if (match_ == cache::PrefixMatch::Common) {
            hit->len =
                static_cast<size_t>(rule_.best_restore(static_cast<int32_t>(hit->len), b, n));
            if (hit->len < policy_.min_tokens) {
                hit.reset();
            }
        } else {
            lookup(b - rule_.body_min);
        }
    }
    const auto stored = hit ? static_cast<int32_t>(hit->len) : 0;
    // Another lane's exact state (dense): busy with a prompt that shares the prefix, or idle.
    const PeerMatch peer = best_peer(lane, ns, prompt);
    event.lookup_ms = ms_since(t0);
    event.matched_tokens = std::max({lane_common, stored, peer.tokens});
    event.diverged_at = std::max({diverged_at(prompt, ns), stored, peer.tokens, in_lane});
    if (in_lane > 0 && in_lane >= stored && in_lane >= peer.tokens) {
        // The lane holds the prefix already: keep it, drop what follows. Hybrid/recurrent
        // lanes whose state moved on get the recurrent state of a checkpoint taken there.
        bool ok = true;
        if (layout_.has_recurrent && state.recurrent_at != in_lane) {
            const auto t1 = Clock::now();
            auto it = std::find_if(state.checkpoints.begin(), state.checkpoints.end(),
                                   [&](const Checkpoint& cp) { return cp.n_tokens == in_lane; });
            ok = it != state.checkpoints.end() &&
                 context.state_import(*it->recurrent, lane,
                                      layout_.has_attention ? runtime::StateScope::PartialOnly
                                                            : runtime::StateScope::Full);
            event.import_ms = ms_since(t1);
        }
        if (ok && context.seq_remove(lane, static_cast<Pos>(in_lane), -1) &&
            context.seq_pos_max(lane) == static_cast<Pos>(in_lane) - 1) {
            event.decision = CacheDecision::ExactHit;
            event.tier = CacheTier::Lane;
            return in_lane;
        }
        flush_lane(context, lane);
        context.seq_clear(lane);  // could not trim: fall back to the stored entries
    }
    // Whatever follows replaces the lane's state: records still waiting for it go first.
    flush_lane(context, lane);
    if (peer.tokens > stored && peer.tokens > in_lane) {
        if (copy_from_peer(context, lane, peer, event)) {
            event.decision = CacheDecision::ExactHit;
            event.tier = CacheTier::Lane;
            return peer.tokens;
        }
    }
    if (stored < static_cast<int32_t>(policy_.min_tokens)) {
        context.seq_clear(lane);
        event.decision = CacheDecision::Miss;
        event.reason = why_missed(prompt, ns, limit, event);
        return 0;
    }
    event.page_id = hit->page.str();
    event.bytes = hit->payload_bytes;
    // Hybrid/recurrent: the lane may hold the attention KV of the entry's prefix already;
    // then only the recurrent state is imported.
    const bool recurrent_only = layout_.has_recurrent && layout_.has_attention &&
                                lane_common >= stored && lane_serves(state, stored, b, n) &&
                                hit->descriptor.recurrent_bytes > 0;
    if (!recurrent_only) {
        context.seq_clear(lane);
    }
    std::string reason;
    if (import_entry(context, lane, *hit, recurrent_only, reason, event)) {
        event.decision = CacheDecision::ExactHit;
        event.tier = recurrent_only ? CacheTier::Lane : CacheTier::Ram;
        std::lock_guard<std::mutex> lock(promoted_mutex_);
        if (auto it = std::find_if(promoted_.begin(), promoted_.end(),
                                   [&](const Promoted& p) { return p.page == hit->page; });
            it != promoted_.end()) {
            event.tier = it->tier;  // promoted from disk or Redis for this request
            promoted_.erase(it);
        }
        return stored;
    }
    context.seq_clear(lane);
    event.decision = CacheDecision::Error;
    event.reason = "restore_failed";
    event.error = reason;
    const auto status = exact_->quarantine(*hit);
    if (redis_ && hit->len == hit->stored_len) {
        // Promoted from Redis for this request: its bytes are bad there too.
        std::lock_guard<std::mutex> lock(promoted_mutex_);
        if (auto it = std::find_if(promoted_.begin(), promoted_.end(),
                                   [&](const Promoted& p) { return p.page == hit->page; });
            it != promoted_.end() && it->tier == CacheTier::Redis) {
            redis_->quarantine(ns, prompt.tokens.first(hit->stored_len));
            promoted_.erase(it);
        }
    }
    hit.reset();  // the last lease: the entry goes now
    event.quarantined =
        status == cache::QuarantineStatus::Removed || status == cache::QuarantineStatus::Deferred;
    return 0;
}

int32_t PrefixCacheStage::diverged_at(const PromptInfo& prompt,
                                      const cache::NamespaceId& ns) const {
    // The nearest prefix this tenant has anywhere: a lane (what it holds), a stored entry
    // (RAM, disk), whatever could be restored from it. Never another tenant's.
    const auto n = static_cast<int32_t>(prompt.tokens.size());
    int32_t best = 0;
    for (const LaneState& other : lanes_) {
        if (other.has_ns && other.ns == ns) {
            best = std::max(best, common_prefix(other.tokens, prompt.tokens, n));
        }
    }
    if (auto p = exact_->peek_longest(ns, prompt.tokens, cache::PrefixMatch::Common)) {
        best = std::max(best, static_cast<int32_t>(p->len));
    }
    if (disk_) {
        if (auto p = disk_->peek_longest(ns, prompt.tokens, cache::PrefixMatch::Common)) {
            best = std::max(best, static_cast<int32_t>(p->len));
        }
    }
    return best;
}

std::string PrefixCacheStage::why_missed(const PromptInfo& prompt, const cache::NamespaceId& ns,
                                         int32_t limit, LookupEvent& event) const {
    const auto min = static_cast<int32_t>(policy_.min_tokens);
    if (limit < min) {
        return "below_min_tokens";  // too short to restore anything (--cache-min-tokens)
    }
    // What this tenant had and lost: evicted or quarantined, in RAM or on disk (the disk is
    // where an entry is lost for good when the tier is on).
    std::optional<cache::GhostMatch> lost;
    if (disk_) {
        if (auto g = disk_->forgotten_longest(ns, prompt.tokens, static_cast<size_t>(min))) {
            lost = g;
            event.miss_tier = CacheTier::Disk;
        }
    }
    if (auto g = exact_->forgotten_longest(ns, prompt.tokens, static_cast<size_t>(min));
        g && (!lost || g->len > lost->len)) {
        lost = g;
        event.miss_tier = CacheTier::Ram;
    }
    if (lost && static_cast<int32_t>(lost->len) > event.diverged_at) {
        return lost->cause == cache::GhostCause::Quarantined ? "quarantined" : "evicted";
    }
    event.miss_tier = CacheTier::None;
    if (event.diverged_at >= min) {
        // This tenant has a prefix of the prompt, but nothing restorable inside it (a model
        // with recurrent state restores only where a state was taken).
        return "diverged";
    }
    // Another tenant's prefix (its lanes, RAM, disk): only the fact is reported, never its
    // length or tokens.
    const auto n = static_cast<int32_t>(prompt.tokens.size());
    int32_t elsewhere = 0;
    for (const LaneState& other : lanes_) {
        if (other.has_ns && !(other.ns == ns)) {
            elsewhere = std::max(elsewhere, common_prefix(other.tokens, prompt.tokens, n));
        }
    }
    if (elsewhere < min) {
        elsewhere =
            std::max(elsewhere, static_cast<int32_t>(exact_->longest_elsewhere(ns, prompt.tokens)));
    }
    if (elsewhere < min && disk_) {
        elsewhere =
            std::max(elsewhere, static_cast<int32_t>(disk_->longest_elsewhere(ns, prompt.tokens)));
    }
    return elsewhere >= min ? "namespace" : "never_seen";
}

bool PrefixCacheStage::import_entry(runtime::InferenceContext& context, SeqId lane,
                                    const cache::ExactHit& hit, bool recurrent_only,
                                    std::string& reason, LookupEvent& event) {
    const auto n = static_cast<uint32_t>(hit.stored_len);
    if (failing_restores_.load(std::memory_order_relaxed) > 0 &&
        failing_restores_.fetch_sub(1, std::memory_order_relaxed) > 0) {
        reason = "injected fault (SKIPPY_TEST_FAIL_RESTORES)";
        return false;
    }
    const auto t1 = Clock::now();
    // The entry's blocks are read where they are: verified in place, then decoded straight
    // into the import blob (no joined copy of the payload).
    const std::optional<cache::PayloadSnapshot> snapshot = exact_->snapshot(hit.lease);
    const cache::ReconstructError error =
        snapshot ? snapshot->verify() : cache::ReconstructError::MissingBlock;
    event.reconstruct_ms = ms_since(t1);
    if (error != cache::ReconstructError::None) {
        reason = std::string("reconstruct failed: ") + cache::to_string(error);
        return false;
    }
    const auto t2 = Clock::now();
    const PayloadPart part = recurrent_only ? PayloadPart::RecurrentOnly : PayloadPart::Full;
    // The import blob is a recycled buffer (counted against the cache's byte budget while
    // idle), back in the pool for the next capture or restore once imported.
    std::vector<uint8_t> blob = buffers_->take_empty();
    const bool decoded =
        decode_payload(snapshot->parts(), hit.descriptor, n, layout_, blob, &reason, part);
    const auto scope =
        recurrent_only ? runtime::StateScope::PartialOnly : runtime::StateScope::Full;
    bool ok = decoded && context.state_import(blob, lane, scope);
    buffers_->give(std::move(blob));
    buffers_->trim_idle(queue_room());
    if (!decoded) {
        return false;
    }
    const auto used = static_cast<Pos>(hit.len);
    if (ok && (recurrent_only || hit.len < hit.stored_len)) {
        ok = context.seq_remove(lane, used, -1);  // the entry goes on past the prompt
    }
    event.import_ms = ms_since(t2);
    if (!ok || context.seq_pos_max(lane) != used - 1) {
        reason = ok ? "imported state has the wrong length" : "state import failed";
        return false;
    }
    return true;
}

}  // namespace skippy::stage
