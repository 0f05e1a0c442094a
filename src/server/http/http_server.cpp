#include "server/http/http_server.h"

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
#include "server/http/http_server_impl.h"
#include "server/observe/cache_endpoints.h"
#include "server/observe/dashboard.h"
#include "server/observe/metrics_writer.h"
#include "server/observe/request_ledger.h"

namespace skippy::server {

using nlohmann::json;

namespace {

void send_error(httplib::Response& res, int status, const std::string& type,
                const std::string& message, const std::string& param = "",
                const std::string& code = "") {
    res.status = status;
    res.set_content(dump_json(error_body(status, type, message, param, code)), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
    send_error(res, e.status, e.type, e.what(), e.param, e.code);
}

// "application/json", with any parameters ("; charset=utf-8") and in any letter case.
bool is_json_media_type(const std::string& content_type) {
    return iequals(trim(std::string_view(content_type).substr(0, content_type.find(';'))),
                   "application/json");
}

ConnectionLimits connection_limits(const HttpServerOptions& o, const Scheduler& scheduler) {
    ConnectionLimits l;
    l.max_connections = std::max<size_t>(1, o.max_connections);
    l.header_timeout = std::chrono::milliseconds(std::max<int64_t>(1, o.header_timeout_ms));
    l.body_timeout = std::chrono::milliseconds(std::max<int64_t>(1, o.body_timeout_ms));
    l.idle_timeout = std::chrono::milliseconds(std::max<int64_t>(1, o.idle_timeout_ms));
    l.write_timeout = std::chrono::milliseconds(std::max<int64_t>(1, o.write_timeout_ms));
    l.max_requests_per_connection = std::max<size_t>(1, o.max_requests_per_connection);
    l.max_header_bytes = std::max<size_t>(1024, o.max_header_bytes);
    l.max_body_bytes = o.max_body_bytes;
    l.retry_after_seconds = o.retry_after_seconds;
    // Every request being generated holds a handler thread (it waits on its stream), so
    // there is one per lane and queue slot, plus a few for /health, /metrics and errors.
    l.handler_threads = o.handler_threads > 0
                            ? static_cast<size_t>(o.handler_threads)
                            : std::min<size_t>(256, scheduler.options().lanes +
                                                        scheduler.options().max_queue_depth + 4);
    return l;
}

}  // namespace

HttpServer::Impl::Impl(HttpServerOptions o, Scheduler& s, const OpenAiRequestParser& p,
                       std::string id, std::function<std::string()> m)
    : options(std::move(o)),
      scheduler(s),
      parser(p),
      model_id(std::move(id)),
      extra_metrics(std::move(m)),
      keys(options.api_keys),
      access_log(options.access_log),
      cache_endpoints(scheduler, keys, ledger, model_id, stopping),
      server(connection_limits(options, scheduler)) {}

void HttpServer::Impl::setup() {
    server.set_payload_max_length(options.max_body_bytes);
    // "Expect: 100-continue": refuse before the client sends the body when the key is wrong
    // or the declared body is over the limit.
    server.set_expect_100_continue_handler(
        [this](const httplib::Request& req, httplib::Response& res) {
            if (unauthorized(req)) {
                res.set_header("WWW-Authenticate", "Bearer");
                send_error(res, 401, "authentication_error", "Invalid or missing API key", "",
                           "invalid_api_key");
                return 401;
            }
            if (req.get_header_value_u64("Content-Length") > options.max_body_bytes) {
                send_error(res, 413, "invalid_request_error",
                           "Request body is too large (limit " +
                               std::to_string(options.max_body_bytes) + " bytes)",
                           "", "request_too_large");
                return 413;
            }
            return 100;
        });
    // Runs before the body is read.
    server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        AccessRecord& record = AccessLog::record(res);
        record.api_key = keys.match(req);
        record.tenant = keys.log_name(record.api_key);
        if (keys.enabled() && !open_path(req) && record.api_key < 0) {
            res.set_header("WWW-Authenticate", "Bearer");
            record.error_code = "invalid_api_key";
            if (req.path.rfind("/v1/messages", 0) == 0) {
                res.status = 401;
                res.set_content(dump_json(anthropic_error(401, "Invalid or missing API key")),
                                "application/json");
            } else {
                send_error(res, 401, "authentication_error", "Invalid or missing API key", "",
                           "invalid_api_key");
            }
            return httplib::Server::HandlerResponse::Handled;
        }
        // A declared body above the limit is refused at once (httplib would otherwise wait
        // for bytes a client may never send and answer 400 after its read timeout). The
        // connection closes, so the unread body is never parsed as a next request.
        if (req.has_header("Content-Length")) {
            const std::string length = req.get_header_value("Content-Length");
            const bool digits = !length.empty() && length.size() <= 19 &&
                                length.find_first_not_of("0123456789") == std::string::npos;
            if (digits && std::stoull(length) > options.max_body_bytes) {
                res.set_header("Connection", "close");
                send_error(res, 413, "invalid_request_error",
                           "Request body is too large (limit " +
                               std::to_string(options.max_body_bytes) + " bytes)",
                           "", "request_too_large");
                return httplib::Server::HandlerResponse::Handled;
            }
        }
        return httplib::Server::HandlerResponse::Unhandled;
    });
    // Every response httplib writes, just before its status line: the access log and its
    // counters (a streamed response is logged when its stream ends).
    server.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        access_log.response_ready(req, res);
    });
    access_log.set_observer(
        [this](const AccessRecord& record, double total_ms) { ledger.add(record, total_ms); });
    cache_endpoints.install(server);
    install_dashboard(server);
    // Any error produced by httplib itself (404, 413, 400 ...) gets an OpenAI error body.
    server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) {
            return;
        }
        std::string message = "error";
        std::string type = "invalid_request_error";
        std::string code;
        if (res.status == 404) {
            message = "Unknown endpoint: " + req.method + " " + req.path;
        } else if (res.status == 413) {
            message = "Request body is too large";
            code = "request_too_large";
        } else if (res.status == 405) {
            message = "Method not allowed";
        } else if (res.status >= 500) {
            message = "Internal server error";
            type = "server_error";
        } else {
            message = httplib::status_message(res.status);
        }
        res.set_content(dump_json(error_body(res.status, type, message, "", code)),
                        "application/json");
    });
    server.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
            std::string message = "internal error";
            try {
                std::rethrow_exception(ep);
            } catch (const std::exception& e) {
                message = e.what();
            } catch (...) {
            }
            send_error(res, 500, "server_error", message);
        });

    // Clients probe the root before their first request (Claude Code sends HEAD /).
    server.Get("/", [this](const httplib::Request&, httplib::Response& res) {
        res.set_content(dump_json(json{{"name", "skippy"}, {"model", model_id}, {"status", "ok"}}),
                        "application/json");
    });
    server.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
        const auto stats = scheduler.stats();
        res.set_content(dump_json(json{{"status", "ok"},
                                       {"lanes", stats.lanes},
                                       {"lanes_busy", stats.lanes_busy},
                                       {"queued", stats.queued}}),
                        "application/json");
    });
    server.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
        json data = json::array();
        for (const auto& id : parser.model_ids()) {
            if (id == "*") {
                continue;  // the catch-all accepts any name; it is not a model
            }
            data.push_back(json{{"id", id},
                                {"object", "model"},
                                {"created", static_cast<int64_t>(started)},
                                {"owned_by", "skippy"},
                                {"context_length", parser.n_ctx()},
                                {"max_model_len", parser.n_ctx()}});
        }
        res.set_content(dump_json(json{{"object", "list"}, {"data", data}}), "application/json");
    });
    server.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
        const std::string id = req.matches[1];
        const auto& ids = parser.model_ids();
        const bool served = std::find(ids.begin(), ids.end(), id) != ids.end() ||
                            std::find(ids.begin(), ids.end(), "*") != ids.end();
        if (!served || id == "*") {
            send_error(res, 404, "invalid_request_error", "The model '" + id + "' does not exist",
                       "model", "model_not_found");
            return;
        }
        res.set_content(dump_json(json{{"id", id},
                                       {"object", "model"},
                                       {"created", static_cast<int64_t>(started)},
                                       {"owned_by", "skippy"},
                                       {"context_length", parser.n_ctx()},
                                       {"max_model_len", parser.n_ctx()}}),
                        "application/json");
    });
    server.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res) {
        handle_anthropic(req, res);
    });
    server.Post("/v1/messages/count_tokens",
                [this](const httplib::Request& req, httplib::Response& res) {
                    handle_anthropic_count(req, res);
                });
    server.Post("/v1/responses", [this](const httplib::Request& req, httplib::Response& res) {
        handle_responses(req, res);
    });
    server.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
        handle_tokenize(req, res);
    });
    server.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
        handle_detokenize(req, res);
    });
    server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
        res.set_content(metrics_text(), "text/plain; version=0.0.4");
    });
    server.Post("/v1/chat/completions",
                [this](const httplib::Request& req, httplib::Response& res) {
                    handle_generation(Endpoint::ChatCompletions, req, res);
                });
    server.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
        handle_generation(Endpoint::Completions, req, res);
    });
}

