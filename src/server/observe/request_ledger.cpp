#include "server/observe/request_ledger.h"

#include <algorithm>
#include <tuple>

#include "server/http/access_log.h"
#include "server/api/api_response.h"

namespace skippy::server {

using nlohmann::json;

namespace {

// Prefills shorter than this are not timed for the rate (sampling and wake-ups dominate).
constexpr int32_t kMinTimedPrefill = 16;

int64_t unix_ms_now() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

double percentile(std::vector<double> v, double q) {
    if (v.empty()) {
        return 0;
    }
    std::sort(v.begin(), v.end());
    const auto i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
    return v[std::min(i, v.size() - 1)];
}

}  // namespace

json RequestSummary::to_json(bool client_view) const {
    const std::string reason = client_view ? client_miss_reason(miss_reason) : miss_reason;
    json out = {{"id", id},
                {"time_ms", unix_ms},
                {"method", method},
                {"path", path},
                {"status", status},
                {"model", model},
                {"prompt_tokens", prompt_tokens},
                {"cached_tokens", cached_tokens},
                {"prefilled_tokens", prefilled_tokens},
                {"generated_tokens", generated_tokens},
                {"cache", decision},
                {"cache_tier", tier},
                {"miss_reason", reason.empty() ? json(nullptr) : json(reason)},
                {"diverged_at", diverged_at >= 0 ? json(diverged_at) : json(nullptr)},
                {"queue_ms", queue_ms},
                {"restore_ms", restore_ms},
                {"prefill_ms", prefill_ms},
                {"ttft_ms", ttft_ms},
                {"total_ms", total_ms},
                {"saved_ms", saved_ms},
                {"finish", finish},
                {"streamed", streamed},
                {"cancelled", cancelled}};
    if (!miss_tier.empty() && miss_tier != "none") {
        out["miss_tier"] = miss_tier;
    }
    if (!tenant.empty()) {
        out["tenant"] = tenant;
    }
    if (choices > 1) {
        out["choices"] = choices;
    }
    return out;
}

void RequestLedger::add(const AccessRecord& record, double total_ms) {
    if (record.generations <= 0) {
        return;  // not a generation (or refused before one ran)
    }
    const GenerationStats& s = record.stats;
    RequestSummary r;
    r.unix_ms = unix_ms_now();
    r.method = record.method;
    r.path = record.path;
    r.status = record.status;
    r.api_key = record.api_key;
    r.tenant = record.tenant;
    r.model = record.model;
    r.prompt_tokens = s.prompt_tokens;
    r.cached_tokens = s.cached_tokens;
    r.prefilled_tokens = std::max(0, s.prompt_tokens - s.cached_tokens);
    r.generated_tokens = s.completion_tokens;
    r.choices = record.generations;
    r.decision = s.cache_decision;
    r.tier = s.cache_tier.empty() ? "none" : s.cache_tier;
    r.miss_reason = s.miss_reason;
    r.miss_tier = s.miss_tier;
    r.diverged_at = s.diverged_at;
    r.queue_ms = s.queue_ms;
    r.restore_ms = s.restore_ms;
    r.ttft_ms = s.time_to_first_token_ms;
    r.prefill_ms = std::max(0.0, s.time_to_first_token_ms - s.queue_ms - s.restore_ms);
    r.total_ms = total_ms;
    r.finish = s.finish_reason;
    r.cancelled = record.cancelled;
    r.streamed = record.streamed;
    const bool hit = r.cached_tokens > 0;
    if (r.ttft_ms > 0) {
        (hit ? ttft_hit_ : ttft_miss_).observe(r.ttft_ms / 1000.0);
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        r.id = next_id_++;
        Totals& t = totals_;
        ++t.requests;
        t.hits += hit ? 1 : 0;
        t.prompt_tokens += static_cast<uint64_t>(r.prompt_tokens);
        t.cached_tokens += static_cast<uint64_t>(r.cached_tokens);
        t.prefilled_tokens += static_cast<uint64_t>(r.prefilled_tokens);
        if (r.prefilled_tokens >= kMinTimedPrefill && r.prefill_ms > 0) {
            t.prefill_seconds += r.prefill_ms / 1000.0;
            t.timed_prefill_tokens += static_cast<uint64_t>(r.prefilled_tokens);
            t.tokens_per_second =
                static_cast<double>(t.timed_prefill_tokens) / std::max(t.prefill_seconds, 1e-9);
        }
        if (hit) {
            t.cached_by_tier[r.tier] += static_cast<uint64_t>(r.cached_tokens);
            if (t.tokens_per_second > 0) {
                r.saved_ms = 1000.0 * r.cached_tokens / t.tokens_per_second;
                t.saved_seconds += r.saved_ms / 1000.0;
                t.saved_by_tier[r.tier] += r.saved_ms / 1000.0;
            }
        } else if (!r.miss_reason.empty()) {
            ++t.miss_reasons[r.miss_reason];
        }
        const std::string outcome_tier =
            hit ? r.tier : (r.miss_tier.empty() ? std::string("none") : r.miss_tier);
        ++outcomes_[{r.decision.empty() ? "off" : r.decision, outcome_tier,
                     r.miss_reason.empty() ? "none" : r.miss_reason}];
        ring_.push_back(std::move(r));
        while (ring_.size() > capacity_) {
            ring_.pop_front();
        }
    }
    added_.notify_all();
}

std::vector<RequestSummary> RequestLedger::recent(size_t limit, int api_key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<RequestSummary> out;
    for (auto it = ring_.rbegin(); it != ring_.rend() && out.size() < limit; ++it) {
        if (api_key < 0 || it->api_key == api_key) {
            out.push_back(*it);
        }
    }
    return out;
}

std::vector<RequestSummary> RequestLedger::after(uint64_t after_id, int api_key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<RequestSummary> out;
    for (const auto& r : ring_) {
        if (r.id > after_id && (api_key < 0 || r.api_key == api_key)) {
            out.push_back(r);
        }
    }
    return out;
}

uint64_t RequestLedger::last_id() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return next_id_ - 1;
}

