#include "stage/cache_telemetry.h"

#include <chrono>

#include "nlohmann/json.hpp"

namespace skippy::stage {

namespace {
double now_unix_seconds() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}
}  // namespace

CacheTelemetry::CacheTelemetry(const std::string& events_log_path) {
    if (!events_log_path.empty()) {
        log_ = std::fopen(events_log_path.c_str(), "a");
        if (log_ == nullptr) {
            throw std::runtime_error("cannot open cache events log " + events_log_path);
        }
    }
}

CacheTelemetry::~CacheTelemetry() {
    if (log_ != nullptr) {
        std::fclose(log_);
    }
}

void CacheTelemetry::write_line(const std::string& line) {
    if (log_ == nullptr) {
        return;
    }
    std::lock_guard<std::mutex> lock(log_mutex_);
    std::fputs(line.c_str(), log_);
    std::fputc('\n', log_);
    std::fflush(log_);
}

void CacheTelemetry::lookup(const LookupEvent& e) {
    switch (e.decision) {
        case CacheDecision::ExactHit:
            ++(e.tier == CacheTier::Lane    ? lane_hits_
               : e.tier == CacheTier::Disk  ? disk_hits_
               : e.tier == CacheTier::Redis ? redis_hits_
                                            : ram_hits_);
            break;
        case CacheDecision::Miss:
            ++misses_;
            break;
        case CacheDecision::Error:
            ++errors_;
            break;
        case CacheDecision::Off:
            ++off_;
            break;
    }
    if (e.decision != CacheDecision::Off) {
        prompt_tokens_ += static_cast<uint64_t>(e.prompt_tokens);
        prefilled_tokens_ += static_cast<uint64_t>(e.suffix_tokens);
    }
    if (e.quarantined) {
        ++quarantines_;
    }
    cached_tokens_ += static_cast<uint64_t>(e.restored_tokens);
    if (e.restored_tokens > 0) {
        (e.tier == CacheTier::Lane    ? restored_lane_
         : e.tier == CacheTier::Disk  ? restored_disk_
         : e.tier == CacheTier::Redis ? restored_redis_
                                      : restored_ram_) += static_cast<uint64_t>(e.restored_tokens);
        restore_seconds_.observe((e.lookup_ms + e.reconstruct_ms + e.import_ms) / 1000.0);
    }
    if (log_ != nullptr) {
        nlohmann::json j = {{"ts", now_unix_seconds()},
                            {"event", "lookup"},
                            {"decision", to_string(e.decision)},
                            {"tier", to_string(e.tier)},
                            {"page_id", e.page_id},
                            {"payload", e.payload},
                            {"prompt_tokens", e.prompt_tokens},
                            {"matched_tokens", e.matched_tokens},
                            {"restored_tokens", e.restored_tokens},
                            {"suffix_tokens", e.suffix_tokens},
                            {"bytes", e.bytes},
                            {"candidates", e.candidates},
                            {"lookup_ms", e.lookup_ms},
                            {"reconstruct_ms", e.reconstruct_ms},
                            {"import_ms", e.import_ms},
                            {"quarantined", e.quarantined}};
        if (!e.reason.empty()) {
            j["reason"] = e.reason;
        }
        if (!e.error.empty()) {
            j["error"] = e.error;
        }
        if (e.miss_tier != CacheTier::None) {
            j["miss_tier"] = to_string(e.miss_tier);
        }
        if (e.diverged_at >= 0) {
            j["diverged_at"] = e.diverged_at;
        }
        write_line(j.dump());
    }
}

void CacheTelemetry::record(const RecordEvent& e) {
    if (e.decision == "queued") {
        ++records_queued_;
    } else if (e.decision == "stored") {
        ++records_stored_;
    } else if (e.decision == "dropped_full" || e.decision == "in_flight" ||
               e.decision == "worker_stopped") {
        ++records_dropped_;
    } else if (e.decision == "failed") {
        ++records_failed_;
    } else if (e.decision == "already_present") {
        ++records_present_;
    }
    exact_evictions_ += e.decision == "stored" ? e.evicted : 0;
    if (log_ != nullptr) {
        nlohmann::json j = {{"ts", now_unix_seconds()},
                            {"event", "record"},
                            {"decision", e.decision},
                            {"page_id", e.page_id},
                            {"payload", e.payload},
                            {"tokens", e.tokens},
                            {"bytes", e.bytes},
                            {"new_blocks", e.new_blocks},
                            {"reused_blocks", e.reused_blocks},
                            {"export_ms", e.export_ms},
                            {"hash_ms", e.hash_ms},
                            {"evicted", e.evicted},
                            {"entries", e.entries}};
        if (!e.reason.empty()) {
            j["reason"] = e.reason;
        }
        write_line(j.dump());
    }
}

