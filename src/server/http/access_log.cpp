#include "server/http/access_log.h"

#include <cstdio>
#include <ctime>
#include <stdexcept>

#include "nlohmann/json.hpp"
#include "server/api/api_error.h"

namespace skippy::server {

using nlohmann::json;

namespace {

constexpr const char* kRecordKey = "skippy.access";
constexpr size_t kMaxLabelBytes = 64;
constexpr size_t kMaxHeaderNames = 32;

// At most `limit` bytes of UTF-8 `text`, not cutting a character.
std::string utf8_prefix(const std::string& text, size_t limit) {
    if (text.size() <= limit) {
        return text;
    }
    size_t end = limit;
    while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) {
        --end;
    }
    return text.substr(0, end);
}

// A logfmt value: bare when it is plain, else quoted with escapes.
std::string logfmt_value(const std::string& text) {
    bool plain = !text.empty();
    for (char c : text) {
        const auto u = static_cast<unsigned char>(c);
        if (u <= 0x20 || u == 0x7f || c == '"' || c == '=' || c == '\\') {
            plain = false;
            break;
        }
    }
    if (plain) {
        return text;
    }
    std::string out = "\"";
    for (char c : text) {
        const auto u = static_cast<unsigned char>(c);
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (u < 0x20 || u == 0x7f) {
            char hex[8];
            std::snprintf(hex, sizeof hex, "\\x%02x", u);
            out += hex;
        } else {
            out += c;
        }
    }
    return out + "\"";
}

std::string join(const std::vector<std::string>& names) {
    std::string out;
    for (const auto& name : names) {
        out += (out.empty() ? "" : ",") + name;
    }
    return out;
}

std::string fixed(double value) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f", value);
    return text;
}

// The error of a refused response, from its OpenAI- or Anthropic-shaped body ("error":
// {"code", "message"}), parsed once: the code the handler noted, else the body's, else the
// status's default; the message (a prefix) says which field a refused request named.
void read_error(AccessRecord& record, const httplib::Response& res) {
    const json body = json::parse(res.body, nullptr, false);
    const json* error = nullptr;
    if (body.is_object()) {
        const auto it = body.find("error");
        if (it != body.end() && it->is_object()) {
            error = &*it;
        }
    }
    auto text = [&](const char* key) {
        if (error == nullptr) {
            return std::string();
        }
        const auto it = error->find(key);
        return it != error->end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    if (record.error_code.empty()) {
        record.error_code = text("code");
    }
    if (record.error_code.empty()) {
        record.error_code = default_error_code(res.status);
    }
    record.error_message = utf8_prefix(text("message"), 200);
}

std::string utc_now() {
    const auto now = std::chrono::system_clock::now();
    const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() %
        1000;
    std::tm tm{};
    gmtime_r(&seconds, &tm);
    char text[96];
    std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<int>(ms));
    return text;
}

}  // namespace

LogFormat parse_log_format(const std::string& value) {
    if (value == "text") {
        return LogFormat::Text;
    }
    if (value == "json") {
        return LogFormat::Json;
    }
    throw std::invalid_argument("log format must be text or json, not '" + value + "'");
}

const char* log_format_name(LogFormat format) {
    return format == LogFormat::Json ? "json" : "text";
}

void AccessRecord::add(const GenerationStats& choice) {
    if (generations++ == 0) {
        stats = choice;
        return;
    }
    stats.completion_tokens += choice.completion_tokens;
}

AccessRecord& AccessLog::record(httplib::Response& res) { return *shared_record(res); }

std::shared_ptr<AccessRecord> AccessLog::shared_record(httplib::Response& res) {
    if (auto* existing = res.user_data.get<std::shared_ptr<AccessRecord>>(kRecordKey)) {
        return *existing;
    }
    auto created = std::make_shared<AccessRecord>();
    res.user_data.set(kRecordKey, created);
    return created;
}

void AccessLog::response_ready(const httplib::Request& req, httplib::Response& res) {
    auto record = shared_record(res);
    record->method = req.method;
    record->path = req.path;
    record->status = res.status;
    record->start = req.start_time_;
    if (res.status >= 400) {
        read_error(*record, res);
    }
    if (!record->streamed) {
        finish(*record);
    }
}

