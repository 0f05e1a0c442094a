// CacheTelemetry: one structured event per lookup decision and per record decision.
// Events are appended to a JSON-lines log (when a path is configured) and feed the
// counters and the restore-latency histogram exported at /metrics.
//
// Thread safety: record_lookup/record_record may be called from the scheduler thread and
// the record worker concurrently; counters are atomics and the log file has its own mutex.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

#include "stage/plan.h"

namespace skippy::stage {

struct LookupEvent {
    CacheDecision decision = CacheDecision::Miss;
    CacheTier tier = CacheTier::None;
    std::string page_id;
    std::string payload;  // kv-pages / full-state
    // Miss reasons: never_seen, below_min_tokens, namespace (only another tenant has it),
    // cache_off; errors: what failed.
    std::string reason;
    int32_t matched_tokens = 0;  // tokens matched before the first difference (best source)
    int32_t prompt_tokens = 0;
    int32_t restored_tokens = 0;
    int32_t suffix_tokens = 0;
    uint64_t bytes = 0;
    size_t candidates = 0;
    double lookup_ms = 0;
    double reconstruct_ms = 0;
    double import_ms = 0;
    bool quarantined = false;
};

struct RecordEvent {
    std::string decision;  // queued, stored, already_present, dropped_full, in_flight, failed
    std::string page_id;
    std::string payload;
    std::string reason;
    int32_t tokens = 0;
    uint64_t bytes = 0;
    uint64_t new_blocks = 0;
    uint64_t reused_blocks = 0;
    double export_ms = 0;
    double hash_ms = 0;
    size_t evicted = 0;
    size_t entries = 0;
};

class CacheTelemetry {
  public:
    explicit CacheTelemetry(const std::string& events_log_path);
    ~CacheTelemetry();

    void lookup(const LookupEvent& event);
    void record(const RecordEvent& event);

    // Prometheus text of the event counters (the caches add their gauges).
    std::string metrics_text() const;

    uint64_t exact_hits() const { return lane_hits_ + ram_hits_ + disk_hits_; }
    uint64_t misses() const { return misses_; }
    uint64_t quarantines() const { return quarantines_; }

  private:
    void write_line(const std::string& line);

    std::FILE* log_ = nullptr;
    std::mutex log_mutex_;
    std::atomic<uint64_t> lane_hits_{0}, ram_hits_{0}, disk_hits_{0}, misses_{0}, errors_{0},
        off_{0}, quarantines_{0}, cached_tokens_{0}, prompt_tokens_{0};
    std::atomic<uint64_t> records_queued_{0}, records_stored_{0}, records_dropped_{0},
        records_failed_{0}, records_present_{0}, exact_evictions_{0};
    static constexpr std::array<double, 10> kLatencyBucketsMs = {0.5, 1,  2.5, 5,   10,
                                                                 25,  50, 100, 250, 1000};
    std::array<std::atomic<uint64_t>, kLatencyBucketsMs.size()> restore_buckets_{};
    std::atomic<uint64_t> restore_count_{0};
    std::atomic<uint64_t> restore_sum_us_{0};
};

}  // namespace skippy::stage
