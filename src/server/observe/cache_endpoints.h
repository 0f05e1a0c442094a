// CacheEndpoints: the prefix cache as people and tools see it.
//
//   GET    /v1/cache            entries per namespace (tokens, bytes, tiers, hits, last hit),
//                               memory against budgets; never token ids
//   DELETE /v1/cache            flushes one namespace from RAM, disk and lanes
//          ?namespace=<hex>|default   (without API keys any listed namespace; with keys only
//          &cache_salt=<salt>          the caller's own: its key's tenant, with a salt)
//   GET    /v1/cache/requests   the last N requests (?limit=, default 50): prompt, cached,
//                               prefilled tokens, decision, tier, miss reason, diverged_at,
//                               timings
//   GET    /v1/cache/stats      what the dashboard shows: token-weighted hit rates, tokens
//                               and time saved per tier, TTFT hit vs miss, miss reasons,
//                               memory per tier, record queue, lanes, the last requests
//   GET    /v1/cache/events     SSE: one `request` event per finished request (at most
//                               kMaxStreams at once; each ends after kStreamSeconds, clients
//                               reconnect)
//
// Tenancy: with API keys configured every route needs a key (the pre-routing check); with
// several keys (per-key tenants) a caller sees only its own namespace in detail, the shared
// default namespace as counts, no other tenant at all, and only its own requests; a miss
// whose prefix another tenant holds reads never_seen there (client_miss_reason).
//
// Thread safety: handlers run on handler threads; they read the scheduler's stats, the
// stage's inspection members and the ledger, all thread-safe.
#pragma once

#include <atomic>
#include <string>

#include "cpp-httplib/httplib.h"
#include "server/http/api_keys.h"
#include "server/observe/request_ledger.h"
#include "server/schedule/scheduler.h"

namespace skippy::server {

class CacheEndpoints {
  public:
    static constexpr int kMaxStreams = 8;
    static constexpr int kStreamSeconds = 300;

    CacheEndpoints(Scheduler& scheduler, const ApiKeys& keys, RequestLedger& ledger,
                   std::string model_id, const std::atomic<bool>& stopping);

    void install(httplib::Server& server);

  private:
    void get_cache(const httplib::Request& req, httplib::Response& res) const;
    void delete_cache(const httplib::Request& req, httplib::Response& res) const;
    void get_requests(const httplib::Request& req, httplib::Response& res) const;
    void get_stats(const httplib::Request& req, httplib::Response& res) const;
    void get_events(const httplib::Request& req, httplib::Response& res);
    // The api key index whose requests the caller may see (-1: all).
    int request_filter(httplib::Response& res) const;

    Scheduler& scheduler_;
    const ApiKeys& keys_;
    RequestLedger& ledger_;
    std::string model_id_;
    const std::atomic<bool>& stopping_;
    std::atomic<int> streams_{0};
    std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

}  // namespace skippy::server
