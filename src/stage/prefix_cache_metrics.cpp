// PrefixCacheStage's gauges: what the lanes hold (kept current by the scheduler thread), the
// /metrics families (any thread: atomics, and the store's stats only when its lock is free),
// and inspection: the entries per namespace, a namespace flush, memory against budgets.
#include <algorithm>
#include <map>

#include "cache/block_memory.h"
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

void PrefixCacheStage::write_metrics(metrics::MetricsWriter& out) const {
    telemetry_->write_metrics(out);
    auto d = [](auto v) { return static_cast<double>(v); };
    if (auto s = exact_->try_stats()) {
        out.gauge("skippy_cache_exact_entries", "Exact-state entries.", d(s->entries));
        out.gauge("skippy_cache_physical_bytes", "Unique block bytes of exact-state payloads.",
                  d(s->blocks.physical_bytes));
        out.gauge("skippy_cache_logical_bytes", "Payload bytes referenced by entries.",
                  d(s->blocks.logical_bytes));
        out.gauge("skippy_cache_blocks", "Stored blocks.", d(s->blocks.block_count));
        out.gauge("skippy_cache_leased_entries", "Exact-state entries held by a lease (a restore).",
                  d(s->leased_entries));
        out.gauge("skippy_cache_hidden_entries",
                  "Exact-state entries quarantined while leased, freed at the last release.",
                  d(s->hidden_entries));
    }
    {
        const cache::BlockMemoryStats bm = cache::BlockMemory::process().stats();
        out.gauge("skippy_cache_block_mapped_bytes",
                  "Memory mapped for the RAM tier's blocks of 64 KiB and more (in use and idle).",
                  d(bm.mapped_bytes));
        out.gauge("skippy_cache_block_idle_bytes",
                  "Block mappings no block uses, kept for the next blocks of their size.",
                  d(bm.idle_bytes));
        out.counter("skippy_cache_block_maps_total", "Block mappings created (mmap).", d(bm.maps));
        out.counter("skippy_cache_block_reuses_total",
                    "Blocks placed in an idle mapping (no mmap, no page faults).", d(bm.reuses));
    }
    out.gauge("skippy_cache_max_bytes",
              "Byte budget of the RAM tier's entries (--cache-max-bytes less the record "
              "queue's share).",
              d(exact_->limits().max_physical_bytes));
    const auto q = queue_->counters();
    out.gauge("skippy_cache_record_queue_pending", "Record jobs queued or running.", d(q.pending));
    out.gauge("skippy_cache_record_queue_bytes",
              "Captured state bytes waiting in the record queue.", d(queued_bytes_->load()));
    out.gauge("skippy_cache_record_queue_max_bytes",
              "Byte budget of captured states in the record queue.", d(queue_budget_bytes_));
    out.gauge("skippy_cache_record_worker_failures", "Record jobs that failed in the worker.",
              d(q.failed));
    if (disk_) {
        const auto s = disk_->stats();
        out.gauge("skippy_cache_disk_entries", "Entries in the disk tier.", d(s.entries));
        out.gauge("skippy_cache_disk_bytes", "Bytes of the disk tier (blocks + manifests).",
                  d(s.disk_bytes));
        out.gauge("skippy_cache_disk_max_bytes", "Byte bound of the disk tier (0: none).",
                  d(config_.disk_max_bytes));
        out.gauge("skippy_cache_disk_leased_entries", "Disk entries held by a lease (a read).",
                  d(s.leased_entries));
        out.gauge("skippy_cache_disk_read_only", "1 when the disk tier stopped writing.",
                  s.mode == cache::DiskMode::ReadOnly ? 1.0 : 0.0);
        out.gauge("skippy_cache_disk_write_queue_depth", "Disk writes queued or running.",
                  d(s.queue_depth));
        out.gauge("skippy_cache_disk_reconcile_seconds",
                  "Start-up reconciliation of the disk tier.", s.reconcile_ms / 1000.0);
        out.counter("skippy_cache_disk_hits_total", "Disk lookups that found a longer prefix.",
                    d(s.hits));
        out.counter("skippy_cache_disk_promotions_total", "Entries read from disk into RAM.",
                    d(disk_promotions_.load()));
        out.counter("skippy_cache_disk_writes_total", "Entries committed to disk (demotions).",
                    d(s.writes));
        out.counter("skippy_cache_disk_write_failures_total",
                    "Disk writes that failed (I/O errors, no space).",
                    d(s.write_failures + s.write_no_room));
        out.counter("skippy_cache_disk_write_dropped_total", "Disk writes dropped (queue full).",
                    d(s.dropped_full));
        out.counter("skippy_cache_disk_read_failures_total", "Disk reads that failed verification.",
                    d(disk_read_failures_.load()));
        out.counter("skippy_cache_disk_quarantined_total", "Disk entries removed as bad.",
                    d(s.quarantines));
        out.counter("skippy_cache_disk_evictions_total", "Disk entries evicted (LRU).",
                    d(s.evictions));
    }
    if (redis_) {
        const cache::RedisStats s = redis_->stats();
        out.gauge("skippy_cache_redis_up",
                  "1 while the shared Redis tier answers (0: down, retried after a back-off).",
                  s.up ? 1.0 : 0.0);
        out.gauge("skippy_cache_redis_write_queue_depth", "Redis writes queued or running.",
                  d(s.queue_depth));
        out.counter("skippy_cache_redis_outages_total", "Times the Redis tier went down.",
                    d(s.outages));
        out.counter("skippy_cache_redis_lookups_total", "Lookups that reached Redis.",
                    d(s.lookups));
        out.counter("skippy_cache_redis_hits_total",
                    "Redis lookups that found a longer exact prefix than RAM and disk.", d(s.hits));
        out.counter("skippy_cache_redis_misses_total", "Redis lookups that found nothing longer.",
                    d(s.misses));
        out.counter("skippy_cache_redis_skipped_total",
                    "Redis lookups, reads and writes skipped while the tier was down.",
                    d(s.skipped_down));
        out.counter("skippy_cache_redis_reads_total", "Verified reads from Redis.", d(s.reads));
        out.counter("skippy_cache_redis_read_bytes_total", "Payload bytes read from Redis.",
                    d(s.read_bytes));
        out.counter("skippy_cache_redis_promotions_total", "Entries read from Redis into RAM.",
                    d(redis_promotions_.load()));
        const char* failures =
            "Redis reads that failed, by reason (bad bytes are never imported; their manifest "
            "is deleted).";
        for (size_t i = 1; i < s.read_failures.size(); ++i) {
            out.counter("skippy_cache_redis_read_failures_total", failures, d(s.read_failures[i]),
                        {{"reason", cache::to_string(static_cast<cache::RedisReadError>(i))}});
        }
        out.counter("skippy_cache_redis_quarantined_total", "Redis entries deleted as bad.",
                    d(s.quarantines));
        out.histogram("skippy_cache_redis_read_seconds",
                      "Verified Redis reads (round trips and verification), seconds.",
                      redis_read_seconds_.snapshot());
        out.counter("skippy_cache_redis_writes_total", "Entries committed to Redis.", d(s.writes));
        out.counter("skippy_cache_redis_written_bytes_total",
                    "Block bytes sent to Redis (blocks already there are not sent).",
                    d(s.written_bytes));
        out.counter("skippy_cache_redis_write_skipped_total",
                    "Redis writes of entries already there.", d(s.write_skipped));
        const char* dropped = "Redis writes dropped, by reason.";
        out.counter("skippy_cache_redis_dropped_total", dropped, d(s.dropped_full),
                    {{"reason", "queue_full"}});
        out.counter("skippy_cache_redis_dropped_total", dropped, d(s.dropped_down),
                    {{"reason", "down"}});
        out.counter("skippy_cache_redis_dropped_total", dropped, d(s.dropped_oom),
                    {{"reason", "oom"}});
        out.counter("skippy_cache_redis_dropped_total", dropped, d(s.write_failures),
                    {{"reason", "failed"}});
        const char* errors = "Redis errors, by kind.";
        for (size_t i = 0; i < s.errors.size(); ++i) {
            out.counter("skippy_cache_redis_errors_total", errors, d(s.errors[i]),
                        {{"kind", cache::to_string(static_cast<cache::RedisErrorKind>(i))}});
        }
    }
    out.gauge("skippy_cache_lane_tokens", "Prefilled tokens the lanes hold for reuse in place.",
              d(lane_tokens_.load(std::memory_order_relaxed)));
    out.gauge("skippy_cache_lanes_pending",
              "Lanes whose records wait for their deferred export (lane replaced, or 50 ms "
              "idle).",
              d(lanes_pending()));
}