std::string HttpServer::Impl::metrics_text() const {
    const auto s = scheduler.stats();
    metrics::MetricsWriter out;
    auto d = [](auto v) { return static_cast<double>(v); };
    out.gauge("skippy_lanes", "Request lanes.", d(s.lanes));
    out.gauge("skippy_lanes_busy", "Lanes serving a request.", d(s.lanes_busy));
    out.gauge("skippy_requests_queued", "Requests waiting for a lane.", d(s.queued));
    out.gauge("skippy_turn_ends_deferred",
              "Lanes whose end of turn waits for the server to be idle.", d(s.turn_ends_deferred));
    out.counter("skippy_requests_completed_total", "Completed requests.", d(s.requests_completed));
    out.counter("skippy_requests_cancelled_total", "Requests cancelled by the client.",
                d(s.requests_cancelled));
    out.counter("skippy_requests_failed_total", "Requests that failed.", d(s.requests_failed));
    out.counter("skippy_requests_rejected_total", "Requests refused at admission.",
                d(s.requests_rejected));
    out.counter("skippy_prompt_tokens_total", "Prompt tokens of completed requests.",
                d(s.prompt_tokens));
    out.counter("skippy_cached_tokens_total", "Prompt tokens restored from the cache.",
                d(s.cached_tokens));
    out.counter("skippy_completion_tokens_total", "Generated tokens.", d(s.completion_tokens));
    out.counter("skippy_decode_calls_total", "llama_decode batches.", d(s.decode_calls));
    const ConnectionStats c = server.stats();
    out.gauge("skippy_http_connections_open", "Open HTTP connections.", d(c.open));
    out.gauge("skippy_http_connections_max",
              "Connection cap in effect (bounded by the open-file limit).",
              d(server.limits().max_connections));
    out.counter("skippy_http_connections_accepted_total", "Accepted HTTP connections.",
                d(c.accepted));
    out.counter("skippy_http_connections_rejected_total",
                "Connections refused over the connection cap (503).", d(c.rejected));
    out.counter("skippy_http_header_timeouts_total",
                "Requests whose head did not arrive in time (408).", d(c.header_timeouts));
    out.counter("skippy_http_body_timeouts_total",
                "Requests whose body did not arrive in time (408).", d(c.body_timeouts));
    out.counter("skippy_http_oversize_headers_total",
                "Requests refused for their header size or count (431).", d(c.oversize_headers));
    out.counter("skippy_http_requests_total", "HTTP requests handed to handlers.", d(c.requests));
    access_log.write_metrics(out, c);
    ledger.write_metrics(out);
    std::string text = out.text();
    if (extra_metrics) {
        text += extra_metrics();  // the prefix cache's families (the same writer)
    }
    return text;
}

