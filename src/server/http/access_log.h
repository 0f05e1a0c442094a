// AccessLog: one line per HTTP request on stderr once its response is complete, and the
// /metrics counters of refused requests and of what requests carried that the server
// accepted without effect (unknown top-level fields) or left out (tools it cannot run).
//
//   skippy: access method=POST path=/v1/chat/completions status=200 model=m prompt_tokens=812
//   cached_tokens=768 generated_tokens=16 finish=length cache=exact_hit cache_tier=ram
//   queue_ms=0.1 restore_ms=1.9 ttft_ms=35.2 total_ms=80.4 ignored_fields=client_metadata
//
// (one line; `--log-format json`: one JSON object per line with the same keys.)
//
// Per-request data is an AccessRecord kept in the httplib::Response's user_data: the
// pre-routing handler creates it, the handlers fill it. httplib runs the post-routing hook
// for every response it writes (routes, its own errors, refusals before the body), just
// before the status line: response_ready() logs a plain response there; a streamed one is
// logged by stream_finished(), which the handler calls from its content provider's
// releaser (the Response's destructor, after the last chunk, on the same thread).
// Responses the connection layer writes itself (408, 431, 503 over the connection cap)
// never reach httplib: metrics_text() counts them from ConnectionStats; they are not
// logged.
//
// Thread safety: all methods may be called from any handler thread; lines are written
// whole under a mutex, counters are guarded by another.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "cpp-httplib/httplib.h"
#include "server/http/connection_server.h"
#include "server/schedule/generation_stream.h"
#include "server/observe/metrics_writer.h"
#include "server/api/openai_request.h"

namespace skippy::server {

enum class LogFormat { Text, Json };
LogFormat parse_log_format(const std::string& value);  // "text" | "json"; invalid_argument
const char* log_format_name(LogFormat format);

struct AccessLogOptions {
    LogFormat format = LogFormat::Text;
    bool enabled = true;  // false: no lines (the counters still count)
};

struct AccessRecord {
    // ---- filled by the handlers ----
    int api_key = -1;           // the configured key that authorized the request (-1: none)
    std::string tenant;         // the key's log name when keys are separate tenants
    std::string model;          // the model the request named (resolved)
    RequestNotes notes;         // fields ignored, tools left out
    int generations = 0;        // choices finished
    GenerationStats stats;      // the first choice's, with the completion tokens of all
    std::string error_code;     // an error whose body carries no code (Anthropic's shape)
    std::string error_message;  // set by response_ready: the body's error.message (a prefix)
    std::string stream_error;   // an error reported inside a streamed 200
    bool streamed = false;      // logged when the stream ends (stream_finished)
    bool cancelled = false;     // the client went away before the response was complete
    void add(const GenerationStats& choice);

    // ---- set by response_ready ----
    std::string method;
    std::string path;
    int status = 0;
    std::chrono::steady_clock::time_point start{};
    bool logged = false;
};

class AccessLog {
  public:
    explicit AccessLog(AccessLogOptions options) : options_(options) {}

    // The request's record (created on first use).
    static AccessRecord& record(httplib::Response& res);
    static std::shared_ptr<AccessRecord> shared_record(httplib::Response& res);

    // The post-routing hook: every response httplib writes, before its status line.
    void response_ready(const httplib::Request& req, httplib::Response& res);
    // A streamed response ended (`completed`: its last chunk was written).
    void stream_finished(AccessRecord& record, bool completed);

    // skippy_http_responses_rejected_total{status,code} (with the connection layer's own
    // refusals from `connections`), skippy_request_ignored_fields_total{field},
    // skippy_request_dropped_tools_total{type}.
    void write_metrics(metrics::MetricsWriter& out, const ConnectionStats& connections) const;

    // Called with every finished record (before its line is written; the request ledger).
    // Set once, before serving.
    void set_observer(std::function<void(const AccessRecord&, double total_ms)> observer) {
        observer_ = std::move(observer);
    }

    // The value of an x-skippy-ignored-fields / x-skippy-dropped-tools header: the names,
    // printable ASCII only, comma-separated ("" for none).
    static std::string header_value(const std::vector<std::string>& names);

  private:
    // A label value set of bounded size: beyond kMaxLabels distinct values, "other".
    using Counts = std::map<std::string, uint64_t>;
    static constexpr size_t kMaxLabels = 64;
    static void count(Counts& counts, const std::string& label, uint64_t n = 1);

    void finish(AccessRecord& record);
    std::string text_line(const AccessRecord& record, double total_ms) const;
    std::string json_line(const AccessRecord& record, double total_ms) const;

    AccessLogOptions options_;
    std::function<void(const AccessRecord&, double)> observer_;
    mutable std::mutex counts_mutex_;
    std::map<std::pair<int, std::string>, uint64_t> rejected_;  // (status, code)
    Counts ignored_fields_;
    Counts dropped_tools_;
    std::mutex write_mutex_;
};

}  // namespace skippy::server
