// Records: what a released lane notes as worth storing (record_positions, release), and the
// deferred export of those states (flush_lane, when the lane's state is about to be replaced
// or the scheduler has been idle for a while): one copy of the lane's state on the scheduler
// thread (llama.cpp's export), then paging, hashing, dedupe and insertion on the record worker
// (lane_record_job.cpp), within the record queue's byte budget.
#include <algorithm>
#include <chrono>

#include "cache/prefix_identity.h"
#include "stage/lane_record_job.h"
#include "stage/prefix_cache_stage.h"

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

std::vector<int32_t> PrefixCacheStage::record_positions(const PromptInfo& prompt,
                                                        int32_t n_restored,
                                                        bool turn_end_follows) const {
    const auto n = static_cast<int32_t>(prompt.tokens.size());
    // Every state in the body is exact for a later prompt that goes on past it (the restore
    // checks what that prompt's rule allows); the prompt end itself is recorded where this
    // same prompt could restore it.
    const int32_t body = body_end(prompt);
    const int32_t limit = rule_.restore_limit(body, n);
    std::vector<int32_t> bounds;
    for (int32_t b : prompt.message_boundaries) {
        if (b > n_restored && b <= body && b >= static_cast<int32_t>(policy_.min_tokens)) {
            bounds.push_back(b);
        }
    }
    std::sort(bounds.begin(), bounds.end());
    bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
    std::vector<int32_t> out;
    // The end of the prompt's body (without flash attention: the prompt end minus the 2
    // tokens a restore leaves to prefill) serves a request that repeats or extends this
    // prompt; a chat request records its turn end instead.
    if (!turn_end_follows && limit > n_restored &&
        limit >= static_cast<int32_t>(policy_.min_tokens)) {
        out.push_back(limit);
    }
    // The shortest new boundary (a system prompt end, shared by new conversations), then
    // the others longest first (where the next request of this conversation diverges).
    if (!bounds.empty()) {
        out.push_back(bounds.front());
        for (auto it = bounds.rbegin(); it != bounds.rend() - 1; ++it) {
            out.push_back(*it);
        }
    }
    out.erase(std::unique(out.begin(), out.end()), out.end());
    if (out.size() > policy_.record_limit) {
        out.resize(policy_.record_limit);
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

void PrefixCacheStage::release(runtime::InferenceContext& context, SeqId lane,
                               const PromptInfo& prompt, std::span<const Token> canonical,
                               bool turn_end) {
    LaneState& state = lanes_[static_cast<size_t>(lane)];
    state.last_used = ++clock_;
    state.busy = false;
    state.prompt.clear();
    state.chunk_ends.clear();
    state.tokens.assign(canonical.begin(), canonical.end());
    if (turn_end) {
        // The end of the turn was prefilled in body chunks from inside the body.
        state.body_end = static_cast<int32_t>(canonical.size());
        state.tail_exact = true;
    }
    const Pos held = context.seq_pos_max(lane) + 1;
    state.recurrent_at = held == static_cast<Pos>(canonical.size()) ? held : -1;
    if (!records_enabled(prompt) || canonical.empty()) {
        state.pending.clear();
        update_lane_gauge();
        return;
    }
    // Dense models take any position from the export; hybrid/recurrent ones only where a
    // checkpoint captured the recurrent state (the lane's own end included).
    std::vector<int32_t> positions;
    if (layout_.has_recurrent) {
        if (turn_end && state.recurrent_at == static_cast<int32_t>(canonical.size())) {
            if (auto blob = export_recurrent(context, lane)) {
                state.checkpoints.push_back({state.recurrent_at, std::move(blob)});
            }
        }
        for (const auto& c : state.checkpoints) {
            if (c.n_tokens <= state.body_end && c.n_tokens != state.turn_start) {
                positions.push_back(c.n_tokens);  // (tail checkpoints stay in the lane)
            }
        }
    } else {
        // One entry, the longest: a dense entry serves every prefix of itself (restore()).
        positions = record_positions(prompt, state.n_restored, turn_end);
        if (turn_end) {
            positions.push_back(static_cast<int32_t>(canonical.size()));
        } else if (state.turn_end_follows && state.body_end > state.n_restored) {
            // The end of this turn may never run (the lane is taken by another conversation
            // first): the next turn extends this prompt, whose body end it can restore.
            positions.push_back(state.body_end);
        }
        if (!positions.empty()) {
            positions = {*std::max_element(positions.begin(), positions.end())};
        }
    }
    // Keep the checkpoints inside what the lane holds (the lane reuses them in place).
    std::erase_if(state.checkpoints, [&](const Checkpoint& cp) {
        return cp.n_tokens > static_cast<int32_t>(state.tokens.size());
    });
    // The export is deferred: while the lane keeps this state (the same conversation comes
    // back to it) nothing needs copying at all. It happens before the lane's state is
    // replaced, or when the scheduler has been idle for a while (flush_lane).
    for (int32_t p : positions) {
        if (p >= static_cast<int32_t>(policy_.min_tokens) &&
            p <= static_cast<int32_t>(state.tokens.size())) {
            state.pending.push_back(p);
        }
    }
    std::sort(state.pending.begin(), state.pending.end());
    state.pending.erase(std::unique(state.pending.begin(), state.pending.end()),
                        state.pending.end());
    if (!layout_.has_recurrent && state.pending.size() > 1) {
        state.pending.erase(state.pending.begin(), state.pending.end() - 1);  // the longest
    }
    trim_checkpoints(state);
    update_lane_gauge();
}

void PrefixCacheStage::trim_checkpoints(LaneState& state) const {
    // Bounded memory: the newest few checkpoints (where the next request most likely
    // diverges) plus those that pending records still need.
    constexpr size_t kKeep = 4;
    std::sort(state.checkpoints.begin(), state.checkpoints.end(),
              [](const Checkpoint& a, const Checkpoint& b) { return a.n_tokens < b.n_tokens; });
    const size_t n = state.checkpoints.size();
    size_t i = 0;
    std::erase_if(state.checkpoints, [&](const Checkpoint& cp) {
        const bool recent = i++ + kKeep >= n;
        return !recent &&
               !std::binary_search(state.pending.begin(), state.pending.end(), cp.n_tokens);
    });
}

void PrefixCacheStage::flush_lane(runtime::InferenceContext& context, SeqId lane) {
    LaneState& state = lanes_[static_cast<size_t>(lane)];
    if (state.pending.empty()) {
        return;
    }
    std::vector<int32_t> positions = std::move(state.pending);
    state.pending.clear();
    submit_records(context, lane, state, std::move(positions), false);
    update_lane_gauge();
}

bool PrefixCacheStage::has_idle_work() {
    apply_forget_lanes();
    return std::any_of(lanes_.begin(), lanes_.end(),
                       [](const LaneState& s) { return !s.pending.empty(); });
}

void PrefixCacheStage::set_busy(bool busy) {
    if (disk_) {
        disk_->set_foreground_busy(busy);  // disk writes wait for the idle side (bounded)
    }
}

void PrefixCacheStage::idle(runtime::InferenceContext& context) {
    for (size_t lane = 0; lane < lanes_.size(); ++lane) {
        flush_lane(context, static_cast<SeqId>(lane));
    }
}

void PrefixCacheStage::submit_records(runtime::InferenceContext& context, SeqId lane,
                                      LaneState& state, std::vector<int32_t> positions,
                                      bool turn_end) {
    (void)turn_end;
    const cache::NamespaceId ns = state.ns;
    std::sort(positions.begin(), positions.end());
    positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
    // Cheap, non-blocking admission checks before paying for the export.
    std::vector<LaneRecordItem> items;
    for (int32_t p : positions) {
        if (p < static_cast<int32_t>(policy_.min_tokens) ||
            p > static_cast<int32_t>(state.tokens.size())) {
            continue;
        }
        const auto tokens = std::span<const Token>(state.tokens).first(static_cast<size_t>(p));
        const cache::PageId page = page_of(ns, tokens);
        RecordEvent event;
        event.payload = cache::to_string(layout_.kind);
        event.tokens = p;
        event.page_id = page.str();
        // (Unknown: the store is busy, e.g. the record worker inserting another lane's
        // records flushed in the same idle step. The record goes ahead; the worker finds an
        // entry that is already there and drops the copy. Skipping it lost the record.)
        if (exact_->try_contains(ns, tokens, page) == cache::Presence::Present) {
            event.decision = "already_present";
            telemetry_->record(event);
            continue;
        }
        LaneRecordItem item{p, page, {}};
        if (layout_.has_recurrent) {
            auto it = std::find_if(state.checkpoints.begin(), state.checkpoints.end(),
                                   [&](const Checkpoint& c) { return c.n_tokens == p; });
            if (it == state.checkpoints.end()) {
                continue;
            }
            item.recurrent = it->recurrent;
        }
        items.push_back(std::move(item));
    }
    if (items.empty()) {
        return;
    }
    const cache::PageId job_page = items.back().page;
    RecordEvent event;
    event.payload = cache::to_string(layout_.kind);
    event.tokens = items.back().n;
    event.page_id = job_page.str();
    const cache::Admission probe = queue_->probe(job_page);
    if (probe != cache::Admission::Queued) {
        event.decision = probe == cache::Admission::DroppedFull       ? "dropped_full"
                         : probe == cache::Admission::AlreadyInFlight ? "in_flight"
                                                                      : "worker_stopped";
        telemetry_->record(event);
        return;
    }
    const size_t estimate = context.state_size(lane, runtime::StateScope::Full);
    const uint64_t room = queue_room();
    if (estimate > room) {
        event.decision = "dropped_full";
        event.reason = "queued captures at their byte budget";
        telemetry_->record(event);
        return;
    }
    // Recycled buffers count against the same budget: the capture takes one that fits (the
    // last restore's import blob or capture, so that its pages are warm), the others give
    // way to it (before it is written, so that they are never resident together).
    std::vector<uint8_t> storage = buffers_->take(estimate, room);
    buffers_->trim_idle(room - std::min<uint64_t>(storage.capacity(), room));
    // The one copy on the scheduler thread: the lane's state as llama.cpp exports it.
    const auto t0 = Clock::now();
    auto captured = std::make_shared<CapturedState>();
    try {
        const auto held = static_cast<uint32_t>(context.seq_pos_max(lane) + 1);
        *captured = capture_state(context, lane, held, layout_, std::move(storage));
    } catch (const std::exception& e) {
        event.decision = "failed";
        event.reason = e.what();
        telemetry_->record(event);
        return;
    }
    event.export_ms = ms_since(t0);
    event.bytes = captured->blob.size();
    const uint64_t charged = captured->blob.capacity();
    queued_bytes_->fetch_add(charged);
    LaneRecord record;
    record.ns = ns;
    record.captured = std::move(captured);
    record.items = std::move(items);
    record.tokens = state.tokens;
    auto queued_bytes = queued_bytes_;
    auto run = make_lane_record_job(
        std::move(record), *exact_, disk_.get(), *telemetry_, layout_, buffers_,
        [queued_bytes, charged] { queued_bytes->fetch_sub(charged); }, redis_.get());
    // (the release runs when the job is destroyed: after it ran, or when it was dropped)
    const cache::Admission admission = queue_->submit(cache::RecordJob{job_page, std::move(run)});

    event.decision = admission == cache::Admission::Queued ? "queued" : "dropped_full";
    telemetry_->record(event);
}

}  // namespace skippy::stage