CacheTelemetry::Totals CacheTelemetry::totals() const {
    Totals t;
    t.hits = exact_hits();
    t.lookups = t.hits + misses_ + errors_;
    t.prompt_tokens = prompt_tokens_;
    t.restored_tokens = cached_tokens_;
    t.restored_lane = restored_lane_;
    t.restored_ram = restored_ram_;
    t.restored_disk = restored_disk_;
    t.restored_redis = restored_redis_;
    t.prefilled_tokens = prefilled_tokens_;
    t.records_stored = records_stored_;
    t.records_dropped = records_dropped_;
    t.evictions = exact_evictions_;
    t.quarantines = quarantines_;
    return t;
}

void CacheTelemetry::write_metrics(metrics::MetricsWriter& out) const {
    const char* lookups = "Cache lookup decisions (tier: where a hit came from).";
    auto d = [](uint64_t v) { return static_cast<double>(v); };
    out.counter("skippy_cache_lookups_total", lookups, d(lane_hits_),
                {{"decision", "exact_hit"}, {"tier", "lane"}});
    out.counter("skippy_cache_lookups_total", lookups, d(ram_hits_),
                {{"decision", "exact_hit"}, {"tier", "ram"}});
    out.counter("skippy_cache_lookups_total", lookups, d(disk_hits_),
                {{"decision", "exact_hit"}, {"tier", "disk"}});
    out.counter("skippy_cache_lookups_total", lookups, d(redis_hits_),
                {{"decision", "exact_hit"}, {"tier", "redis"}});
    out.counter("skippy_cache_lookups_total", lookups, d(misses_), {{"decision", "miss"}});
    out.counter("skippy_cache_lookups_total", lookups, d(errors_), {{"decision", "error"}});
    out.counter("skippy_cache_lookups_total", lookups, d(off_), {{"decision", "off"}});
    out.counter("skippy_cache_hits_total", "Lookups that restored a cached prefix.",
                d(exact_hits()));
    out.counter("skippy_cache_misses_total", "Lookups that restored nothing.", d(misses_));
    out.counter("skippy_cache_errors_total", "Restores that failed and fell back to prefill.",
                d(errors_));
    out.counter("skippy_cache_quarantined_total", "Entries removed because their bytes were bad.",
                d(quarantines_));
    out.counter("skippy_cache_cached_tokens_total", "Prompt tokens restored from the cache.",
                d(cached_tokens_));
    const char* restored = "Prompt tokens restored from the cache, by tier.";
    out.counter("skippy_cache_restored_tokens_total", restored, d(restored_lane_),
                {{"tier", "lane"}});
    out.counter("skippy_cache_restored_tokens_total", restored, d(restored_ram_),
                {{"tier", "ram"}});
    out.counter("skippy_cache_restored_tokens_total", restored, d(restored_disk_),
                {{"tier", "disk"}});
    out.counter("skippy_cache_restored_tokens_total", restored, d(restored_redis_),
                {{"tier", "redis"}});
    out.counter("skippy_cache_prefilled_tokens_total",
                "Prompt tokens of lookups that were prefilled (not restored).",
                d(prefilled_tokens_));
    out.counter("skippy_cache_lookup_prompt_tokens_total",
                "Prompt tokens of requests that looked up the cache (token-weighted hit rate: "
                "cached_tokens_total / this).",
                d(prompt_tokens_));
    out.counter("skippy_cache_records_queued_total", "Exact-state records admitted to the queue.",
                d(records_queued_));
    out.counter("skippy_cache_records_stored_total", "Exact-state records stored.",
                d(records_stored_));
    out.counter("skippy_cache_records_dropped_total", "Records dropped (queue full / in flight).",
                d(records_dropped_));
    out.counter("skippy_cache_records_failed_total", "Record jobs that failed.",
                d(records_failed_));
    out.counter("skippy_cache_records_already_present_total", "Records skipped: already stored.",
                d(records_present_));
    out.counter("skippy_cache_evictions_total", "Entries evicted.", d(exact_evictions_));
    out.histogram("skippy_cache_restore_seconds",
                  "Restore latency (lookup + reconstruct + import) of hits.",
                  restore_seconds_.snapshot());
}

std::string CacheTelemetry::metrics_text() const {
    metrics::MetricsWriter out;
    write_metrics(out);
    return out.text();
}

}  // namespace skippy::stage
