// CacheTelemetry: one structured event per lookup decision and per record decision.
// Events are appended to a JSON-lines log (when a path is configured) and feed the
// counters and the restore-latency histogram exported at /metrics.
//
// Thread safety: record_lookup/record_record may be called from the scheduler thread and
// the record worker concurrently; counters are atomics and the log file has its own mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

#include "server/observe/metrics_writer.h"
#include "stage/plan.h"

namespace skippy::stage {

struct LookupEvent {
    CacheDecision decision = CacheDecision::Miss;
    CacheTier tier = CacheTier::None;
    std::string page_id;
    std::string payload;  // kv-pages / full-state
    // Why nothing was restored (misses: never_seen, evicted, quarantined, below_min_tokens,
    // diverged, namespace; off: cache_off; errors: restore_failed, with `error` saying what
    // failed). Empty for a hit.
    std::string reason;
    std::string error;
    // evicted / quarantined: the tier that lost the prefix.
    CacheTier miss_tier = CacheTier::None;
    int32_t matched_tokens = 0;  // tokens matched before the first difference (best source)
    // The longest prefix of the prompt this tenant has cached anywhere (lanes, RAM, disk):
    // where the prompt diverged from the nearest one. -1: not looked up (cache off).
    int32_t diverged_at = -1;
    int32_t prompt_tokens = 0;
    int32_t restored_tokens = 0;
    int32_t suffix_tokens = 0;
    uint64_t bytes = 0;
    size_t candidates = 0;
    double lookup_ms = 0;
    double reconstruct_ms = 0;  // checking the entry's blocks in place (checksum)
    double import_ms = 0;       // decoding the blocks into the blob, importing it into the lane
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

    // The event counters as Prometheus families (the caches add their gauges).
    void write_metrics(metrics::MetricsWriter& out) const;
    std::string metrics_text() const;

    uint64_t exact_hits() const { return lane_hits_ + ram_hits_ + disk_hits_ + redis_hits_; }
    uint64_t misses() const { return misses_; }
    uint64_t quarantines() const { return quarantines_; }

    // Token-weighted totals of the lookups (the dashboard).
    struct Totals {
        uint64_t lookups = 0;  // decisions other than off
        uint64_t hits = 0;
        uint64_t prompt_tokens = 0;    // of lookups
        uint64_t restored_tokens = 0;  // all tiers
        uint64_t restored_lane = 0, restored_ram = 0, restored_disk = 0, restored_redis = 0;
        uint64_t prefilled_tokens = 0;  // prompt tokens of lookups not restored
        uint64_t records_stored = 0, records_dropped = 0, evictions = 0, quarantines = 0;
    };
    Totals totals() const;

  private:
    void write_line(const std::string& line);

    std::FILE* log_ = nullptr;
    std::mutex log_mutex_;
    std::atomic<uint64_t> lane_hits_{0}, ram_hits_{0}, disk_hits_{0}, misses_{0}, errors_{0},
        off_{0}, quarantines_{0}, cached_tokens_{0}, prompt_tokens_{0}, prefilled_tokens_{0};
    std::atomic<uint64_t> restored_lane_{0}, restored_ram_{0}, restored_disk_{0};
    std::atomic<uint64_t> redis_hits_{0}, restored_redis_{0};
    std::atomic<uint64_t> records_queued_{0}, records_stored_{0}, records_dropped_{0},
        records_failed_{0}, records_present_{0}, exact_evictions_{0};
    // Restore latency (lookup + reconstruct + import), seconds.
    metrics::Histogram restore_seconds_{
        {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}};
};

}  // namespace skippy::stage
