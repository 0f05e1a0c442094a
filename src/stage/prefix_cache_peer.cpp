// Peer lanes: a request whose prefix another lane holds, or is prefilling right now, copies
// that lane's exact state instead of computing it again. A lane's state of its first p tokens
// is exact for another prompt under the same rule as a stored entry (plan.h): computed in the
// body regime, and restorable for the new prompt's body end. Concurrent requests that share a
// prompt head (a few-shot prefix, a system prompt) therefore prefill it once: the scheduler
// holds back a request while a busy lane prefills the head it shares (waits_for_peer), then
// the request copies it (best_peer + copy_from_peer, inside restore()). The copy is
// llama.cpp's state export of the peer's sequence imported into the new lane, trimmed to the
// prefix: both lanes belong to the scheduler thread, which runs every hook.
//
// Dense lanes serve any prefix they have prefilled (attention KV is trimmed). A hybrid or
// recurrent lane's recurrent state exists only where its prefill is, so the waiting request
// names a point of the busy lane's prefill (pause_point: one of its chunk ends, or a split of
// a body chunk into two exact ones), the lane pauses there (pauses(), asked again before every
// step while the request waits and could start), and the request copies
// the whole state at that moment; the busy lane keeps that state as a checkpoint, recorded
// with its others, so later requests restore it from the store.
#include <chrono>

#include "stage/prefix_cache_stage.h"

namespace skippy::stage {

namespace {

// A wait pays off only for a prefix this much longer than what the request gets now (a
// request that shares a stored system prompt and a few template tokens with a busy lane
// does not wait for that lane's next chunk).
constexpr int32_t kPeerWaitMinTokens = 64;

}  // namespace

int32_t PrefixCacheStage::busy_lane_reach(const LaneState& lane, const cache::NamespaceId& ns,
                                          std::span<const Token> prompt, int32_t limit) const {
    if (!lane.busy || !lane.has_ns || !(lane.ns == ns)) {
        return 0;
    }
    return std::min(common_prefix(lane.prompt, prompt, limit), lane.body_end);
}

PrefixCacheStage::PeerMatch PrefixCacheStage::best_peer(SeqId lane, const cache::NamespaceId& ns,
                                                        const PromptInfo& prompt) const {
    PeerMatch best;
    if (layout_.has_recurrent) {
        // Only a busy lane paused exactly where its state serves this prompt.
        if (const PeerPause pause = best_pause(ns, prompt); pause.ready && pause.lane != lane) {
            best = {pause.lane, pause.tokens};
        }
        return best.tokens >= static_cast<int32_t>(policy_.min_tokens) ? best : PeerMatch{};
    }
    const auto n = static_cast<int32_t>(prompt.tokens.size());
    const int32_t b = body_end(prompt);
    for (size_t i = 0; i < lanes_.size(); ++i) {
        if (static_cast<SeqId>(i) == lane) {
            continue;
        }
        const LaneState& peer = lanes_[i];
        int32_t match = 0;
        if (peer.busy) {
            const int32_t reach = busy_lane_reach(peer, ns, prompt.tokens, n - 1);
            match = rule_.best_restore(std::min(reach, peer.prefilled), b, n);
        } else {
            match = lane_match(peer, ns, prompt);
        }
        if (match > best.tokens) {
            best = {static_cast<SeqId>(i), match};
        }
    }
    if (best.tokens < static_cast<int32_t>(policy_.min_tokens)) {
        best = {};
    }
    return best;
}

bool PrefixCacheStage::copy_from_peer(runtime::InferenceContext& context, SeqId lane,
                                      const PeerMatch& peer, LookupEvent& event) {
    const auto t0 = std::chrono::steady_clock::now();
    context.seq_clear(lane);
    // Through a recycled buffer: a fresh one would page-fault on this thread (~2.5 ms/MiB).
    std::vector<uint8_t> blob =
        buffers_->take(context.state_size(peer.lane, runtime::StateScope::Full));
    const bool exported = context.state_export_into(peer.lane, runtime::StateScope::Full, blob);
    const bool ok = exported && context.state_import(blob, lane, runtime::StateScope::Full) &&
                    context.seq_remove(lane, static_cast<Pos>(peer.tokens), -1) &&
                    context.seq_pos_max(lane) == static_cast<Pos>(peer.tokens) - 1;
    buffers_->give(std::move(blob));
    LaneState& source = lanes_[static_cast<size_t>(peer.lane)];
    if (ok && layout_.has_recurrent && source.busy && source.prefilled == peer.tokens &&
        std::none_of(source.checkpoints.begin(), source.checkpoints.end(),
                     [&](const Checkpoint& cp) { return cp.n_tokens == peer.tokens; })) {
        // A state that several requests share: recorded with the peer's other checkpoints.
        if (auto recurrent = export_recurrent(context, peer.lane)) {
            source.checkpoints.push_back({peer.tokens, std::move(recurrent)});
        }
    }
    event.import_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!ok) {
        context.seq_clear(lane);
    }
    return ok;
}