std::string PrefixCacheStage::metrics_text() const {
    metrics::MetricsWriter out;
    write_metrics(out);
    return out.text();
}

std::vector<PrefixCacheStage::NamespaceView> PrefixCacheStage::inventory(
    const cache::NamespaceId* only) const {
    std::map<cache::NamespaceId, std::map<cache::PageId, EntryView>> merged;
    for (const auto& e : exact_->list_entries(only)) {
        EntryView& v = merged[e.ns][e.page];
        v.page = e.page;
        v.tokens = e.tokens;
        v.bytes = e.payload_bytes;
        v.in_ram = true;
        v.hits += e.hits;
        v.stored_unix_ms = e.stored_unix_ms;
        v.last_hit_unix_ms = std::max(v.last_hit_unix_ms, e.last_hit_unix_ms);
    }
    if (disk_) {
        for (const auto& e : disk_->list_entries(only)) {
            EntryView& v = merged[e.ns][e.page];
            v.page = e.page;
            v.tokens = e.tokens;
            v.bytes = e.payload_bytes;
            v.on_disk = true;
            v.hits += e.hits;
            v.last_hit_unix_ms = std::max(v.last_hit_unix_ms, e.last_hit_unix_ms);
        }
    }
    std::vector<NamespaceView> out;
    for (auto& [ns, pages] : merged) {
        NamespaceView view;
        view.ns = ns;
        for (auto& [page, entry] : pages) {
            view.tokens += entry.tokens;
            view.bytes += entry.bytes;
            view.entries.push_back(entry);
        }
        std::sort(view.entries.begin(), view.entries.end(),
                  [](const EntryView& a, const EntryView& b) { return a.tokens > b.tokens; });
        out.push_back(std::move(view));
    }
    return out;
}

