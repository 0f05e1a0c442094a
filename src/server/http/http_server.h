// HttpServer: the OpenAI-compatible HTTP surface (cpp-httplib). Routes:
//   POST /v1/chat/completions, POST /v1/completions (openai_request.h, openai_response.cpp),
//   POST /v1/messages, POST /v1/messages/count_tokens (anthropic_api.h),
//   POST /v1/responses (responses_api.h), POST /tokenize, POST /detokenize
//   (token_endpoints.h), GET /v1/models, GET /health, GET /metrics (metrics_writer.h),
//   GET/DELETE /v1/cache, GET /v1/cache/{requests,stats,events} (cache_endpoints.h),
//   GET /dashboard (dashboard.h)
// Connections are read by an event loop (ConnectionServer) that hands complete requests to
// handler threads; these parse and validate, submit to the Scheduler and wait on a
// GenerationStream.
//
// Every request gets one access-log line and its counters (access_log.h); generation
// responses name what was accepted without effect in x-skippy-ignored-fields and the tools
// left out in x-skippy-dropped-tools.
//
// Thread safety: handlers run on the handler threads; they share only the Scheduler (whose
// submit/stats are thread-safe), the AccessLog (thread-safe) and immutable configuration.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/http/access_log.h"
#include "server/http/api_keys.h"
#include "server/api/openai_request.h"
#include "server/schedule/scheduler.h"

namespace skippy::server {

struct HttpServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;
    // Keys that authorize requests (none = no authentication); with several, each key is
    // its own cache tenant (api_keys.h).
    std::vector<std::string> api_keys;
    AccessLogOptions access_log;
    size_t max_body_bytes = 8 * 1024 * 1024;
    int handler_threads = 0;  // 0 = lanes + queue depth + 4, capped at 256
    int retry_after_seconds = 1;
    // Hostile-client limits (see connection_server.h).
    size_t max_connections = 2048;  // open connections; beyond: 503 at once
    int64_t header_timeout_ms = 10000;
    int64_t body_timeout_ms = 30000;
    int64_t idle_timeout_ms = 5000;  // keep-alive wait for the next request
    int64_t write_timeout_ms = 10000;
    size_t max_requests_per_connection = 100;
    size_t max_header_bytes = 32 * 1024;
};

class HttpServer {
  public:
    HttpServer(HttpServerOptions options, Scheduler& scheduler, const OpenAiRequestParser& parser,
               std::string model_id, std::function<std::string()> extra_metrics = {});
    ~HttpServer();

    // Binds (port 0 = any free port). Returns the bound port; throws on failure.
    int bind();
    // Serves until stop() is called from another thread or a signal handler.
    void listen();
    void stop();  // async-signal-safe
    // The connection limits in effect (max_connections lowered to the open-file limit).
    std::string limits_summary() const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace skippy::server
