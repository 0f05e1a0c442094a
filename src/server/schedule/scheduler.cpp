#include "server/schedule/scheduler.h"

#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <utility>

#include "server/api/text_output.h"

namespace skippy::server {

using Clock = std::chrono::steady_clock;

namespace {
constexpr auto kIdleFlushDelay = std::chrono::milliseconds(50);
// The longest the scheduler waits for a streamed response's handler to write its first delta
// (GenerationStream::await_handoff); a handler that gets a core writes in ~0.1 ms.
constexpr auto kFirstOutputHandoff = std::chrono::microseconds(3000);
double ms_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}
// What the stage knows of a request's prompt.
stage::PromptInfo lookup_info(const GenerationRequest& request) {
    stage::PromptInfo info;
    info.tokens = std::span<const runtime::Token>(request.prompt);
    info.message_boundaries = request.message_boundaries;  // (the body end: plan.h)
    info.cache_namespace = request.cache_namespace;
    info.routing_key = request.routing_key;
    info.cache_enabled = request.cache_enabled;
    info.renders_turn_end = static_cast<bool>(request.render_turn_end);
    return info;
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
    stage::PromptInfo prompt_info;     // of the request's prompt
    std::vector<runtime::Token> turn;  // post_turn: the conversation with the reply
    stage::Plan plan;
    size_t next_chunk = 0;
    size_t next_checkpoint = 0;
    int32_t n_prefilled = 0;  // prompt (or turn) tokens in the lane, all prefilled
    int32_t n_decoded = 0;    // tokens decoded after them
    bool generating = false;
    bool post_turn = false;            // reply delivered; prefilling the end of the turn
    bool prompt_done_pending = false;  // prompt prefilled, stage not told yet
    bool turn_end_follows = false;     // the plan asked for the end of the turn (Plan::turn_end)
    // Released after its reply; the end of the turn runs when the server is idle, unless
    // another request takes the lane first. `request` stays as it was until then.
    bool turn_end_deferred = false;
    std::string deferred_reply;
    runtime::Token pending_token = 0;  // sampled, not decoded yet
    int32_t n_sampled = 0;             // tokens sampled, including a final end-of-generation token
    int32_t n_reply_tokens = 0;        // tokens of the reply (reported as completion_tokens)
    std::optional<TextOutput> output;
    std::vector<runtime::Token> unsent_tokens;
    GenerationStats stats;
    Clock::time_point enqueued, started;
    // What the lane is prefilling: the prompt, or the turn at the end of the turn.
    const std::vector<runtime::Token>& tokens() const { return post_turn ? turn : request.prompt; }
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
    options_.context.n_seq_max = options_.lanes;
    context_ = std::make_unique<runtime::InferenceContext>(model_, options_.context);
    context_->warm_up();  // (before the stage looks at the lanes: they are empty again)
    n_ctx_ = context_->n_ctx_usable();
    stage_->attach(*context_, options_.lanes);
    for (uint32_t i = 0; i < options_.lanes; ++i) {
        auto slot = std::make_unique<Slot>();
        slot->lane = static_cast<runtime::SeqId>(i);
        slots_.push_back(std::move(slot));
    }
    thread_ = std::thread([this] {
        pthread_setname_np(pthread_self(), "skippy-sched");  // (top -H, perf)
        run();
    });
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
    if (request.cache_enabled && !request.prompt.empty()) {
        // On the caller's thread: a slower tier's I/O delays only this request.
        try {
            stage_->prefetch(lookup_info(request));
        } catch (const std::exception& e) {
            std::fprintf(stderr, "skippy: cache prefetch failed: %s\n", e.what());
        }
    }
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
    s.turn_ends_deferred = turn_ends_deferred_.load();
    return s;
}

void Scheduler::run() {
    for (;;) {
        std::deque<Pending> admitted;
        {
            std::unique_lock<std::mutex> lock(queue_mutex_);
            const bool any_active = lanes_busy_.load() > 0;
            if (!any_active) {
                const auto wake = [&] { return stopping_ || !incoming_.empty(); };
                // Deferred records are exported once the server has been idle for a while
                // (a conversation that comes back at once keeps its lane and needs none).
                const bool idle_work = turn_ends_deferred_.load() > 0 || stage_->has_idle_work();
                if (idle_work && !queue_cv_.wait_for(lock, kIdleFlushDelay, wake)) {
                    lock.unlock();
                    // Ends of turns first: their records join the lane's export.
                    if (!start_deferred_turn_end()) {
                        stage_->idle(*context_);
                    }
                    continue;
                }
                queue_cv_.wait(lock, wake);
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
            bool yield = false;
            if (!incoming_.empty() && lanes_busy_.load() == options_.lanes) {
                for (const auto& pending : incoming_) {
                    yield = yield || !continues_post_turn(pending.request.prompt);
                }
            }
            uint32_t free_lanes = options_.lanes - lanes_busy_.load();
            for (auto it = incoming_.begin(); free_lanes > 0 && it != incoming_.end();) {
                if (continues_post_turn(it->request.prompt)) {
                    ++it;  // admitted once that lane has recorded the end of its turn
                    continue;
                }
                if (waits_for_peer(it->request, admitted)) {
                    ++it;  // admitted once the lane prefilling its prefix has it
                    continue;
                }
                admitted.push_back(std::move(*it));
                it = incoming_.erase(it);
                --free_lanes;
            }
            queued_.store(static_cast<uint32_t>(incoming_.size()));
            if (yield) {
                yield_lock_free_ = true;
            }
        }
        if (std::exchange(yield_lock_free_, false)) {
            yield_post_turn();
        }
        admit_pending(admitted);
        hold_for_waiting();
        if (lanes_busy_.load() > 0) {
            if (!foreground_busy_) {
                foreground_busy_ = true;
                stage_->set_busy(true);
            }
            step();
        }
        if (foreground_busy_ && lanes_busy_.load() == 0) {
            foreground_busy_ = false;
            stage_->set_busy(false);
        }
    }
    // Shutting down: nothing more will be served.
    for (auto& slot : slots_) {
        if (slot->active && !slot->post_turn) {
            fail_slot(*slot, 503, "server_shutting_down", "server is shutting down");
        }
    }
    try {
        stage_->idle(*context_);  // records still waiting for their lane's export
    } catch (const std::exception& e) {
        std::fprintf(stderr, "skippy: final record export failed: %s\n", e.what());
    }
    std::lock_guard<std::mutex> lock(queue_mutex_);
    for (auto& pending : incoming_) {
        pending.stream->fail(503, "server_shutting_down", "server is shutting down");
    }
    incoming_.clear();
}

void Scheduler::yield_post_turn() {
    for (auto& slot : slots_) {
        if (slot->active && slot->post_turn) {
            // What was prefilled of the turn so far is canonical and stays in the lane.
            release_slot(*slot, static_cast<size_t>(slot->n_prefilled), false);
            return;  // one lane per iteration; the waiting request takes it next
        }
    }
}

void Scheduler::hold_for_waiting() {
    // Lanes pause where a waiting request will copy them (StageBackend::pauses), asked again
    // for every step; only while a lane is free for it, so no lane ever waits for a request
    // that cannot start.
    holds_.clear();
    if (lanes_busy_.load() == options_.lanes) {
        return;
    }
    std::vector<stage::PromptInfo> waiting;
    std::lock_guard<std::mutex> lock(queue_mutex_);
    // (The head of the queue: those further back start after it, when holds are set again.)
    size_t left = 2 * static_cast<size_t>(options_.lanes);
    for (auto it = incoming_.begin(); it != incoming_.end() && left > 0; ++it, --left) {
        if (!it->stream->cancelled() && !continues_post_turn(it->request.prompt)) {
            waiting.push_back(lookup_info(it->request));
        }
    }
    if (!waiting.empty()) {
        holds_ = stage_->pauses(waiting);  // (the prompts live in incoming_: under the lock)
    }
}

int32_t Scheduler::hold_at(runtime::SeqId lane) const {
    const auto i = static_cast<size_t>(lane);
    return i < holds_.size() ? holds_[i] : -1;
}

void Scheduler::admit_pending(std::deque<Pending>& pending) {
    for (auto& item : pending) {
        std::vector<runtime::SeqId> idle;
        for (auto& slot : slots_) {
            if (!slot->active) {
                idle.push_back(slot->lane);
            }
        }
        if (idle.empty()) {
            break;  // cannot happen: admission counted free lanes
        }
        const runtime::SeqId lane = stage_->choose_lane(idle, lookup_info(item.request));
        start_slot(*slots_[static_cast<size_t>(lane)], std::move(item));
    }
}

bool Scheduler::start_slot(Slot& slot, Pending&& pending) {
    if (std::exchange(slot.turn_end_deferred, false)) {
        turn_ends_deferred_.fetch_sub(1);  // the lane's state is replaced or continued now
        slot.deferred_reply.clear();
    }
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
    slot.prompt_info = lookup_info(slot.request);
    slot.output.emplace(slot.request.stop);
    slot.unsent_tokens.clear();
    slot.turn.clear();
    slot.generating = false;
    slot.post_turn = false;
    slot.n_sampled = 0;
    slot.n_reply_tokens = 0;
    slot.n_decoded = 0;
    slot.next_chunk = 0;
    slot.next_checkpoint = 0;
    slot.prompt_done_pending = false;
    // A chunk is one llama.cpp ubatch: larger ones would be split inside llama_decode.
    const int32_t max_chunk = context_->max_prefill_chunk();
    const auto n_prompt = static_cast<int32_t>(prompt.size());
    auto cold_plan = [&] {
        slot.plan = stage_->full_prefill(slot.prompt_info, max_chunk);
        slot.plan.decision = stage::CacheDecision::Error;
    };
    const auto plan_started = Clock::now();
    try {
        slot.plan = stage_->plan(*context_, slot.lane, slot.prompt_info, max_chunk);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "skippy: restore failed, falling back to prefill: %s\n", e.what());
        forget_lane(slot);
        cold_plan();
    }
    if (slot.plan.n_restored < 0 || slot.plan.n_restored >= n_prompt ||
        context_->seq_pos_max(slot.lane) != slot.plan.n_restored - 1 ||
        slot.plan.chunk_ends.empty() ||
        slot.plan.chunk_ends.back() != static_cast<int32_t>(prompt.size())) {
        // A plan that does not add up: start over from an empty lane.
        forget_lane(slot);
        cold_plan();
    }
    slot.turn_end_follows = slot.plan.turn_end && slot.prompt_info.renders_turn_end;
    slot.n_prefilled = slot.plan.n_restored;
    slot.stats.restore_ms = ms_between(plan_started, Clock::now());
    slot.stats.prompt_tokens = static_cast<int32_t>(prompt.size());
    slot.stats.cached_tokens = slot.plan.n_restored;
    slot.stats.cache_decision = std::string(stage::to_string(slot.plan.decision));
    slot.stats.cache_tier = std::string(stage::to_string(slot.plan.tier));
    slot.stats.miss_reason = slot.plan.miss_reason;
    slot.stats.miss_tier = std::string(stage::to_string(slot.plan.miss_tier));
    slot.stats.diverged_at = slot.plan.diverged_at;
    send_progress(slot);
    return true;
}

void Scheduler::send_progress(Slot& slot) {
    if (!slot.request.return_progress || slot.post_turn) {
        return;
    }
    PromptProgress p;
    p.total = static_cast<int32_t>(slot.request.prompt.size());
    p.cache = slot.plan.n_restored;
    p.processed = slot.n_prefilled;
    p.time_ms = static_cast<int64_t>(ms_between(slot.started, Clock::now()));
    slot.stream->push_progress(p);
}

void Scheduler::release_slot(Slot& slot, size_t canonical, bool turn_end) {
    const auto& tokens = slot.tokens();
    stage::LaneFinish how;
    how.how = turn_end ? stage::LaneFinish::How::TurnEnd : stage::LaneFinish::How::Released;
    how.canonical =
        std::span<const runtime::Token>(tokens).first(std::min(canonical, tokens.size()));
    try {
        stage_->finish(*context_, slot.lane, slot.prompt_info, how);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "skippy: record at release failed: %s\n", e.what());
    }
    free_slot(slot);
}