bool HttpServer::Impl::json_content_type(const httplib::Request& req,
                                         httplib::Response& res) const {
    const std::string content_type = req.get_header_value("Content-Type");
    if (!is_json_media_type(content_type)) {
        send_error(res, 415, "invalid_request_error",
                   "Content-Type must be application/json (got '" + content_type + "')");
        return false;
    }
    return true;
}

namespace {

// The body as JSON, or a 400 (in `error_format`'s shape).
json parse_body(const std::string& text) {
    if (!is_valid_utf8(text)) {
        throw invalid_request("request body is not valid UTF-8");
    }
    try {
        return json::parse(text);
    } catch (const json::exception& e) {
        throw invalid_request(std::string("request body is not valid JSON: ") + e.what());
    }
}

// Anthropic's error body has no code: the access log gets it from the record.
void send_anthropic_error(httplib::Response& res, int status, const std::string& message,
                          const std::string& code = "") {
    res.status = status;
    res.set_content(dump_json(anthropic_error(status, message)), "application/json");
    if (!code.empty()) {
        AccessLog::record(res).error_code = code;
    }
}

void append_new(std::vector<std::string>& to, const std::vector<std::string>& names) {
    for (const auto& name : names) {
        if (std::find(to.begin(), to.end(), name) == to.end()) {
            to.push_back(name);
        }
    }
}

}  // namespace