bool PrefixCacheStage::waits_for_peer(const PromptInfo& prompt,
                                      std::span<const std::span<const Token>> starting) const {
    if (!lookups_enabled(prompt)) {
        return false;
    }
    if (layout_.has_recurrent) {
        return waits_for_recurrent_peer(prompt, starting);
    }
    const cache::NamespaceId ns = namespace_for(prompt.cache_namespace);
    const auto n = static_cast<int32_t>(prompt.tokens.size());
    // What the request gets now (an idle lane's match, what a busy lane has prefilled of
    // the shared head, which covers what the store gave it), and what a busy lane will have.
    int32_t have = 0;
    int32_t coming = 0;
    for (const LaneState& lane : lanes_) {
        if (lane.busy) {
            const int32_t reach = busy_lane_reach(lane, ns, prompt.tokens, n - 1);
            coming = std::max(coming, reach);
            have = std::max(have, std::min(reach, lane.prefilled));
        } else {
            have = std::max(have, lane_match(lane, ns, prompt));
        }
    }
    // A request starting in this step will prefill the head it shares with this one, unless
    // the store has it, in which case this request restores it too (the store is only
    // peeked at when its lock is free: the scheduler holds the queue lock here).
    int32_t shared_with_starting = 0;
    for (const auto& other : starting) {
        shared_with_starting =
            std::max(shared_with_starting, common_prefix(other, prompt.tokens, n - 1));
    }
    if (shared_with_starting - have >= kPeerWaitMinTokens) {
        const cache::TryExactPeek peek = exact_->try_peek_longest(
            ns, prompt.tokens.first(static_cast<size_t>(shared_with_starting)), match_);
        const int32_t stored = peek.hit ? static_cast<int32_t>(peek.hit->len) : 0;
        have = std::max(have, stored);
        coming = std::max(coming, shared_with_starting);
    }
    return worth_waiting(coming, have);
}

bool PrefixCacheStage::worth_waiting(int32_t coming, int32_t have) const {
    return coming >= 2 * static_cast<int32_t>(policy_.min_tokens) &&
           coming - have >= kPeerWaitMinTokens;
}

int32_t PrefixCacheStage::pause_point(const LaneState& lane, int32_t want, int32_t b,
                                      int32_t n) const {
    // Not past the lane's body (tail states are exact only for its own body end), nor at its
    // prompt end (from there on the lane decodes: its recurrent state moves on).
    want = std::min({want, lane.body_end, static_cast<int32_t>(lane.prompt.size()) - 1});
    int32_t best = 0;
    auto consider = [&](int32_t r) {
        if (r > best && r <= want && rule_.can_restore(r, b, n)) {
            best = r;
        }
    };
    consider(lane.prefilled);
    int32_t start = lane.prefilled;
    for (const int32_t end : lane.chunk_ends) {
        if (end <= lane.prefilled) {
            continue;
        }
        if (start >= want) {
            break;
        }
        consider(end);
        if (end <= lane.body_end) {
            // Any split of the body into chunks of at least the body minimum is exact.
            const auto split = [&](int32_t r) {
                if (r - start >= rule_.body_min && end - r >= rule_.body_min) {
                    consider(r);
                }
            };
            const int32_t last = std::min(want, end - rule_.body_min);
            split(last);
            split(std::min(last, b));                   // the prompt's own body end
            split(std::min(last, b - rule_.body_min));  // or a full body chunk before it
        }
        start = end;
    }
    return best;
}