void AccessLog::stream_finished(AccessRecord& record, bool completed) {
    if (!completed) {
        record.cancelled = true;
    }
    if (record.status == 0) {
        record.status = 200;  // (the post-routing hook did not run: the write failed first)
    }
    finish(record);
}

void AccessLog::count(Counts& counts, const std::string& label, uint64_t n) {
    const std::string name = utf8_prefix(label, kMaxLabelBytes);
    auto it = counts.find(name);
    if (it == counts.end() && counts.size() >= kMaxLabels) {
        it = counts.emplace("other", 0).first;
    } else if (it == counts.end()) {
        it = counts.emplace(name, 0).first;
    }
    it->second += n;
}

void AccessLog::finish(AccessRecord& record) {
    if (record.logged) {
        return;
    }
    record.logged = true;
    {
        std::lock_guard<std::mutex> lock(counts_mutex_);
        if (record.status >= 400) {
            std::pair<int, std::string> key{record.status,
                                            utf8_prefix(record.error_code, kMaxLabelBytes)};
            if (!rejected_.contains(key) && rejected_.size() >= kMaxLabels) {
                key.second = "other";
            }
            ++rejected_[key];
        }
        for (const auto& field : record.notes.ignored_fields) {
            count(ignored_fields_, field);
        }
        for (const auto& tool : record.notes.dropped_tools) {
            count(dropped_tools_, tool);
        }
    }
    const double total_ms = record.start == std::chrono::steady_clock::time_point{}
                                ? 0.0
                                : std::chrono::duration<double, std::milli>(
                                      std::chrono::steady_clock::now() - record.start)
                                      .count();
    if (observer_) {
        observer_(record, total_ms);
    }
    if (!options_.enabled) {
        return;
    }
    const std::string line = options_.format == LogFormat::Json ? json_line(record, total_ms)
                                                                : text_line(record, total_ms);
    std::lock_guard<std::mutex> lock(write_mutex_);
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
}

std::string AccessLog::text_line(const AccessRecord& r, double total_ms) const {
    std::string out = "skippy: access";
    auto add = [&](const char* key, const std::string& value) {
        if (!value.empty()) {
            out += ' ';
            out += key;
            out += '=';
            out += logfmt_value(value);
        }
    };
    add("method", r.method);
    add("path", r.path);
    add("status", std::to_string(r.status));
    if (r.status >= 400) {
        add("code", r.error_code);
        add("error", r.error_message);
    }
    add("tenant", r.tenant);
    add("model", r.model);
    if (r.generations > 0) {
        const GenerationStats& s = r.stats;
        add("prompt_tokens", std::to_string(s.prompt_tokens));
        add("cached_tokens", std::to_string(s.cached_tokens));
        add("generated_tokens", std::to_string(s.completion_tokens));
        if (r.generations > 1) {
            add("choices", std::to_string(r.generations));
        }
        add("finish", s.finish_reason);
        add("cache", s.cache_decision);
        add("cache_tier", s.cache_tier);
        add("miss_reason", s.miss_reason);
        if (!s.miss_tier.empty() && s.miss_tier != "none") {
            add("miss_tier", s.miss_tier);
        }
        if (s.diverged_at >= 0) {
            add("diverged_at", std::to_string(s.diverged_at));
        }
        add("queue_ms", fixed(s.queue_ms));
        add("restore_ms", fixed(s.restore_ms));
        add("ttft_ms", fixed(s.time_to_first_token_ms));
    }
    add("total_ms", fixed(total_ms));
    add("ignored_fields", join(r.notes.ignored_fields));
    add("dropped_tools", join(r.notes.dropped_tools));
    add("stream_error", r.stream_error);
    if (r.cancelled) {
        add("cancelled", "true");
    }
    return out + '\n';
}