std::shared_ptr<ParsedRequest> HttpServer::Impl::parse_generation(
    Endpoint endpoint, const httplib::Request& req, httplib::Response& res,
    const Translate& translate) const {
    const auto parse_start = std::chrono::steady_clock::now();
    auto parsed = std::make_shared<ParsedRequest>();
    RequestNotes notes;  // the dialect's
    if (translate) {
        *parsed = parser.parse(endpoint, translate(parse_body(req.body), notes));
    } else {
        *parsed = parser.parse(endpoint, req.body);
    }
    append_new(parsed->notes.ignored_fields, notes.ignored_fields);
    append_new(parsed->notes.dropped_tools, notes.dropped_tools);
    AccessRecord& record = AccessLog::record(res);
    // The tenant: the API key when several are configured, and the body's cache_salt.
    GenerationRequest& gen = parsed->generation;
    gen.cache_namespace = keys.tenant_namespace(record.api_key, gen.cache_namespace);
    record.model = parsed->model;
    record.notes = parsed->notes;
    parsed->parse_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - parse_start)
            .count();
    return parsed;
}

void HttpServer::Impl::handle_generation(Endpoint endpoint, const httplib::Request& req,
                                         httplib::Response& res) {
    if (!json_content_type(req, res)) {
        return;
    }
    std::shared_ptr<ParsedRequest> parsed;
    try {
        parsed = parse_generation(endpoint, req, res);
    } catch (const ApiError& e) {
        send_error(res, e);
        return;
    } catch (const std::invalid_argument& e) {
        send_error(res, 400, "invalid_request_error", e.what());
        return;
    }
    std::shared_ptr<ApiResponse> writer = make_openai_response(parsed, parser.model());
    serve(parsed, std::move(writer), req, res);
}

void HttpServer::Impl::handle_anthropic(const httplib::Request& req, httplib::Response& res) {
    if (!is_json_media_type(req.get_header_value("Content-Type"))) {
        send_anthropic_error(res, 415, "Content-Type must be application/json",
                             "unsupported_media_type");
        return;
    }
    std::shared_ptr<ParsedRequest> parsed;
    AnthropicRequest request;
    try {
        parsed = parse_generation(
            Endpoint::ChatCompletions, req, res, [&](const json& body, RequestNotes& notes) {
                request = anthropic_request(body, nlohmann::ordered_json::parse(req.body),
                                            token_counter());
                notes = request.notes;
                return request.chat;
            });
    } catch (const ApiError& e) {
        send_anthropic_error(res, e.status, e.what(), e.code);
        return;
    } catch (const std::invalid_argument& e) {
        send_anthropic_error(res, 400, e.what());
        return;
    }
    serve(parsed,
          make_anthropic_response(parsed, request.omit_thinking, std::move(request.applied_edits)),
          req, res);
}