void Scheduler::forget_lane(Slot& slot) {
    stage::LaneFinish how;
    how.how = stage::LaneFinish::How::Failed;
    try {
        stage_->finish(*context_, slot.lane, slot.prompt_info, how);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "skippy: forgetting a lane failed: %s\n", e.what());
        context_->seq_clear(slot.lane);
    }
}

void Scheduler::free_slot(Slot& slot) {
    slot.active = false;
    slot.post_turn = false;
    slot.sampler.reset();
    slot.stream.reset();
    slot.output.reset();
    slot.turn.clear();
    lanes_busy_.fetch_sub(1);
}

void Scheduler::fail_slot(Slot& slot, int status, const std::string& type,
                          const std::string& message) {
    if (slot.stream) {
        slot.stream->fail(status, type, message);
    }
    failed_.fetch_add(1);
    forget_lane(slot);
    free_slot(slot);
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
    std::string reply = slot.output->text();
    slot.stream->finish(slot.stats, reply);
    slot.stream.reset();
    notify_prompt_done(slot);
    const bool defer = slot.turn_end_follows;
    // The prompt was prefilled; the reply tokens after it were decoded.
    release_slot(slot, slot.request.prompt.size(), false);
    if (defer) {
        slot.turn_end_deferred = true;
        slot.deferred_reply = std::move(reply);
        turn_ends_deferred_.fetch_add(1);
    }
}