std::string AccessLog::json_line(const AccessRecord& r, double total_ms) const {
    json line = {{"event", "access"},
                 {"time", utc_now()},
                 {"method", r.method},
                 {"path", r.path},
                 {"status", r.status}};
    if (r.status >= 400) {
        line["code"] = r.error_code;
        line["error"] = r.error_message;
    }
    if (!r.tenant.empty()) {
        line["tenant"] = r.tenant;
    }
    if (!r.model.empty()) {
        line["model"] = r.model;
    }
    if (r.generations > 0) {
        const GenerationStats& s = r.stats;
        line["prompt_tokens"] = s.prompt_tokens;
        line["cached_tokens"] = s.cached_tokens;
        line["generated_tokens"] = s.completion_tokens;
        line["choices"] = r.generations;
        line["finish"] = s.finish_reason;
        line["cache"] = s.cache_decision;
        line["cache_tier"] = s.cache_tier;
        if (!s.miss_reason.empty()) {
            line["miss_reason"] = s.miss_reason;
        }
        if (!s.miss_tier.empty() && s.miss_tier != "none") {
            line["miss_tier"] = s.miss_tier;
        }
        if (s.diverged_at >= 0) {
            line["diverged_at"] = s.diverged_at;
        }
        line["queue_ms"] = s.queue_ms;
        line["restore_ms"] = s.restore_ms;
        line["ttft_ms"] = s.time_to_first_token_ms;
    }
    line["total_ms"] = total_ms;
    if (!r.notes.ignored_fields.empty()) {
        line["ignored_fields"] = r.notes.ignored_fields;
    }
    if (!r.notes.dropped_tools.empty()) {
        line["dropped_tools"] = r.notes.dropped_tools;
    }
    if (!r.stream_error.empty()) {
        line["stream_error"] = r.stream_error;
    }
    if (r.cancelled) {
        line["cancelled"] = true;
    }
    return dump_json(line) + '\n';
}

std::string AccessLog::header_value(const std::vector<std::string>& names) {
    std::string out;
    size_t n = 0;
    for (const auto& name : names) {
        if (n++ == kMaxHeaderNames) {
            out += ", ...";
            break;
        }
        std::string clean;
        for (char c : utf8_prefix(name, kMaxLabelBytes)) {
            const auto u = static_cast<unsigned char>(c);
            clean += u >= 0x20 && u < 0x7f && c != ',' ? c : '?';
        }
        out += (out.empty() ? "" : ", ") + clean;
    }
    return out;
}

void AccessLog::write_metrics(metrics::MetricsWriter& out,
                              const ConnectionStats& connections) const {
    std::map<std::pair<int, std::string>, uint64_t> rejected;
    Counts ignored;
    Counts dropped;
    {
        std::lock_guard<std::mutex> lock(counts_mutex_);
        rejected = rejected_;
        ignored = ignored_fields_;
        dropped = dropped_tools_;
    }
    // The connection layer's own refusals (their bodies' codes).
    const std::pair<std::pair<int, std::string>, uint64_t> own[] = {
        {{408, "request_timeout"}, connections.header_timeouts + connections.body_timeouts},
        {{431, "headers_too_large"}, connections.oversize_headers},
        {{503, "too_many_connections"}, connections.rejected},
    };
    for (const auto& [key, n] : own) {
        if (n > 0) {
            rejected[key] += n;
        }
    }
    using Type = metrics::MetricsWriter::Type;
    const char* rejected_help = "Responses with an error status, by status and error code.";
    out.declare("skippy_http_responses_rejected_total", rejected_help, Type::Counter);
    for (const auto& [key, n] : rejected) {
        out.counter("skippy_http_responses_rejected_total", rejected_help, static_cast<double>(n),
                    {{"status", std::to_string(key.first)}, {"code", key.second}});
    }
    auto family = [&](const char* name, const char* label, const char* help, const Counts& counts) {
        out.declare(name, help, Type::Counter);
        for (const auto& [value, n] : counts) {
            out.counter(name, help, static_cast<double>(n), {{label, value}});
        }
    };
    family("skippy_request_ignored_fields_total", "field",
           "Request fields accepted without effect (unknown top-level fields), by name (at "
           "most 64 names, then other).",
           ignored);
    family("skippy_request_dropped_tools_total", "type",
           "Tools left out of the prompt because the server cannot run them, by type (at most "
           "64 types, then other).",
           dropped);
}

}  // namespace skippy::server
