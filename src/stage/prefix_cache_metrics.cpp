// PrefixCacheStage's gauges: what the lanes hold (kept current by the scheduler thread) and
// the /metrics text (any thread: atomics, and the store's stats only when its lock is free).
#include "stage/prefix_cache_stage.h"

namespace skippy::stage {

void PrefixCacheStage::update_lane_gauge() {
    size_t total = 0;
    size_t pending = 0;
    for (const auto& lane : lanes_) {
        total += lane.tokens.size();
        pending += lane.pending.empty() ? 0 : 1;
    }
    lane_tokens_.store(total, std::memory_order_relaxed);
    lanes_pending_.store(pending, std::memory_order_release);
}

std::string PrefixCacheStage::metrics_text() const {
    std::string out = telemetry_->metrics_text();
    auto gauge = [&](const char* name, const char* help, double v) {
        out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n" + name +
               " " + std::to_string(v) + "\n";
    };
    if (auto s = exact_->try_stats()) {
        gauge("skippy_cache_exact_entries", "Exact-state entries.",
              static_cast<double>(s->entries));
        gauge("skippy_cache_physical_bytes", "Unique block bytes of exact-state payloads.",
              static_cast<double>(s->blocks.physical_bytes));
        gauge("skippy_cache_logical_bytes", "Payload bytes referenced by entries.",
              static_cast<double>(s->blocks.logical_bytes));
        gauge("skippy_cache_blocks", "Stored blocks.", static_cast<double>(s->blocks.block_count));
        gauge("skippy_cache_leased_entries", "Exact-state entries held by a lease (a restore).",
              static_cast<double>(s->leased_entries));
        gauge("skippy_cache_hidden_entries",
              "Exact-state entries quarantined while leased, freed at the last release.",
              static_cast<double>(s->hidden_entries));
    }
    const auto q = queue_->counters();
    gauge("skippy_cache_record_queue_pending", "Record jobs queued or running.",
          static_cast<double>(q.pending));
    gauge("skippy_cache_record_queue_bytes", "Captured state bytes waiting in the record queue.",
          static_cast<double>(queued_bytes_->load()));
    gauge("skippy_cache_record_worker_failures", "Record jobs that failed in the worker.",
          static_cast<double>(q.failed));
    if (disk_) {
        const auto d = disk_->stats();
        gauge("skippy_cache_disk_entries", "Entries in the disk tier.",
              static_cast<double>(d.entries));
        gauge("skippy_cache_disk_bytes", "Bytes of the disk tier (blocks + manifests).",
              static_cast<double>(d.disk_bytes));
        gauge("skippy_cache_disk_leased_entries", "Disk entries held by a lease (a read).",
              static_cast<double>(d.leased_entries));
        gauge("skippy_cache_disk_read_only", "1 when the disk tier stopped writing.",
              d.mode == cache::DiskMode::ReadOnly ? 1.0 : 0.0);
        gauge("skippy_cache_disk_write_queue_depth", "Disk writes queued or running.",
              static_cast<double>(d.queue_depth));
        gauge("skippy_cache_disk_reconcile_ms", "Start-up reconciliation of the disk tier.",
              d.reconcile_ms);
        auto counter = [&](const char* name, const char* help, double v) {
            out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n" +
                   name + " " + std::to_string(v) + "\n";
        };
        counter("skippy_cache_disk_hits_total", "Disk lookups that found a longer prefix.",
                static_cast<double>(d.hits));
        counter("skippy_cache_disk_promotions_total", "Entries read from disk into RAM.",
                static_cast<double>(disk_promotions_.load()));
        counter("skippy_cache_disk_writes_total", "Entries committed to disk (demotions).",
                static_cast<double>(d.writes));
        counter("skippy_cache_disk_write_failures_total",
                "Disk writes that failed (I/O errors, no space).",
                static_cast<double>(d.write_failures + d.write_no_room));
        counter("skippy_cache_disk_write_dropped_total", "Disk writes dropped (queue full).",
                static_cast<double>(d.dropped_full));
        counter("skippy_cache_disk_read_failures_total", "Disk reads that failed verification.",
                static_cast<double>(disk_read_failures_.load()));
        counter("skippy_cache_disk_quarantined_total", "Disk entries removed as bad.",
                static_cast<double>(d.quarantines));
    }
    gauge("skippy_cache_lane_tokens", "Prefilled tokens the lanes hold for reuse in place.",
          static_cast<double>(lane_tokens_.load(std::memory_order_relaxed)));
    gauge("skippy_cache_lanes_pending",
          "Lanes whose records wait for their deferred export (lane replaced, or 50 ms idle).",
          static_cast<double>(lanes_pending()));
    return out;
}

}  // namespace skippy::stage
