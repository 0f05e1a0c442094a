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
    if (e.decision == "exact_hit") {
        ++exact_hits_;
    } else if (e.decision == "resident_hit") {
        ++resident_hits_;
    } else if (e.decision == "exact_error") {
        ++exact_errors_;
    } else if (e.decision == "resident_error") {
        ++resident_errors_;
    }
    if (e.decision != "exact_hit" && e.decision != "resident_hit" && e.decision != "skipped") {
        ++misses_;
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
                            {"decision", e.decision},
                            {"page_id", e.page_id},
                            {"payload", e.payload},
                            {"prompt_tokens", e.prompt_tokens},
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
    } else if (e.decision == "resident_inserted") {
        ++resident_inserts_;
    }
    exact_evictions_ += e.decision == "stored" ? e.evicted : 0;
    resident_evictions_ += e.decision == "resident_inserted" ? e.evicted : 0;
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
    out << "# HELP skippy_cache_lookups_total Cache lookup decisions.\n"
        << "# TYPE skippy_cache_lookups_total counter\n"
        << "skippy_cache_lookups_total{decision=\"exact_hit\"} " << exact_hits_ << "\n"
        << "skippy_cache_lookups_total{decision=\"resident_hit\"} " << resident_hits_ << "\n"
        << "skippy_cache_lookups_total{decision=\"miss\"} " << misses_ << "\n"
        << "skippy_cache_lookups_total{decision=\"exact_error\"} " << exact_errors_ << "\n"
        << "skippy_cache_lookups_total{decision=\"resident_error\"} " << resident_errors_ << "\n";
    auto counter = [&](const char* name, const char* help, uint64_t v) {
        out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " counter\n"
            << name << ' ' << v << "\n";
    };
    counter("skippy_cache_hits_exact_total", "Exact-state restores.", exact_hits_);
    counter("skippy_cache_hits_resident_total", "Resident KV restores.", resident_hits_);
    counter("skippy_cache_misses_total", "Lookups that restored nothing.", misses_);
    counter("skippy_cache_errors_total", "Restores that failed and fell back to prefill.",
            exact_errors_ + resident_errors_);
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
    counter("skippy_cache_resident_inserts_total", "Resident prefixes kept.", resident_inserts_);
    counter("skippy_cache_evictions_total", "Entries evicted (resident + exact).",
            resident_evictions_ + exact_evictions_);
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
