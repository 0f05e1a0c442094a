// HttpServer::Impl: the HTTP front end's state and handlers, shared by http_server.cpp
// (routes, parsing, the endpoints) and http_serve.cpp (running a request's generations and
// writing them, streamed or not). Private to src/server/http/.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <deque>

#include "cpp-httplib/httplib.h"
#include "server/api/anthropic_api.h"
#include "server/api/api_error.h"
#include "server/api/api_response.h"
#include "server/api/json_fields.h"
#include "server/api/responses_api.h"
#include "server/api/text_output.h"
#include "server/api/token_endpoints.h"
#include "server/http/background_work.h"
#include "server/http/connection_server.h"
#include "server/http/http_framing.h"
#include "server/http/http_server.h"
#include "server/observe/cache_endpoints.h"
#include "server/observe/dashboard.h"
#include "server/observe/metrics_writer.h"
#include "server/observe/request_ledger.h"

namespace skippy::server {

// Handler threads wait on their GenerationStream's condition variable, which wakes them
// as soon as the scheduler pushes output; the timeout only bounds how long a handler goes
// without checking whether its client has gone (then the lane is freed).
inline constexpr auto kDisconnectCheck = std::chrono::milliseconds(50);

struct HttpServer::Impl {
    HttpServerOptions options;
    Scheduler& scheduler;
    const OpenAiRequestParser& parser;
    std::string model_id;
    std::function<std::string()> extra_metrics;
    ApiKeys keys;
    AccessLog access_log;
    RequestLedger ledger;
    std::atomic<bool> stopping{false};
    CacheEndpoints cache_endpoints;
    ConnectionServer server;
    BackgroundWork background;
    std::time_t started = std::time(nullptr);

    Impl(HttpServerOptions o, Scheduler& s, const OpenAiRequestParser& p, std::string id,
         std::function<std::string()> m);

    void setup();
    // Paths open without a key: /health, and the dashboard page (it holds no data; it
    // asks for the key and sends it with its requests).
    static bool open_path(const httplib::Request& req) {
        return req.path == "/health" || req.path == "/dashboard";
    }
    // Whether the request must carry a configured API key and does not.
    bool unauthorized(const httplib::Request& req) const {
        return keys.enabled() && !open_path(req) && keys.match(req) < 0;
    }
    // A generation request's body as a ParsedRequest: `translate` (a dialect: Messages,
    // Responses) turns the JSON body into a chat completions body and notes what it accepted
    // without effect or left out; without it the body is `endpoint`'s own. Then the
    // request's cache tenant (API key, cache_salt) and its access-log record. Throws ApiError
    // or std::invalid_argument.
    using Translate =
        std::function<nlohmann::json(const nlohmann::json& body, RequestNotes& notes)>;
    std::shared_ptr<ParsedRequest> parse_generation(Endpoint endpoint, const httplib::Request& req,
                                                    httplib::Response& res,
                                                    const Translate& translate = {}) const;
    void handle_generation(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
    // Runs the request's generations (n choices, one after the other) and answers with
    // `writer`'s format, streamed or not. `send_error` formats errors before any output.
    void serve(std::shared_ptr<const ParsedRequest> parsed, std::shared_ptr<ApiResponse> writer,
               const httplib::Request& req, httplib::Response& res);
    void handle_anthropic(const httplib::Request& req, httplib::Response& res);
    void handle_anthropic_count(const httplib::Request& req, httplib::Response& res);
    void handle_responses(const httplib::Request& req, httplib::Response& res);
    void handle_tokenize(const httplib::Request& req, httplib::Response& res);
    void handle_detokenize(const httplib::Request& req, httplib::Response& res);
    void send_api_error(httplib::Response& res, const ApiResponse& writer, int status,
                        const std::string& type, const std::string& message) const;
    bool json_content_type(const httplib::Request& req, httplib::Response& res) const;
    // Prompt tokens of a chat body (Anthropic's context edits measure what they clear).
    TokenCounter token_counter() const {
        return [this](const nlohmann::json& chat) { return parser.count_chat_tokens(chat); };
    }
    std::string metrics_text() const;
};

}  // namespace skippy::server