size_t PrefixCacheStage::flush_namespace(const cache::NamespaceId& ns) {
    {
        std::lock_guard<std::mutex> lock(forget_mutex_);
        forget_namespaces_.push_back(ns);
    }
    forget_namespaces_pending_.store(true, std::memory_order_release);
    size_t removed = exact_->remove_namespace(ns);
    if (disk_) {
        removed += disk_->remove_namespace(ns);
    }
    if (redis_) {
        redis_->remove_namespace(ns);  // (asynchronous; not counted here)
    }
    return removed;
}

PrefixCacheStage::MemoryView PrefixCacheStage::memory() const {
    MemoryView m;
    const auto s = exact_->stats();
    m.ram_bytes = s.blocks.physical_bytes;
    m.ram_logical_bytes = s.blocks.logical_bytes;
    m.ram_budget = exact_->limits().max_physical_bytes;
    m.ram_entries = s.entries;
    m.max_entries = exact_->limits().max_entries;
    if (disk_) {
        const auto d = disk_->stats();
        m.disk = true;
        m.disk_read_only = d.mode == cache::DiskMode::ReadOnly;
        m.disk_bytes = d.disk_bytes;
        m.disk_budget = config_.disk_max_bytes;
        m.disk_entries = d.entries;
        m.disk_queue = d.queue_depth;
    }
    if (redis_) {
        const auto r = redis_->stats();
        m.redis = true;
        m.redis_up = r.up;
        m.redis_queue = r.queue_depth;
    }
    m.queue_bytes = queued_bytes_->load();
    m.queue_budget = queue_budget_bytes_;
    m.queue_pending = queue_->counters().pending;
    m.queue_capacity = config_.record_queue_capacity;
    m.lane_tokens = lane_tokens_.load(std::memory_order_relaxed);
    m.lanes_pending = lanes_pending();
    return m;
}

}  // namespace skippy::stage
