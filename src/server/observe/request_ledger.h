// RequestLedger: what the cache did for each generation request, for people and scrapers:
// the last N requests (GET /v1/cache/requests, the SSE stream /v1/cache/events, the
// dashboard) and the request-level accounting exported at /metrics:
//
//   skippy_cache_requests_total{decision,tier,reason}   every request's cache outcome (tier:
//                                   where a hit came from; for evicted / quarantined misses,
//                                   the tier that lost the prefix)
//   skippy_prefilled_tokens_total, skippy_prefill_seconds_total   measured prefill (time to
//                                   first token less queue and restore), the rate estimate
//   skippy_prefill_tokens_per_second                    that rate
//   skippy_cache_prefill_saved_seconds_total{tier}      restored tokens x the rate at the time
//   skippy_time_to_first_token_seconds{cache=hit|miss}  histogram
//
// The AccessLog hands every finished response to add(); only generation requests are kept.
//
// Thread safety: every member may be called from any thread (one mutex); wait_after()
// blocks on a condition variable that add() and close() signal.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "nlohmann/json.hpp"
#include "server/observe/metrics_writer.h"

namespace skippy::server {

struct AccessRecord;

struct RequestSummary {
    uint64_t id = 0;      // increasing
    int64_t unix_ms = 0;  // when its response was complete
    std::string method;
    std::string path;
    int status = 0;
    int api_key = -1;    // the key that authorized it (filtering by tenant)
    std::string tenant;  // the key's log name (per-key tenants), else ""
    std::string model;
    int32_t prompt_tokens = 0;
    int32_t cached_tokens = 0;
    int32_t prefilled_tokens = 0;
    int32_t generated_tokens = 0;
    int choices = 0;
    std::string decision;  // exact_hit / miss / error / off
    std::string tier;      // lane / ram / disk / none
    std::string miss_reason;
    std::string miss_tier;
    int32_t diverged_at = -1;
    double queue_ms = 0;
    double restore_ms = 0;
    double prefill_ms = 0;  // time to first token less queue and restore
    double ttft_ms = 0;
    double total_ms = 0;
    double saved_ms = 0;  // estimated prefill time the restored tokens saved
    std::string finish;
    bool cancelled = false;
    bool streamed = false;

    // `client_view`: the miss reason as a client may see it (client_miss_reason).
    nlohmann::json to_json(bool client_view) const;
};

class RequestLedger {
  public:
    explicit RequestLedger(size_t capacity = 256) : capacity_(capacity) {}

    void add(const AccessRecord& record, double total_ms);

    // Newest first, at most `limit`; `api_key` >= 0: only that key's requests.
    std::vector<RequestSummary> recent(size_t limit, int api_key = -1) const;
    // Requests with id > `after`, oldest first (the SSE stream).
    std::vector<RequestSummary> after(uint64_t after_id, int api_key = -1) const;
    uint64_t last_id() const;
    // Waits until a request with id > `after_id` is added, close() is called or `timeout`
    // passes; true if there is one.
    bool wait_after(uint64_t after_id, std::chrono::milliseconds timeout) const;
    void close();
    bool closed() const;

    struct TtftStats {
        uint64_t count = 0;
        double mean_ms = 0;
        double p50_ms = 0;  // over the requests kept (the last N)
        double p90_ms = 0;
    };
    struct Totals {
        uint64_t requests = 0;
        uint64_t hits = 0;  // requests that restored anything
        uint64_t prompt_tokens = 0;
        uint64_t cached_tokens = 0;
        uint64_t prefilled_tokens = 0;
        double prefill_seconds = 0;  // measured (requests with a prefill worth timing)
        uint64_t timed_prefill_tokens = 0;
        double tokens_per_second = 0;  // the prefill rate estimate (0: none measured yet)
        double saved_seconds = 0;
        std::map<std::string, uint64_t> cached_by_tier;
        std::map<std::string, double> saved_by_tier;
        std::map<std::string, uint64_t> miss_reasons;
        TtftStats ttft_hit;
        TtftStats ttft_miss;
    };
    Totals totals() const;

    void write_metrics(metrics::MetricsWriter& out) const;

  private:
    const size_t capacity_;
    mutable std::mutex mutex_;
    mutable std::condition_variable added_;
    bool closed_ = false;
    uint64_t next_id_ = 1;
    std::deque<RequestSummary> ring_;
    Totals totals_;
    // (decision, tier, reason) -> requests
    std::map<std::tuple<std::string, std::string, std::string>, uint64_t> outcomes_;
    metrics::Histogram ttft_hit_{metrics::latency_buckets_seconds()};
    metrics::Histogram ttft_miss_{metrics::latency_buckets_seconds()};
};

}  // namespace skippy::server
