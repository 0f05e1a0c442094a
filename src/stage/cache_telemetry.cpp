#include "stage/cache_telemetry.h"

#include <chrono>
#include <sstream>

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
            ++(e.tier == CacheTier::Lane   ? lane_hits_
               : e.tier == CacheTier::Disk ? disk_hits_
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
    }
    if (e.quarantined) {
        ++quarantines_;
    }
    cached_tokens_ += static_cast<uint64_t>(e.restored_tokens);
    if (e.restored_tokens > 0) {
        const double total = e.lookup_ms + e.reconstruct_ms + e.import_ms;
        for (size_t i = 0; i < kLatencyBucketsMs.size(); ++i) {
            if (total <= kLatencyBucketsMs[i]) {
                ++restore_buckets_[i];
            }
        }
        ++restore_count_;
        restore_sum_us_ += static_cast<uint64_t>(total * 1000.0);
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

std::string CacheTelemetry::metrics_text() const {
    std::ostringstream out;
    out << "# HELP skippy_cache_lookups_total Cache lookup decisions (tier: where a hit came "
           "from).\n"
        << "# TYPE skippy_cache_lookups_total counter\n"
        << "skippy_cache_lookups_total{decision=\"exact_hit\",tier=\"lane\"} " << lane_hits_ << "\n"
        << "skippy_cache_lookups_total{decision=\"exact_hit\",tier=\"ram\"} " << ram_hits_ << "\n"
        << "skippy_cache_lookups_total{decision=\"exact_hit\",tier=\"disk\"} " << disk_hits_ << "\n"
        << "skippy_cache_lookups_total{decision=\"miss\"} " << misses_ << "\n"
        << "skippy_cache_lookups_total{decision=\"error\"} " << errors_ << "\n"
        << "skippy_cache_lookups_total{decision=\"off\"} " << off_ << "\n";
    auto counter = [&](const char* name, const char* help, uint64_t v) {
        out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " counter\n"
            << name << ' ' << v << "\n";
    };
    counter("skippy_cache_hits_total", "Lookups that restored a cached prefix.",
            lane_hits_ + ram_hits_ + disk_hits_);
    counter("skippy_cache_misses_total", "Lookups that restored nothing.", misses_);
    counter("skippy_cache_errors_total", "Restores that failed and fell back to prefill.", errors_);
    counter("skippy_cache_quarantined_total", "Entries removed because their bytes were bad.",
            quarantines_);
    counter("skippy_cache_cached_tokens_total", "Prompt tokens restored from the cache.",
            cached_tokens_);
    counter("skippy_cache_records_queued_total", "Exact-state records admitted to the queue.",
            records_queued_);
    counter("skippy_cache_records_stored_total", "Exact-state records stored.", records_stored_);
    counter("skippy_cache_records_dropped_total", "Records dropped (queue full / in flight).",
            records_dropped_);
    counter("skippy_cache_records_failed_total", "Record jobs that failed.", records_failed_);
    counter("skippy_cache_records_already_present_total", "Records skipped: already stored.",
            records_present_);
    counter("skippy_cache_evictions_total", "Entries evicted.", exact_evictions_);
    counter("skippy_cache_lookup_prompt_tokens_total",
            "Prompt tokens of requests that looked up the cache (token-weighted hit rate: "
            "cached_tokens_total / this).",
            prompt_tokens_);
    out << "# HELP skippy_cache_restore_ms Restore latency (lookup + reconstruct + import).\n"
        << "# TYPE skippy_cache_restore_ms histogram\n";
    for (size_t i = 0; i < kLatencyBucketsMs.size(); ++i) {
        out << "skippy_cache_restore_ms_bucket{le=\"" << kLatencyBucketsMs[i] << "\"} "
            << restore_buckets_[i] << "\n";
    }
    out << "skippy_cache_restore_ms_bucket{le=\"+Inf\"} " << restore_count_ << "\n"
        << "skippy_cache_restore_ms_sum " << static_cast<double>(restore_sum_us_) / 1000.0 << "\n"
        << "skippy_cache_restore_ms_count " << restore_count_ << "\n";
    return out.str();
}

}  // namespace skippy::stage