bool Scheduler::start_deferred_turn_end() {
    for (auto& slot : slots_) {
        if (slot->active || !std::exchange(slot->turn_end_deferred, false)) {
            continue;
        }
        turn_ends_deferred_.fetch_sub(1);
        const std::string reply = std::move(slot->deferred_reply);
        slot->deferred_reply.clear();
        slot->active = true;
        lanes_busy_.fetch_add(1);
        if (!start_turn_end(*slot, reply)) {
            free_slot(*slot);  // the lane keeps the prompt state release() noted
        }
        return true;
    }
    return false;
}

bool Scheduler::waits_for_peer(const GenerationRequest& request,
                               const std::deque<Pending>& starting) const {
    std::vector<std::span<const runtime::Token>> prompts;
    prompts.reserve(starting.size());
    for (const auto& pending : starting) {
        if (pending.request.cache_namespace == request.cache_namespace) {
            prompts.emplace_back(pending.request.prompt);
        }
    }
    return stage_->waits_for_peer(lookup_info(request), prompts);
}

bool Scheduler::continues_post_turn(const std::vector<runtime::Token>& prompt) const {
    for (const auto& slot : slots_) {
        // Waiting pays off only when the new prompt extends the turn being recorded (the
        // client sent the reply back unchanged).
        const auto& turn = slot->turn;
        if (slot->active && slot->post_turn && prompt.size() > turn.size() &&
            std::equal(turn.begin(), turn.end(), prompt.begin())) {
            return true;
        }
    }
    return false;
}

