#include "server/observe/dashboard.h"

namespace skippy::server {

// Generated at build time from dashboard.html (src/server/observe/embed_text.cmake).
extern const char kDashboardHtml[];
extern const unsigned long kDashboardHtmlSize;

std::string_view dashboard_html() { return {kDashboardHtml, kDashboardHtmlSize}; }

void install_dashboard(httplib::Server& server) {
    server.Get("/dashboard", [](const httplib::Request&, httplib::Response& res) {
        res.set_header("Cache-Control", "no-store");
        // Everything the page needs is in it; it talks only to this server.
        res.set_header("Content-Security-Policy",
                       "default-src 'none'; script-src 'unsafe-inline'; style-src "
                       "'unsafe-inline'; connect-src 'self'; img-src 'self' data:");
        const std::string_view html = dashboard_html();
        res.set_content(std::string(html), "text/html; charset=utf-8");
    });
}

}  // namespace skippy::server
