// HttpServer: the OpenAI-compatible HTTP surface (cpp-httplib). Routes:
//   POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health, GET /metrics
// Handler threads parse and validate, submit to the Scheduler and wait on a GenerationStream.
//
// Thread safety: handlers run on httplib's thread pool; they share only the Scheduler (whose
// submit/stats are thread-safe) and immutable configuration.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "server/openai_request.h"
#include "server/scheduler.h"

namespace skippy::server {

struct HttpServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;
    std::string api_key;  // empty = no authentication
    size_t max_body_bytes = 8 * 1024 * 1024;
    int handler_threads = 0;  // 0 = lanes + queue depth, capped
    int retry_after_seconds = 1;
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
    void stop();

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Constant-time comparison of secrets (time depends only on the lengths).
bool secrets_equal(const std::string& a, const std::string& b);

}  // namespace skippy::server