bool Scheduler::start_turn_end(Slot& slot, const std::string& reply) {
    if (!slot.turn_end_follows) {
        return false;
    }
    std::vector<runtime::Token> turn;
    try {
        turn = slot.request.render_turn_end(reply);
    } catch (const std::exception&) {
        return false;
    }
    const auto& prompt = slot.request.prompt;
    if (turn.size() < prompt.size() + 2 || turn.size() >= n_ctx_ ||
        !std::equal(prompt.begin(), prompt.end(), turn.begin())) {
        return false;
    }
    stage::Plan plan = stage_->plan_turn_end(*context_, slot.lane, slot.prompt_info, turn,
                                             context_->max_prefill_chunk());
    if (plan.n_restored < 0) {
        return false;
    }
    if (plan.n_restored >= static_cast<int32_t>(turn.size()) || plan.chunk_ends.empty() ||
        plan.chunk_ends.back() != static_cast<int32_t>(turn.size()) ||
        context_->seq_pos_max(slot.lane) != plan.n_restored - 1) {
        forget_lane(slot);  // a plan that does not add up
        return false;
    }
    slot.turn = std::move(turn);
    slot.post_turn = true;
    slot.generating = false;
    slot.n_prefilled = plan.n_restored;
    slot.n_decoded = 0;
    slot.plan = std::move(plan);
    slot.next_chunk = 0;
    slot.next_checkpoint = 0;
    return true;
}

