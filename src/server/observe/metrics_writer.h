// MetricsWriter: the one Prometheus text-format (0.0.4) writer every /metrics emitter uses
// (the HTTP server, the access log, the request ledger, the prefix cache's telemetry and
// gauges). Samples are grouped into families: one HELP and TYPE line per metric name, however
// many label sets are added and in whatever order; label values are escaped; counters must be
// named *_total; integral values are written as integers; histograms get cumulative
// _bucket{le} lines, +Inf, _sum and _count.
//
//   MetricsWriter w;
//   w.counter("skippy_cache_lookups_total", "Cache lookups.", 3, {{"decision", "miss"}});
//   w.gauge("skippy_lanes", "Request lanes.", 4);
//   w.histogram("skippy_time_to_first_token_seconds", "TTFT.", ttft.snapshot(),
//               {{"cache", "hit"}});
//   std::string text = w.text();
//
//   Histogram h({0.01, 0.1, 1});   // bucket upper bounds (seconds, bytes...), ascending
//   h.observe(0.05);                // any thread
//
// Header-only: the stage layer (below the server layer) emits through it too.
//
// Thread safety: a MetricsWriter is used by one thread; Histogram::observe and snapshot may
// be called from any thread (atomics).
#pragma once

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace skippy::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

struct HistogramSnapshot {
    std::vector<double> bounds;     // upper bounds, ascending (+Inf implied)
    std::vector<uint64_t> buckets;  // NOT cumulative: observations in (bounds[i-1], bounds[i]]
    uint64_t count = 0;             // all observations (the +Inf bucket)
    double sum = 0;
};

class Histogram {
  public:
    explicit Histogram(std::vector<double> bounds)
        : bounds_(std::move(bounds)),
          buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size())) {
        for (size_t i = 0; i < bounds_.size(); ++i) {
            buckets_[i].store(0, std::memory_order_relaxed);
        }
    }

    void observe(double value) {
        for (size_t i = 0; i < bounds_.size(); ++i) {
            if (value <= bounds_[i]) {
                buckets_[i].fetch_add(1, std::memory_order_relaxed);
                break;
            }
        }
        count_.fetch_add(1, std::memory_order_relaxed);
        // The sum in nanounits keeps it an atomic integer (values here are seconds or
        // token counts: well inside 2^64 nanounits).
        sum_nano_.fetch_add(static_cast<uint64_t>(std::llround(std::max(0.0, value) * 1e9)),
                            std::memory_order_relaxed);
    }

    HistogramSnapshot snapshot() const {
        HistogramSnapshot s;
        s.bounds = bounds_;
        s.buckets.resize(bounds_.size());
        for (size_t i = 0; i < bounds_.size(); ++i) {
            s.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
        }
        s.count = count_.load(std::memory_order_relaxed);
        s.sum = static_cast<double>(sum_nano_.load(std::memory_order_relaxed)) / 1e9;
        return s;
    }

  private:
    std::vector<double> bounds_;
    std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
    std::atomic<uint64_t> count_{0};
    std::atomic<uint64_t> sum_nano_{0};
};

// Bounds for durations in seconds, 1 ms to 60 s.
inline std::vector<double> latency_buckets_seconds() {
    return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

class MetricsWriter {
  public:
    enum class Type { Counter, Gauge, Histogram };

    void counter(std::string_view name, std::string_view help, double value,
                 const Labels& labels = {}) {
        add(name, help, Type::Counter, labels, value);
    }
    void gauge(std::string_view name, std::string_view help, double value,
               const Labels& labels = {}) {
        add(name, help, Type::Gauge, labels, value);
    }
    // A family with no samples yet (HELP and TYPE only; e.g. a labelled counter none of
    // whose label values has been seen).
    void declare(std::string_view name, std::string_view help, Type type) {
        family(name, help, type);
    }
    void histogram(std::string_view name, std::string_view help, const HistogramSnapshot& h,
                   const Labels& labels = {}) {
        Family& f = family(name, help, Type::Histogram);
        uint64_t cumulative = 0;
        for (size_t i = 0; i < h.bounds.size(); ++i) {
            cumulative += i < h.buckets.size() ? h.buckets[i] : 0;
            Labels with = labels;
            with.emplace_back("le", number(h.bounds[i]));
            f.samples.push_back(
                sample(std::string(name) + "_bucket", with, static_cast<double>(cumulative)));
        }
        Labels inf = labels;
        inf.emplace_back("le", "+Inf");
        f.samples.push_back(
            sample(std::string(name) + "_bucket", inf, static_cast<double>(h.count)));
        f.samples.push_back(sample(std::string(name) + "_sum", labels, h.sum));
        f.samples.push_back(
            sample(std::string(name) + "_count", labels, static_cast<double>(h.count)));
    }

    std::string text() const {
        std::string out;
        for (const Family& f : families_) {
            out += "# HELP " + f.name + ' ' + escape_help(f.help) + '\n';
            out += "# TYPE " + f.name + ' ' + type_name(f.type) + '\n';
            for (const std::string& s : f.samples) {
                out += s;
            }
        }
        return out;
    }

    // A value as the exposition format writes it: integers without a fraction, +Inf, NaN.
    static std::string number(double v) {
        if (std::isnan(v)) {
            return "NaN";
        }
        if (std::isinf(v)) {
            return v > 0 ? "+Inf" : "-Inf";
        }
        if (v == std::floor(v) && std::fabs(v) < 9.007199254740992e15) {
            return std::to_string(static_cast<int64_t>(v));
        }
        char buf[64];
        auto r = std::to_chars(buf, buf + sizeof buf, v);
        return std::string(buf, r.ptr);
    }

    static std::string escape_label(std::string_view text) {
        std::string out;
        out.reserve(text.size());
        for (char c : text) {
            if (c == '\\' || c == '"') {
                out += '\\';
                out += c;
            } else if (c == '\n') {
                out += "\\n";
            } else {
                out += c;
            }
        }
        return out;
    }

  private:
    struct Family {
        std::string name;
        std::string help;
        Type type = Type::Gauge;
        std::vector<std::string> samples;
    };

    static const char* type_name(Type t) {
        switch (t) {
            case Type::Counter:
                return "counter";
            case Type::Gauge:
                return "gauge";
            case Type::Histogram:
                return "histogram";
        }
        return "untyped";
    }

    static std::string escape_help(std::string_view text) {
        std::string out;
        for (char c : text) {
            if (c == '\\') {
                out += "\\\\";
            } else if (c == '\n') {
                out += "\\n";
            } else {
                out += c;
            }
        }
        return out;
    }

    static std::string sample(const std::string& name, const Labels& labels, double value) {
        std::string out = name;
        if (!labels.empty()) {
            out += '{';
            bool first = true;
            for (const auto& [k, v] : labels) {
                out += first ? "" : ",";
                first = false;
                out += k + "=\"" + escape_label(v) + '"';
            }
            out += '}';
        }
        return out + ' ' + number(value) + '\n';
    }

    Family& family(std::string_view name, std::string_view help, Type type) {
        const std::string key(name);
        auto it = index_.find(key);
        if (it != index_.end()) {
            return families_[it->second];
        }
        index_.emplace(key, families_.size());
        families_.push_back(Family{key, std::string(help), type, {}});
        return families_.back();
    }

    void add(std::string_view name, std::string_view help, Type type, const Labels& labels,
             double value) {
        Family& f = family(name, help, type);
        f.samples.push_back(sample(f.name, labels, value));
    }

    std::vector<Family> families_;
    std::map<std::string, size_t> index_;
};

}  // namespace skippy::metrics
