// CacheConfig: the prefix-cache settings (CLI flags and SKIPPY_CACHE_* variables map here).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cache/entry_change.h"

namespace skippy::stage {

enum class CacheMode { Off, Record, LookupRecord };
enum class PayloadChoice { Auto, KvPages, FullState };

struct CacheConfig {
    CacheMode mode = CacheMode::LookupRecord;
    PayloadChoice payload = PayloadChoice::Auto;
    uint32_t max_entries = 256;       // exact-state entries
    uint64_t max_bytes = 2ull << 30;  // exact-state physical bytes
    uint32_t min_tokens = 64;
    uint32_t record_limit = 6;
    uint32_t record_queue_capacity = 8;
    std::string events_log_path;  // JSON-lines telemetry; empty = off
    // Disk tier (survives restarts): on by default in a per-user folder.
    bool disk = true;
    std::string disk_dir;  // empty = $SKIPPY_CACHE_DIR or ~/.cache/skippy, + /prefix-cache
    uint64_t disk_max_bytes = 16ull << 30;  // block files + manifests
    uint64_t disk_min_free = 1ull << 30;    // left free on the filesystem
    // Shared Redis tier (replicas of one model): empty = off (cache/redis_store.h).
    std::string redis_url;
    uint32_t redis_timeout_ms = 100;  // connect and each command
    std::string redis_prefix = "skippy:";
    // RAM-tier entry changes (the KV event publisher); called with the cache mutex held.
    cache::EntryObserver on_entry_change;
};

inline CacheMode parse_cache_mode(const std::string& s) {
    if (s == "off") return CacheMode::Off;
    if (s == "record") return CacheMode::Record;
    if (s == "lookup-record") return CacheMode::LookupRecord;
    throw std::invalid_argument("cache mode must be off, record or lookup-record");
}

inline PayloadChoice parse_payload_choice(const std::string& s) {
    if (s == "auto") return PayloadChoice::Auto;
    if (s == "kv-pages") return PayloadChoice::KvPages;
    if (s == "full-state") return PayloadChoice::FullState;
    throw std::invalid_argument("cache payload must be auto, kv-pages or full-state");
}

inline const char* cache_mode_name(CacheMode m) {
    switch (m) {
        case CacheMode::Off:
            return "off";
        case CacheMode::Record:
            return "record";
        case CacheMode::LookupRecord:
            return "lookup-record";
    }
    return "?";
}

inline const char* payload_choice_name(PayloadChoice p) {
    switch (p) {
        case PayloadChoice::Auto:
            return "auto";
        case PayloadChoice::KvPages:
            return "kv-pages";
        case PayloadChoice::FullState:
            return "full-state";
    }
    return "?";
}

}  // namespace skippy::stage