void Scheduler::sample_slot(Slot& slot, int32_t batch_index) {
    if (slot.request.on_logits) {
        slot.request.on_logits(context_->logits_at(batch_index));
    }
    const runtime::Token token = slot.sampler->sample(*context_, batch_index);
    if (slot.request.on_sampled) {
        slot.request.on_sampled(token);
    }
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
    const auto& preserved = slot.request.preserved_tokens;
    const bool special = std::binary_search(preserved.begin(), preserved.end(), token);
    if (slot.output->append(model_.token_to_piece(token, special))) {
        slot.stats.stop_sequence = slot.output->matched_stop();
        finish_slot(slot, "stop");
        return;
    }
    std::string text = slot.output->take_streamable();
    if (!text.empty()) {
        slot.stream->push_delta(std::move(text), std::move(slot.unsent_tokens));
        slot.unsent_tokens.clear();
        slot.stream->await_handoff(kFirstOutputHandoff);  // (waits once, streamed only)
    }
    const auto held = static_cast<size_t>(slot.n_prefilled + slot.n_decoded);
    if (slot.n_sampled >= slot.request.max_tokens || held + 1 >= static_cast<size_t>(n_ctx_)) {
        finish_slot(slot, "length");
        return;
    }
    slot.pending_token = token;
}

void Scheduler::step() {
    for (auto& slot : slots_) {
        if (slot->active && !slot->post_turn && slot->stream->cancelled()) {
            cancelled_.fetch_add(1);
            forget_lane(*slot);
            free_slot(*slot);
        }
    }
    decode_steps();
    // Prefill: requests before end-of-turn work, oldest first; up to one batch of tokens
    // per iteration, so generating lanes get their next step soon.
    std::vector<Slot*> order;
    for (auto& slot : slots_) {
        if (slot->active && !slot->generating) {
            order.push_back(slot.get());
        }
    }
    std::stable_sort(order.begin(), order.end(), [](const Slot* a, const Slot* b) {
        if (a->post_turn != b->post_turn) {
            return !a->post_turn;
        }
        return a->started < b->started;
    });
    auto budget = static_cast<int32_t>(context_->n_batch());
    for (Slot* slot : order) {
        const int32_t hold = slot->post_turn ? -1 : hold_at(slot->lane);
        while (slot->active && !slot->generating && budget > 0 &&
               slot->next_chunk < slot->plan.chunk_ends.size() && slot->n_prefilled != hold) {
            auto& ends = slot->plan.chunk_ends;
            if (hold > slot->n_prefilled && hold < ends[slot->next_chunk]) {
                // A pause inside this chunk: two exact chunks (the stage chose the point).
                ends.insert(ends.begin() + static_cast<std::ptrdiff_t>(slot->next_chunk), hold);
            }
            budget -= ends[slot->next_chunk] - slot->n_prefilled;
            prefill_chunk(*slot);
        }
        if (budget <= 0) {
            break;
        }
    }
}