bool RequestLedger::wait_after(uint64_t after_id, std::chrono::milliseconds timeout) const {
    std::unique_lock<std::mutex> lock(mutex_);
    added_.wait_for(lock, timeout, [&] { return closed_ || next_id_ - 1 > after_id; });
    return next_id_ - 1 > after_id;
}

void RequestLedger::close() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        closed_ = true;
    }
    added_.notify_all();
}

bool RequestLedger::closed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return closed_;
}

RequestLedger::Totals RequestLedger::totals() const {
    std::lock_guard<std::mutex> lock(mutex_);
    Totals t = totals_;
    std::vector<double> hit_ms;
    std::vector<double> miss_ms;
    for (const auto& r : ring_) {
        if (r.ttft_ms > 0) {
            (r.cached_tokens > 0 ? hit_ms : miss_ms).push_back(r.ttft_ms);
        }
    }
    auto fill = [](TtftStats& out, const metrics::HistogramSnapshot& h,
                   const std::vector<double>& recent) {
        out.count = h.count;
        out.mean_ms = h.count > 0 ? 1000.0 * h.sum / static_cast<double>(h.count) : 0;
        out.p50_ms = percentile(recent, 0.5);
        out.p90_ms = percentile(recent, 0.9);
    };
    fill(t.ttft_hit, ttft_hit_.snapshot(), hit_ms);
    fill(t.ttft_miss, ttft_miss_.snapshot(), miss_ms);
    return t;
}

void RequestLedger::write_metrics(metrics::MetricsWriter& out) const {
    Totals t;
    std::map<std::tuple<std::string, std::string, std::string>, uint64_t> outcomes;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        t = totals_;
        outcomes = outcomes_;
    }
    const char* requests =
        "Generation requests by cache outcome (decision; tier: where a hit came from, or the "
        "tier that lost an evicted or quarantined prefix; reason: why nothing was restored).";
    out.declare("skippy_cache_requests_total", requests, metrics::MetricsWriter::Type::Counter);
    for (const auto& [key, n] : outcomes) {
        const auto& [decision, tier, reason] = key;
        out.counter("skippy_cache_requests_total", requests, static_cast<double>(n),
                    {{"decision", decision}, {"tier", tier}, {"reason", reason}});
    }
    out.counter("skippy_prefilled_tokens_total",
                "Prompt tokens prefilled (not restored) by completed generation requests.",
                static_cast<double>(t.prefilled_tokens));
    out.counter("skippy_prefill_seconds_total",
                "Measured prefill time (time to first token less queue and restore) of requests "
                "that prefilled at least 16 tokens.",
                t.prefill_seconds);
    out.counter("skippy_prefill_timed_tokens_total",
                "Prompt tokens of the prefills in skippy_prefill_seconds_total.",
                static_cast<double>(t.timed_prefill_tokens));
    out.gauge("skippy_prefill_tokens_per_second",
              "Measured prefill rate (the estimate behind the time saved; 0 until measured).",
              t.tokens_per_second);
    const char* saved =
        "Estimated prefill time the cache saved: restored tokens at the measured prefill rate, "
        "by tier.";
    for (const char* tier : {"lane", "ram", "disk", "redis"}) {
        auto it = t.saved_by_tier.find(tier);
        out.counter("skippy_cache_prefill_saved_seconds_total", saved,
                    it == t.saved_by_tier.end() ? 0.0 : it->second, {{"tier", tier}});
    }
    const char* ttft =
        "Time to first token of generation requests (cache: hit when any prompt "
        "token was restored).";
    out.histogram("skippy_time_to_first_token_seconds", ttft, ttft_hit_.snapshot(),
                  {{"cache", "hit"}});
    out.histogram("skippy_time_to_first_token_seconds", ttft, ttft_miss_.snapshot(),
                  {{"cache", "miss"}});
}

}  // namespace skippy::server
