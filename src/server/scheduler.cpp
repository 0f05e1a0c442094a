#include "server/scheduler.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <set>
#include <utility>

#include "server/text_output.h"

namespace skippy::server {

using Clock = std::chrono::steady_clock;

namespace {
double ms_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace

struct Scheduler::Pending {
    GenerationRequest request;
    std::shared_ptr<GenerationStream> stream;
    Clock::time_point enqueued;
};

struct Scheduler::Slot {
    runtime::SeqId lane = 0;
    bool active = false;
    GenerationRequest request;
    std::shared_ptr<GenerationStream> stream;
    std::unique_ptr<runtime::Sampler> sampler;
    stage::PromptInfo prompt_info;
    std::vector<runtime::Token> lane_tokens;  // tokens whose state is in the lane
    std::vector<int32_t> checkpoints;         // prefill pause positions, ascending
    std::set<int32_t> is_checkpoint;          // the pauses where the stage records
    size_t next_checkpoint = 0;
    int32_t deferred_checkpoint = 0;  // prompt-end checkpoint, recorded after the first token
    bool generating = false;
    bool post_turn = false;            // reply delivered; prefilling the canonical end of the turn
    runtime::Token pending_token = 0;  // sampled, not decoded yet
    int32_t n_sampled = 0;             // tokens sampled, including a final end-of-generation token
    int32_t n_reply_tokens = 0;        // tokens of the reply (reported as completion_tokens)
    std::optional<TextOutput> output;
    std::vector<runtime::Token> unsent_tokens;
    GenerationStats stats;
    Clock::time_point enqueued, started;
};

Scheduler::Scheduler(const runtime::Model& model, SchedulerOptions options,
                     std::unique_ptr<stage::StageBackend> stage)
    : model_(model), options_(std::move(options)), stage_(std::move(stage)) {
    if (options_.lanes == 0) {
        throw std::invalid_argument("lanes must be >= 1");
    }
    if (!stage_) {
        stage_ = std::make_unique<stage::NoCacheStage>();
    }
    options_.context.n_seq_max = options_.lanes + stage_->spare_sequences();
    context_ = std::make_unique<runtime::InferenceContext>(model_, options_.context);
    n_ctx_ = context_->n_ctx();
    canonical_splits_ = model_.kind() == runtime::ModelKind::Hybrid ||
                        model_.kind() == runtime::ModelKind::Recurrent;
    options_.recurrent_split_stride =
        std::min(options_.recurrent_split_stride, options_.context.n_batch);
    stage_->attach(*context_, static_cast<runtime::SeqId>(options_.lanes), options_.lanes);
    for (uint32_t i = 0; i < options_.lanes; ++i) {
        auto slot = std::make_unique<Slot>();
        slot->lane = static_cast<runtime::SeqId>(i);
        slots_.push_back(std::move(slot));
    }
    thread_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::stop() {
    {
        std::lock_guard<std::mutex> lock(queue_mutex_);
        stopping_ = true;
    }
    queue_cv_.notify_all();
    if (thread_.joinable()) {
        thread_.join();
    }
}

Admission Scheduler::submit(GenerationRequest request, std::shared_ptr<GenerationStream> stream) {
    {
        std::lock_guard<std::mutex> lock(queue_mutex_);
        if (stopping_) {
            return Admission::Stopped;
        }
        if (incoming_.size() >= options_.max_queue_depth) {
            rejected_.fetch_add(1, std::memory_order_relaxed);
            return Admission::QueueFull;
        }
        incoming_.push_back(Pending{std::move(request), std::move(stream), Clock::now()});
        queued_.store(static_cast<uint32_t>(incoming_.size()), std::memory_order_relaxed);
    }
    queue_cv_.notify_one();
    return Admission::Accepted;
}

SchedulerStats Scheduler::stats() const {
    SchedulerStats s;
    s.lanes = options_.lanes;
    s.lanes_busy = lanes_busy_.load();
    s.queued = queued_.load();
    s.requests_completed = completed_.load();
    s.requests_cancelled = cancelled_.load();
    s.requests_failed = failed_.load();
    s.requests_rejected = rejected_.load();
    s.prompt_tokens = prompt_tokens_.load();
    s.cached_tokens = cached_tokens_.load();
    s.completion_tokens = completion_tokens_.load();
    s.decode_calls = decode_calls_.load();
    return s;
}

void Scheduler::run() {
    for (;;) {
        std::deque<Pending> admitted;
        {
            std::unique_lock<std::mutex> lock(queue_mutex_);
            const bool any_active = lanes_busy_.load() > 0;
            if (!any_active) {
                queue_cv_.wait(lock, [&] { return stopping_ || !incoming_.empty(); });
            }
            if (stopping_) {
                break;
            }
            // Drop requests whose client left or that waited too long.
            const auto now = Clock::now();
            for (auto it = incoming_.begin(); it != incoming_.end();) {
                if (it->stream->cancelled()) {
                    cancelled_.fetch_add(1);
                    it = incoming_.erase(it);
                } else if (now - it->enqueued > options_.queue_timeout) {
                    it->stream->fail(503, "server_overloaded",
                                     "request waited too long for a free lane");
                    failed_.fetch_add(1);
                    it = incoming_.erase(it);
                } else {
                    ++it;
                }
            }
            uint32_t free_lanes = options_.lanes - lanes_busy_.load();
            for (auto it = incoming_.begin(); free_lanes > 0 && it != incoming_.end();) {
                if (continues_post_turn(it->request.prompt)) {
                    ++it;  // admitted once that lane has recorded the end of its turn
                    continue;
                }
                admitted.push_back(std::move(*it));
                it = incoming_.erase(it);
                --free_lanes;
            }
            queued_.store(static_cast<uint32_t>(incoming_.size()));
        }
        admit_pending(admitted);
        if (lanes_busy_.load() > 0) {
            step();
        }
    }
    // Shutting down: nothing more will be served.
    for (auto& slot : slots_) {
        if (slot->active) {
            fail_slot(*slot, 503, "server_shutting_down", "server is shutting down");
        }
    }
    std::lock_guard<std::mutex> lock(queue_mutex_);
    for (auto& pending : incoming_) {
        pending.stream->fail(503, "server_shutting_down", "server is shutting down");
    }
    incoming_.clear();
}

void Scheduler::admit_pending(std::deque<Pending>& pending) {
    for (auto& item : pending) {
        for (auto& slot : slots_) {
            if (!slot->active) {
                start_slot(*slot, std::move(item));
                break;
            }
        }
    }
}

bool Scheduler::start_slot(Slot& slot, Pending&& pending) {
    slot.request = std::move(pending.request);
    slot.stream = std::move(pending.stream);
    slot.enqueued = pending.enqueued;
    slot.started = Clock::now();
    slot.stats = GenerationStats{};
    slot.stats.queue_ms = ms_between(slot.enqueued, slot.started);
    const auto& prompt = slot.request.prompt;
    if (prompt.empty() || prompt.size() >= n_ctx_) {
        slot.stream->fail(400, "invalid_request_error", "prompt does not fit the context");
        failed_.fetch_add(1);
        return false;
    }
    try {
        slot.sampler = std::make_unique<runtime::Sampler>(model_, slot.request.sampling);
    } catch (const std::exception& e) {
        slot.stream->fail(400, "invalid_request_error", e.what());
        failed_.fetch_add(1);
        return false;
    }
    slot.active = true;
    lanes_busy_.fetch_add(1);
    const auto room = static_cast<int32_t>(n_ctx_ - prompt.size());
    slot.request.max_tokens = std::clamp(slot.request.max_tokens, 1, room);
    slot.prompt_info = stage::PromptInfo{};
    slot.prompt_info.tokens = std::span<const runtime::Token>(prompt);
    slot.prompt_info.message_boundaries = slot.request.message_boundaries;
    slot.prompt_info.cache_namespace = slot.request.cache_namespace;
    slot.prompt_info.cache_enabled = slot.request.cache_enabled;
    slot.prompt_info.track_turn_end = static_cast<bool>(slot.request.render_turn_end) &&
                                      slot.request.cache_enabled && stage_->tracks_turn_end();
    slot.output.emplace(slot.request.stop);
    slot.unsent_tokens.clear();
    slot.generating = false;
    slot.post_turn = false;
    slot.n_sampled = 0;
    slot.n_reply_tokens = 0;
    slot.next_checkpoint = 0;
    slot.deferred_checkpoint = 0;

    if (!stage_->keeps_lane_state()) {
        context_->seq_clear(slot.lane);  // otherwise the stage reuses or clears it
    }
    stage::RestoreResult restored;
    try {
        restored = stage_->restore(*context_, slot.lane, slot.prompt_info);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "skippy: restore failed, falling back to prefill: %s\n", e.what());
        restored = stage::RestoreResult{0, "restore_error"};
    }
    const auto max_restorable = static_cast<int32_t>(prompt.size()) - 1;
    if (restored.n_restored < 0 || restored.n_restored > max_restorable ||
        context_->seq_pos_max(slot.lane) != restored.n_restored - 1) {
        context_->seq_clear(slot.lane);
        restored.n_restored = 0;
    }
    slot.lane_tokens.assign(prompt.begin(), prompt.begin() + restored.n_restored);
    slot.stats.prompt_tokens = static_cast<int32_t>(prompt.size());
    slot.stats.cached_tokens = restored.n_restored;
    slot.stats.cache_decision = restored.decision;
    slot.checkpoints = stage_->checkpoint_positions(slot.prompt_info, restored.n_restored);
    slot.is_checkpoint.clear();
    slot.is_checkpoint.insert(slot.checkpoints.begin(), slot.checkpoints.end());
    // Prefill pauses at checkpoints (where the stage exports state) and, for hybrid and
    // recurrent models, at the canonical split positions (see SchedulerOptions).
    const auto n_prompt = static_cast<int32_t>(prompt.size());
    if (canonical_splits_ && options_.recurrent_split_stride > 0) {
        const auto stride = static_cast<int32_t>(options_.recurrent_split_stride);
        for (int32_t p = stride; p < n_prompt; p += stride) {
            slot.checkpoints.push_back(p);
        }
        for (int32_t b : slot.request.message_boundaries) {
            slot.checkpoints.push_back(b);
        }
    }

    std::sort(slot.checkpoints.begin(), slot.checkpoints.end());
    std::erase_if(slot.checkpoints, [&](int32_t p) {
        return p <= restored.n_restored || p > static_cast<int32_t>(prompt.size());
    });
    slot.checkpoints.erase(std::unique(slot.checkpoints.begin(), slot.checkpoints.end()),
                           slot.checkpoints.end());
    return true;
}

void Scheduler::release_slot(Slot& slot, std::span<const runtime::Token> canonical) {
    if (!canonical.empty() && stage_->keeps_lane_state()) {
        stage_->lane_released(slot.lane, canonical);  // the lane keeps its state
    } else {
        context_->seq_clear(slot.lane);
        stage_->lane_released(slot.lane, {});
    }
    slot.active = false;
    slot.post_turn = false;
    slot.sampler.reset();
    slot.stream.reset();
    slot.lane_tokens.clear();
    slot.output.reset();
    lanes_busy_.fetch_sub(1);
}

void Scheduler::fail_slot(Slot& slot, int status, const std::string& type,
                          const std::string& message) {
    slot.stream->fail(status, type, message);
    failed_.fetch_add(1);
    release_slot(slot);
}

void Scheduler::finish_slot(Slot& slot, const std::string& finish_reason) {
    std::string rest = slot.output->take_rest();
    if (!rest.empty() || !slot.unsent_tokens.empty()) {
        slot.stream->push_delta(std::move(rest), std::move(slot.unsent_tokens));
        slot.unsent_tokens.clear();
    }
    slot.stats.finish_reason = finish_reason;
    slot.stats.completion_tokens = slot.n_reply_tokens;
    slot.stats.total_ms = ms_between(slot.enqueued, Clock::now());
    prompt_tokens_.fetch_add(static_cast<uint64_t>(slot.stats.prompt_tokens));
    cached_tokens_.fetch_add(static_cast<uint64_t>(slot.stats.cached_tokens));
    completion_tokens_.fetch_add(static_cast<uint64_t>(slot.stats.completion_tokens));
    completed_.fetch_add(1);
    // The client has its answer before the cache records the lane.
    slot.stream->finish(slot.stats);
    if (slot.deferred_checkpoint > 0) {
        record_checkpoint(slot, std::exchange(slot.deferred_checkpoint, 0));
    }
    try {
        stage_->on_finish(*context_, slot.lane, slot.lane_tokens, slot.prompt_info);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "skippy: record at finish failed: %s\n", e.what());
    }
    if (!start_turn_end(slot)) {
        // The prompt was prefilled canonically; the reply tokens after it were not.
        release_slot(slot, slot.request.prompt);
    }
}

bool Scheduler::continues_post_turn(const std::vector<runtime::Token>& prompt) const {
    for (const auto& slot : slots_) {
        // Waiting pays off only when the new prompt extends the turn being recorded (the
        // client sent the reply back unchanged).
        const auto& turn = slot->request.prompt;
        if (slot->active && slot->post_turn && prompt.size() > turn.size() &&
            std::equal(turn.begin(), turn.end(), prompt.begin())) {
            return true;
        }
    }
    return false;
}

bool Scheduler::start_turn_end(Slot& slot) {
    if (!slot.prompt_info.track_turn_end || !slot.request.render_turn_end) {
        return false;
    }
    std::vector<runtime::Token> turn;
    try {
        turn = slot.request.render_turn_end(slot.output->text());
    } catch (const std::exception& e) {
        return false;
    }
    const auto& prompt = slot.request.prompt;
    if (turn.size() <= prompt.size() || turn.size() >= n_ctx_ ||
        !std::equal(prompt.begin(), prompt.end(), turn.begin())) {
        return false;
    }
    if (!stage_->restore_turn_start(*context_, slot.lane, slot.prompt_info)) {
        return false;
    }
    const auto n_start = static_cast<int32_t>(prompt.size());
    slot.request.prompt = std::move(turn);
    slot.prompt_info.tokens = std::span<const runtime::Token>(slot.request.prompt);
    slot.prompt_info.track_turn_end = false;
    slot.lane_tokens.assign(slot.request.prompt.begin(), slot.request.prompt.begin() + n_start);
    const auto n_turn = static_cast<int32_t>(slot.request.prompt.size());
    slot.checkpoints.clear();
    if (options_.recurrent_split_stride > 0) {
        const auto stride = static_cast<int32_t>(options_.recurrent_split_stride);
        for (int32_t p = (n_start / stride + 1) * stride; p < n_turn; p += stride) {
            slot.checkpoints.push_back(p);
        }
    }
    slot.checkpoints.push_back(n_turn);
    slot.is_checkpoint = {n_turn};
    slot.next_checkpoint = 0;
    slot.generating = false;
    slot.post_turn = true;
    return true;
}

void Scheduler::sample_slot(Slot& slot, int32_t batch_index) {
    const runtime::Token token = slot.sampler->sample(*context_, batch_index);
    ++slot.n_sampled;
    if (slot.n_sampled == 1) {
        slot.stats.time_to_first_token_ms = ms_between(slot.enqueued, Clock::now());
    }
    if (model_.is_end_of_generation(token) && !slot.request.ignore_eos) {
        finish_slot(slot, "stop");
        return;
    }
    slot.unsent_tokens.push_back(token);
    ++slot.n_reply_tokens;
    if (slot.output->append(model_.token_to_piece(token, false))) {
        finish_slot(slot, "stop");
        return;
    }
    std::string text = slot.output->take_streamable();
    if (!text.empty()) {
        slot.stream->push_delta(std::move(text), std::move(slot.unsent_tokens));
        slot.unsent_tokens.clear();
    }
    if (slot.n_sampled >= slot.request.max_tokens ||
        slot.lane_tokens.size() + 1 >= static_cast<size_t>(n_ctx_)) {
        finish_slot(slot, "length");
        return;
    }
    slot.pending_token = token;
}

void Scheduler::step() {
    for (auto& slot : slots_) {
        if (slot->active && !slot->post_turn && slot->stream->cancelled()) {
            cancelled_.fetch_add(1);
            release_slot(*slot);
        }
    }
    struct Planned {
        Slot* slot;
        int32_t begin;
        int32_t end;
        int32_t logits_index;
        bool decode_step;
    };
    std::vector<Planned> planned;
    context_->batch_clear();
    auto budget = static_cast<int32_t>(context_->n_batch());
    for (auto& slot : slots_) {
        if (slot->active && slot->generating && budget > 0) {
            const auto pos = static_cast<runtime::Pos>(slot->lane_tokens.size());
            const int32_t index = context_->batch_add(slot->pending_token, pos, slot->lane, true);
            planned.push_back({slot.get(), pos, pos + 1, index, true});
            --budget;
        }
    }
    for (auto& slot : slots_) {
        if (!slot->active || slot->generating || budget <= 0) {
            continue;
        }
        const auto& prompt = slot->request.prompt;
        const auto begin = static_cast<int32_t>(slot->lane_tokens.size());
        auto end = static_cast<int32_t>(prompt.size());
        if (slot->next_checkpoint < slot->checkpoints.size()) {
            end = std::min(end, slot->checkpoints[slot->next_checkpoint]);
        }
        if (canonical_splits_ && end - begin > budget) {
            continue;  // never cut a canonical chunk: wait for a batch with room for it
        }
        end = std::min(end, begin + budget);
        int32_t logits_index = -1;
        for (int32_t i = begin; i < end; ++i) {
            const bool last = i == static_cast<int32_t>(prompt.size()) - 1 && !slot->post_turn;
            const int32_t index =
                context_->batch_add(prompt[static_cast<size_t>(i)], i, slot->lane, last);
            if (last) {
                logits_index = index;
            }
        }
        budget -= end - begin;
        planned.push_back({slot.get(), begin, end, logits_index, false});
    }
    if (planned.empty()) {
        return;
    }
    stage_->make_room(*context_, static_cast<uint32_t>(context_->batch_size()));
    const int32_t rc = context_->decode();
    if (rc == 1) {
        // No KV slot: free cache space and retry next iteration, or shed the newest request.
        if (!stage_->evict_for_space(*context_)) {
            Slot* victim = planned.back().slot;
            fail_slot(*victim, 503, "server_overloaded", "KV cache is full; retry later");
        }
        return;
    }
    if (rc != 0) {
        for (auto& p : planned) {
            if (p.slot->active) {
                fail_slot(*p.slot, 500, "server_error",
                          "llama_decode failed with code " + std::to_string(rc));
            }
        }
        return;
    }
    decode_calls_.fetch_add(1);
    for (auto& p : planned) {
        Slot& slot = *p.slot;
        if (!slot.active) {
            continue;
        }
        if (p.decode_step) {
            slot.lane_tokens.push_back(slot.pending_token);
            sample_slot(slot, p.logits_index);
            continue;
        }
        const auto& prompt = slot.request.prompt;
        slot.lane_tokens.insert(slot.lane_tokens.end(), prompt.begin() + p.begin,
                                prompt.begin() + p.end);
        const bool prompt_done = p.end == static_cast<int32_t>(prompt.size());
        while (slot.next_checkpoint < slot.checkpoints.size() &&
               slot.checkpoints[slot.next_checkpoint] <= p.end) {
            if (slot.checkpoints[slot.next_checkpoint] == p.end &&
                slot.is_checkpoint.count(p.end)) {
                if (prompt_done && !slot.post_turn) {
                    // Export after the first token is out: the state does not change until
                    // the sampled token is decoded, and TTFT should not pay for the export.
                    slot.deferred_checkpoint = p.end;
                } else {
                    record_checkpoint(slot, p.end);
                }
            }
            ++slot.next_checkpoint;
        }
        if (prompt_done && slot.post_turn) {
            release_slot(slot, slot.request.prompt);  // the end of the turn is recorded
        } else if (prompt_done) {
            slot.generating = true;
            sample_slot(slot, p.logits_index);  // may finish (and record) the slot
            if (slot.active && slot.deferred_checkpoint > 0) {
                record_checkpoint(slot, std::exchange(slot.deferred_checkpoint, 0));
            }
        }
    }
}

void Scheduler::record_checkpoint(Slot& slot, int32_t n_tokens) {
    try {
        stage_->on_checkpoint(*context_, slot.lane, slot.prompt_info, n_tokens);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "skippy: checkpoint record failed: %s\n", e.what());
    }
}

}  // namespace skippy::server
