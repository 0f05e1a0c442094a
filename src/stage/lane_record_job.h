// make_lane_record_job: the record worker's job for one lane export. The scheduler thread
// copied the lane's state once (CapturedState); the job cuts it into one kv-pages (or
// full-state) payload per recorded position, inserts each into the exact-state cache (the
// block store dedupes the pages a longer prefix shares with a shorter one) and reports each
// decision to the telemetry.
//
// Thread safety: the job runs on the record worker; it touches the cache and the telemetry
// only through their own locks. `on_release` runs once, when the job is destroyed (after it
// ran, or when the queue dropped it), from whichever thread destroys it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "cache/disk_store.h"
#include "cache/exact_state_cache.h"
#include "cache/namespace_id.h"
#include "cache/page_id.h"
#include "cache/record_queue.h"
#include "cache/redis_store.h"
#include "cache/token.h"
#include "stage/buffer_pool.h"
#include "stage/cache_telemetry.h"
#include "stage/state_payload.h"

namespace skippy::stage {

struct LaneRecordItem {
    int32_t n = 0;  // tokens of the prefix to record
    cache::PageId page;
    // Hybrid/recurrent models: the partial-only export taken exactly at n.
    std::shared_ptr<const std::vector<uint8_t>> recurrent;
};

struct LaneRecord {
    cache::NamespaceId ns;
    std::shared_ptr<CapturedState> captured;  // (its blob goes back to `buffers` after the run)
    std::vector<LaneRecordItem> items;
    std::vector<cache::Token> tokens;  // the lane's prefilled tokens (each item a prefix)
};

// `disk` (may be null): every stored payload is also queued for the disk tier (its own
// bounded writer; write-through, so what a restart finds is what RAM held). `buffers` (may be
// null): where the capture and the encoded payloads are recycled. `redis` (may be null):
// every stored payload is also queued for the shared Redis tier (its own bounded writer).
std::function<bool()> make_lane_record_job(LaneRecord record, cache::ExactStateCache& exact,
                                           cache::DiskStore* disk, CacheTelemetry& telemetry,
                                           const PayloadLayout& layout,
                                           std::shared_ptr<BufferPool> buffers,
                                           std::function<void()> on_release,
                                           cache::RedisStore* redis = nullptr);

}  // namespace skippy::stage
