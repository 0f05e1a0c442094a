// The cache dashboard: GET /dashboard serves one self-contained page (src/server/
// dashboard.html, embedded in the binary at build time; no CDN, works offline) that polls
// GET /v1/cache/stats once a second: token-weighted hit rate, tokens and time saved per
// tier, TTFT of hits vs misses, miss reasons, memory per tier against its budget, the record
// queue and the last requests with their decision, restored / prefilled tokens and miss
// reason. With API keys configured the page itself is open (it holds no data) and asks for
// a key, which it sends with its requests (kept in the tab's sessionStorage).
#pragma once

#include <string_view>

#include "cpp-httplib/httplib.h"

namespace skippy::server {

std::string_view dashboard_html();
void install_dashboard(httplib::Server& server);

}  // namespace skippy::server
