#include "server/observe/cache_endpoints.h"

#include <algorithm>
#include <ctime>

#include "server/http/access_log.h"
#include "server/api/api_error.h"
#include "server/api/api_response.h"
#include "server/api/json_fields.h"
#include "stage/prefix_cache_stage.h"

namespace skippy::server {

using nlohmann::json;

namespace {

constexpr size_t kDefaultRequests = 50;
constexpr size_t kMaxRequests = 256;
constexpr size_t kStatsRequests = 25;

void send_json(httplib::Response& res, const json& body, int status = 200) {
    res.status = status;
    res.set_header("Cache-Control", "no-store");
    res.set_content(dump_json(body), "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& type,
                const std::string& message, const std::string& code) {
    send_json(res, error_body(status, type, message, "", code), status);
}

json time_or_null(int64_t unix_ms) {
    if (unix_ms <= 0) {
        return nullptr;
    }
    const std::time_t seconds = static_cast<std::time_t>(unix_ms / 1000);
    std::tm tm{};
    gmtime_r(&seconds, &tm);
    char text[64];
    std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<int>(unix_ms % 1000));
    return text;
}

json memory_json(const stage::PrefixCacheStage::MemoryView& m) {
    json out = {{"ram",
                 {{"bytes", m.ram_bytes},
                  {"logical_bytes", m.ram_logical_bytes},
                  {"budget_bytes", m.ram_budget},
                  {"entries", m.ram_entries},
                  {"max_entries", m.max_entries}}},
                {"record_queue",
                 {{"bytes", m.queue_bytes},
                  {"budget_bytes", m.queue_budget},
                  {"pending", m.queue_pending},
                  {"capacity", m.queue_capacity}}},
                {"lanes", {{"tokens", m.lane_tokens}, {"pending_exports", m.lanes_pending}}}};
    if (m.disk) {
        out["disk"] = {{"bytes", m.disk_bytes},
                       {"budget_bytes", m.disk_budget},
                       {"entries", m.disk_entries},
                       {"write_queue", m.disk_queue},
                       {"read_only", m.disk_read_only}};
    } else {
        out["disk"] = nullptr;
    }
    if (m.redis) {
        out["redis"] = {{"up", m.redis_up}, {"write_queue", m.redis_queue}};
    } else {
        out["redis"] = nullptr;
    }
    return out;
}

stage::PrefixCacheStage* cache_stage(Scheduler& scheduler) {
    return dynamic_cast<stage::PrefixCacheStage*>(&scheduler.stage());
}

size_t param_size(const httplib::Request& req, const char* name, size_t fallback, size_t max) {
    if (!req.has_param(name)) {
        return fallback;
    }
    const std::string v = req.get_param_value(name);
    if (v.empty() || v.size() > 6 || v.find_first_not_of("0123456789") != std::string::npos) {
        throw invalid_request(std::string(name) + " must be a number");
    }
    return std::min<size_t>(std::stoul(v), max);
}

}  // namespace

CacheEndpoints::CacheEndpoints(Scheduler& scheduler, const ApiKeys& keys, RequestLedger& ledger,
                               std::string model_id, const std::atomic<bool>& stopping)
    : scheduler_(scheduler),
      keys_(keys),
      ledger_(ledger),
      model_id_(std::move(model_id)),
      stopping_(stopping) {}

void CacheEndpoints::install(httplib::Server& server) {
    server.Get("/v1/cache", [this](const httplib::Request& req, httplib::Response& res) {
        get_cache(req, res);
    });
    server.Delete("/v1/cache", [this](const httplib::Request& req, httplib::Response& res) {
        delete_cache(req, res);
    });
    server.Get("/v1/cache/requests", [this](const httplib::Request& req, httplib::Response& res) {
        get_requests(req, res);
    });
    server.Get("/v1/cache/stats", [this](const httplib::Request& req, httplib::Response& res) {
        get_stats(req, res);
    });
    server.Get("/v1/cache/events", [this](const httplib::Request& req, httplib::Response& res) {
        get_events(req, res);
    });
}

int CacheEndpoints::request_filter(httplib::Response& res) const {
    return keys_.per_key_tenants() ? std::max(0, AccessLog::record(res).api_key) : -1;
}

void CacheEndpoints::get_cache(const httplib::Request& req, httplib::Response& res) const {
    json out = {{"object", "cache"}, {"model", model_id_}};
    stage::PrefixCacheStage* stage = cache_stage(scheduler_);
    out["enabled"] = stage != nullptr;
    out["namespaces"] = json::array();
    if (stage == nullptr) {
        send_json(res, out);
        return;
    }
    const int key = AccessLog::record(res).api_key;
    const bool tenants = keys_.per_key_tenants();
    const cache::NamespaceId own =
        stage->namespace_for(keys_.tenant_namespace(key, req.get_param_value("cache_salt")));
    const cache::NamespaceId shared = stage->namespace_for("");
    out["namespace"] = own.short_hex();
    out["min_tokens"] = stage->min_tokens();
    for (const auto& view : stage->inventory()) {
        const bool yours = view.ns == own;
        const bool is_default = view.ns == shared;
        if (tenants && !yours && !is_default) {
            continue;  // another tenant: not even its existence
        }
        json ns = {
            {"namespace", view.ns.short_hex()}, {"yours", yours},        {"default", is_default},
            {"entries", view.entries.size()},   {"tokens", view.tokens}, {"bytes", view.bytes}};
        if (!tenants || yours) {
            json items = json::array();
            for (const auto& e : view.entries) {
                json tiers = json::array();
                if (e.in_ram) {
                    tiers.push_back("ram");
                }
                if (e.on_disk) {
                    tiers.push_back("disk");
                }
                items.push_back(json{{"page", e.page.str()},
                                     {"tokens", e.tokens},
                                     {"bytes", e.bytes},
                                     {"tiers", tiers},
                                     {"hits", e.hits},
                                     {"stored_at", time_or_null(e.stored_unix_ms)},
                                     {"last_hit", time_or_null(e.last_hit_unix_ms)}});
            }
            ns["items"] = std::move(items);
        }
        out["namespaces"].push_back(std::move(ns));
    }
    out["memory"] = memory_json(stage->memory());
    send_json(res, out);
}

void CacheEndpoints::delete_cache(const httplib::Request& req, httplib::Response& res) const {
    stage::PrefixCacheStage* stage = cache_stage(scheduler_);
    if (stage == nullptr) {
        send_error(res, 409, "invalid_request_error", "The prefix cache is off", "cache_off");
        return;
    }
    const int key = AccessLog::record(res).api_key;
    const cache::NamespaceId own =
        stage->namespace_for(keys_.tenant_namespace(key, req.get_param_value("cache_salt")));
    const cache::NamespaceId shared = stage->namespace_for("");
    const std::string wanted = req.get_param_value("namespace");
    auto names = [&](const cache::NamespaceId& ns) {
        return wanted == ns.hex() || wanted == ns.short_hex() ||
               (wanted == "default" && ns == shared);
    };
    cache::NamespaceId target = own;
    if (keys_.per_key_tenants()) {
        if (!wanted.empty() && !names(own)) {
            send_error(res, 403, "permission_error",
                       "An API key may flush only its own namespace (" + own.short_hex() + ")",
                       "namespace_forbidden");
            return;
        }
    } else if (wanted == "default") {
        target = shared;
    } else if (!wanted.empty() && !names(own)) {
        bool found = false;
        for (const auto& view : stage->inventory()) {
            if (names(view.ns)) {
                target = view.ns;
                found = true;
                break;
            }
        }
        if (!found) {
            send_error(res, 404, "invalid_request_error",
                       "No namespace '" + wanted.substr(0, 64) + "' (GET /v1/cache lists them)",
                       "namespace_not_found");
            return;
        }
    }
    const size_t removed = stage->flush_namespace(target);
    send_json(
        res,
        json{{"object", "cache.flush"}, {"namespace", target.short_hex()}, {"removed", removed}});
}

void CacheEndpoints::get_requests(const httplib::Request& req, httplib::Response& res) const {
    size_t limit = kDefaultRequests;
    try {
        limit = param_size(req, "limit", kDefaultRequests, kMaxRequests);
    } catch (const ApiError& e) {
        send_error(res, 400, "invalid_request_error", e.what(), "invalid_value");
        return;
    }
    const bool client_view = keys_.per_key_tenants();
    json data = json::array();
    for (const auto& r : ledger_.recent(limit, request_filter(res))) {
        data.push_back(r.to_json(client_view));
    }
    send_json(res, json{{"object", "list"}, {"data", data}});
}

void CacheEndpoints::get_stats(const httplib::Request&, httplib::Response& res) const {
    const RequestLedger::Totals t = ledger_.totals();
    const auto s = scheduler_.stats();
    auto rate = [](double part, double whole) { return whole > 0 ? part / whole : 0.0; };
    auto ttft = [](const RequestLedger::TtftStats& x) {
        return json{
            {"count", x.count}, {"mean_ms", x.mean_ms}, {"p50_ms", x.p50_ms}, {"p90_ms", x.p90_ms}};
    };
    json tiers = json::object();
    for (const char* tier : {"lane", "ram", "disk", "redis"}) {
        auto c = t.cached_by_tier.find(tier);
        auto v = t.saved_by_tier.find(tier);
        tiers[tier] = {{"cached_tokens", c == t.cached_by_tier.end() ? 0 : c->second},
                       {"saved_seconds", v == t.saved_by_tier.end() ? 0.0 : v->second}};
    }
    const bool client_view = keys_.per_key_tenants();
    json reasons = json::object();
    for (const auto& [reason, n] : t.miss_reasons) {
        const std::string shown = client_view ? client_miss_reason(reason) : reason;
        reasons[shown] = reasons.value(shown, uint64_t{0}) + n;
    }
    json recent = json::array();
    for (const auto& r : ledger_.recent(kStatsRequests, request_filter(res))) {
        recent.push_back(r.to_json(client_view));
    }
    json out = {
        {"object", "cache.stats"},
        {"model", model_id_},
        {"uptime_seconds",
         std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count()},
        {"requests",
         {{"total", t.requests},
          {"hits", t.hits},
          {"hit_rate", rate(static_cast<double>(t.hits), static_cast<double>(t.requests))}}},
        {"tokens",
         {{"prompt", t.prompt_tokens},
          {"cached", t.cached_tokens},
          {"prefilled", t.prefilled_tokens},
          {"hit_rate",
           rate(static_cast<double>(t.cached_tokens), static_cast<double>(t.prompt_tokens))}}},
        {"prefill",
         {{"tokens_per_second", t.tokens_per_second}, {"saved_seconds", t.saved_seconds}}},
        {"tiers", tiers},
        {"ttft", {{"hit", ttft(t.ttft_hit)}, {"miss", ttft(t.ttft_miss)}}},
        {"miss_reasons", reasons},
        {"scheduler",
         {{"lanes", s.lanes},
          {"lanes_busy", s.lanes_busy},
          {"queued", s.queued},
          {"turn_ends_deferred", s.turn_ends_deferred}}},
        {"recent", recent}};
    stage::PrefixCacheStage* stage = cache_stage(scheduler_);
    out["cache_enabled"] = stage != nullptr;
    if (stage != nullptr) {
        out["memory"] = memory_json(stage->memory());
        const auto lookups = stage->telemetry().totals();
        out["lookups"] = {{"total", lookups.lookups},
                          {"hits", lookups.hits},
                          {"restored_tokens", lookups.restored_tokens},
                          {"records_stored", lookups.records_stored},
                          {"records_dropped", lookups.records_dropped},
                          {"evictions", lookups.evictions},
                          {"quarantines", lookups.quarantines}};
    } else {
        out["memory"] = nullptr;
    }
    send_json(res, out);
}

void CacheEndpoints::get_events(const httplib::Request&, httplib::Response& res) {
    if (streams_.fetch_add(1) >= kMaxStreams) {
        streams_.fetch_sub(1);
        res.set_header("Retry-After", "5");
        send_error(res, 503, "server_error", "Too many cache event streams open",
                   "too_many_streams");
        return;
    }
    struct State {
        uint64_t last = 0;
        bool started = false;
        std::chrono::steady_clock::time_point deadline;
    };
    auto state = std::make_shared<State>();
    state->last = ledger_.last_id();
    state->deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kStreamSeconds);
    const int filter = request_filter(res);
    const bool client_view = keys_.per_key_tenants();
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, state, filter, client_view](size_t, httplib::DataSink& sink) {
            std::string out;
            if (!state->started) {
                state->started = true;
                out = "retry: 2000\n: skippy cache events\n\n";
            }
            auto quiet_since = std::chrono::steady_clock::now();
            for (;;) {
                const auto now = std::chrono::steady_clock::now();
                if (stopping_.load(std::memory_order_relaxed) || ledger_.closed() ||
                    now >= state->deadline) {
                    if (!out.empty()) {
                        sink.write(out.data(), out.size());
                    }
                    sink.done();
                    return true;
                }
                if (out.empty() && now - quiet_since >= std::chrono::seconds(15)) {
                    out = ": keep-alive\n\n";
                }
                if (!out.empty()) {
                    if (!sink.write(out.data(), out.size())) {
                        return false;
                    }
                    return true;
                }
                if (!sink.is_writable()) {
                    return false;
                }
                ledger_.wait_after(state->last, std::chrono::milliseconds(500));
                const uint64_t newest = ledger_.last_id();
                for (const auto& r : ledger_.after(state->last, filter)) {
                    if (r.id <= newest) {
                        out +=
                            "event: request\ndata: " + dump_json(r.to_json(client_view)) + "\n\n";
                    }
                }
                state->last = newest;
            }
        },
        [this](bool) { streams_.fetch_sub(1); });
}

}  // namespace skippy::server