void HttpServer::Impl::handle_anthropic_count(const httplib::Request& req, httplib::Response& res) {
    try {
        json body = parse_body(req.body);
        if (body.is_object() && !body.contains("max_tokens")) {
            body["max_tokens"] = 1;
        }
        const AnthropicRequest request =
            anthropic_request(body, nlohmann::ordered_json::parse(req.body), token_counter());
        parser.resolve_model(find_field(request.chat, "model"));
        const size_t tokens = parser.count_chat_tokens(request.chat);
        json out = {{"input_tokens", tokens}};
        if (!request.applied_edits.is_null()) {
            // As Anthropic's API reports it: the count before the edits cleared anything.
            size_t cleared = 0;
            for (const auto& edit : request.applied_edits) {
                cleared += edit.value("cleared_input_tokens", size_t{0});
            }
            out["context_management"] = {{"original_input_tokens", tokens + cleared}};
        }
        res.set_content(dump_json(out), "application/json");
    } catch (const ApiError& e) {
        send_anthropic_error(res, e.status, e.what(), e.code);
    } catch (const std::invalid_argument& e) {
        send_anthropic_error(res, 400, e.what());
    }
}

void HttpServer::Impl::handle_responses(const httplib::Request& req, httplib::Response& res) {
    if (!json_content_type(req, res)) {
        return;
    }
    std::shared_ptr<ParsedRequest> parsed;
    json request;  // echoed in the response object
    try {
        parsed = parse_generation(Endpoint::ChatCompletions, req, res,
                                  [&](const json& body, RequestNotes& notes) {
                                      request = body;
                                      return responses_to_chat(body, notes);
                                  });
    } catch (const ApiError& e) {
        send_error(res, e);
        return;
    } catch (const std::invalid_argument& e) {
        send_error(res, 400, "invalid_request_error", e.what());
        return;
    }
    serve(parsed, make_responses_response(parsed, std::move(request)), req, res);
}

void HttpServer::Impl::handle_tokenize(const httplib::Request& req, httplib::Response& res) {
    try {
        res.set_content(dump_json(tokenize_response(parser.model(), parse_body(req.body),
                                                    options.max_body_bytes)),
                        "application/json");
    } catch (const ApiError& e) {
        send_error(res, e);
    }
}

void HttpServer::Impl::handle_detokenize(const httplib::Request& req, httplib::Response& res) {
    try {
        res.set_content(dump_json(detokenize_response(parser.model(), parse_body(req.body))),
                        "application/json");
    } catch (const ApiError& e) {
        send_error(res, e);
    }
}

HttpServer::HttpServer(HttpServerOptions options, Scheduler& scheduler,
                       const OpenAiRequestParser& parser, std::string model_id,
                       std::function<std::string()> extra_metrics)
    : impl_(std::make_unique<Impl>(std::move(options), scheduler, parser, std::move(model_id),
                                   std::move(extra_metrics))) {
    impl_->setup();
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind() {
    impl_->options.port = impl_->server.bind_port(impl_->options.host, impl_->options.port);
    return impl_->options.port;
}

void HttpServer::listen() { impl_->server.serve(); }

void HttpServer::stop() {
    if (impl_) {
        impl_->stopping.store(true, std::memory_order_relaxed);  // (signal-safe) SSE streams end
        impl_->server.request_stop();
    }
}

std::string HttpServer::limits_summary() const {
    const ConnectionLimits& l = impl_->server.limits();
    return "max_connections=" + std::to_string(l.max_connections) +
           " handler_threads=" + std::to_string(l.handler_threads) +
           " header_timeout_ms=" + std::to_string(l.header_timeout.count()) +
           " body_timeout_ms=" + std::to_string(l.body_timeout.count()) +
           " idle_timeout_ms=" + std::to_string(l.idle_timeout.count()) +
           " max_requests_per_connection=" + std::to_string(l.max_requests_per_connection) +
           " max_header_bytes=" + std::to_string(l.max_header_bytes);
}

}  // namespace skippy::server
