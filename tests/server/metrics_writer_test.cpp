// MetricsWriter: families grouped whatever the order samples are added in, label escaping,
// integer formatting, cumulative histograms.
#include "server/observe/metrics_writer.h"

#include <gtest/gtest.h>

namespace skippy::metrics {
namespace {

TEST(MetricsWriter, GroupsFamiliesAndEscapes) {
    MetricsWriter w;
    w.counter("x_total", "Xs.", 1, {{"kind", "a"}});
    w.gauge("y", "Y.", 2.5);
    w.counter("x_total", "Xs.", 3, {{"kind", "q\"\\\n"}});
    w.declare("z_total", "Nothing yet.", MetricsWriter::Type::Counter);
    EXPECT_EQ(w.text(),
              "# HELP x_total Xs.\n# TYPE x_total counter\n"
              "x_total{kind=\"a\"} 1\nx_total{kind=\"q\\\"\\\\\\n\"} 3\n"
              "# HELP y Y.\n# TYPE y gauge\ny 2.5\n"
              "# HELP z_total Nothing yet.\n# TYPE z_total counter\n");
}

TEST(MetricsWriter, HistogramIsCumulative) {
    Histogram h({0.1, 1});
    h.observe(0.05);
    h.observe(0.5);
    h.observe(0.7);
    h.observe(5);
    MetricsWriter w;
    w.histogram("t_seconds", "T.", h.snapshot(), {{"cache", "hit"}});
    EXPECT_EQ(w.text(),
              "# HELP t_seconds T.\n# TYPE t_seconds histogram\n"
              "t_seconds_bucket{cache=\"hit\",le=\"0.1\"} 1\n"
              "t_seconds_bucket{cache=\"hit\",le=\"1\"} 3\n"
              "t_seconds_bucket{cache=\"hit\",le=\"+Inf\"} 4\n"
              "t_seconds_sum{cache=\"hit\"} 6.25\n"
              "t_seconds_count{cache=\"hit\"} 4\n");
}

}  // namespace
}  // namespace skippy::metrics