void Scheduler::decode_steps() {
    struct Planned {
        Slot* slot;
        int32_t index;
    };
    std::vector<Planned> planned;
    context_->batch_clear();
    for (auto& slot : slots_) {
        if (slot->active && slot->generating) {
            const auto pos = static_cast<runtime::Pos>(slot->n_prefilled + slot->n_decoded);
            planned.push_back(
                {slot.get(), context_->batch_add(slot->pending_token, pos, slot->lane, true)});
        }
    }
    if (planned.empty()) {
        return;
    }
    const int32_t rc = context_->decode();
    if (rc != 0) {
        for (auto& p : planned) {
            if (p.slot->active) {
                fail_slot(*p.slot, rc == 1 ? 503 : 500,
                          rc == 1 ? "server_overloaded" : "server_error",
                          "llama_decode failed with code " + std::to_string(rc));
            }
        }
        return;
    }
    decode_calls_.fetch_add(1);
    for (auto& p : planned) {
        if (p.slot->active) {
            ++p.slot->n_decoded;
            sample_slot(*p.slot, p.index);
        }
    }
}

void Scheduler::prefill_chunk(Slot& slot) {
    const auto& tokens = slot.tokens();
    const int32_t begin = slot.n_prefilled;
    const int32_t end = slot.plan.chunk_ends[slot.next_chunk];
    const auto n = static_cast<int32_t>(tokens.size());
    const bool last = end == n;
    int32_t logits_index = -1;
    const int32_t rc =
        context_->prefill(slot.lane,
                          std::span<const runtime::Token>(tokens).subspan(
                              static_cast<size_t>(begin), static_cast<size_t>(end - begin)),
                          begin, last && !slot.post_turn, &logits_index);
    if (rc != 0) {
        if (slot.post_turn) {
            release_slot(slot, static_cast<size_t>(begin), false);
        } else {
            fail_slot(slot, rc == 1 ? 503 : 500, rc == 1 ? "server_overloaded" : "server_error",
                      "llama_decode failed with code " + std::to_string(rc));
        }
        return;
    }
    decode_calls_.fetch_add(1);
    slot.n_prefilled = end;
    ++slot.next_chunk;
    stage::LaneReport report;
    report.what = stage::LaneReport::What::ChunkDone;
    report.n_tokens = end;
    report.turn_end = slot.post_turn;
    while (slot.next_checkpoint < slot.plan.checkpoints.size() &&
           slot.plan.checkpoints[slot.next_checkpoint] <= end) {
        report.checkpoint = report.checkpoint || slot.plan.checkpoints[slot.next_checkpoint] == end;
        ++slot.next_checkpoint;
    }
    try {
        stage_->report(*context_, slot.lane, slot.prompt_info, report);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "skippy: checkpoint failed: %s\n", e.what());
    }
    if (!slot.post_turn) {
        send_progress(slot);
    }
    if (!last) {
        return;
    }
    if (slot.post_turn) {
        release_slot(slot, tokens.size(), true);  // the end of the turn is prefilled
        return;
    }
    slot.generating = true;
    slot.prompt_done_pending = true;
    sample_slot(slot, logits_index);  // may finish (and release) the slot
    if (slot.active && !slot.post_turn) {
        notify_prompt_done(slot);  // after the first token is out
    }
}

void Scheduler::notify_prompt_done(Slot& slot) {
    if (!std::exchange(slot.prompt_done_pending, false)) {
        return;
    }
    // The sampled token is not decoded yet: the lane is exactly at the prompt end.
    stage::LaneReport report;
    report.what = stage::LaneReport::What::PromptDone;
    report.n_tokens = static_cast<int32_t>(slot.request.prompt.size());
    try {
        stage_->report(*context_, slot.lane, slot.prompt_info, report);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "skippy: prompt-end checkpoint failed: %s\n", e.what());
    }
}

}  // namespace skippy::server