PrefixCacheStage::PeerPause PrefixCacheStage::best_pause(const cache::NamespaceId& ns,
                                                         const PromptInfo& prompt) const {
    PeerPause best;
    const auto n = static_cast<int32_t>(prompt.tokens.size());
    const int32_t b = body_end(prompt);
    for (size_t i = 0; i < lanes_.size(); ++i) {
        const LaneState& lane = lanes_[i];
        const int32_t reach = busy_lane_reach(lane, ns, prompt.tokens, n - 1);
        const int32_t at = reach > best.tokens ? pause_point(lane, reach, b, n) : 0;
        if (at > best.tokens) {
            best = {static_cast<SeqId>(i), at, at == lane.prefilled};
        }
    }
    return best;
}

int32_t PrefixCacheStage::available_now(const cache::NamespaceId& ns, const PromptInfo& prompt,
                                        int32_t up_to) const {
    int32_t have = 0;
    for (const LaneState& lane : lanes_) {
        if (!lane.busy) {
            have = std::max(have, lane_match(lane, ns, prompt));
        }
    }
    if (up_to - have >= kPeerWaitMinTokens) {
        const cache::TryExactPeek peek =
            exact_->try_peek_longest(ns, prompt.tokens.first(static_cast<size_t>(up_to)), match_);
        have = std::max(have, peek.hit ? static_cast<int32_t>(peek.hit->len) : 0);
    }
    return have;
}

bool PrefixCacheStage::waits_for_recurrent_peer(
    const PromptInfo& prompt, std::span<const std::span<const Token>> starting) const {
    const cache::NamespaceId ns = namespace_for(prompt.cache_namespace);
    const auto n = static_cast<int32_t>(prompt.tokens.size());
    // A busy lane that will pause where this request can copy it (or is there now: then the
    // request starts, and restore() copies it).
    const PeerPause pause = best_pause(ns, prompt);
    if (pause.tokens > 0 && worth_waiting(pause.tokens, available_now(ns, prompt, pause.tokens))) {
        return !pause.ready;
    }
    // A request starting in this step will prefill the head it shares with this one: once it
    // has a plan, the next step names the pause (a step's first chunk is at most one batch,
    // which the shared head usually outlasts; if not, the request starts then).
    int32_t shared = 0;
    for (const auto& other : starting) {
        shared = std::max(shared, common_prefix(other, prompt.tokens, n - 1));
    }
    return shared > pause.tokens && worth_waiting(shared, available_now(ns, prompt, shared));
}

PrefixCacheStage::PeerPause PrefixCacheStage::pause_for(const PromptInfo& prompt) const {
    if (!layout_.has_recurrent || !lookups_enabled(prompt)) {
        return {};
    }
    const cache::NamespaceId ns = namespace_for(prompt.cache_namespace);
    const PeerPause pause = best_pause(ns, prompt);
    if (pause.tokens == 0 || pause.ready ||
        !worth_waiting(pause.tokens, available_now(ns, prompt, pause.tokens))) {
        return {};
    }
    return pause;
}

std::vector<int32_t> PrefixCacheStage::pauses(std::span<const PromptInfo> waiting) {
    std::vector<int32_t> holds(lanes_.size(), -1);
    for (const PromptInfo& prompt : waiting) {
        const PeerPause pause = pause_for(prompt);
        if (pause.tokens > 0) {
            int32_t& hold = holds[static_cast<size_t>(pause.lane)];
            hold = hold < 0 ? pause.tokens : std::min(hold, pause.tokens);  // the first reached
        }
    }
    return holds;
}

}  // namespace skippy::stage
