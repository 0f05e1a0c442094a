// ConnectionServer: cpp-httplib's Server (routes, parsing, responses) with connection
// handling of its own, built for clients that are slow or hostile.
//
// httplib's own listen loop gives each connection a pool thread for its whole life, so a
// few hundred clients that send half a request header and stop hold every thread (each
// until its read timeout, again and again). Here one event-loop thread (epoll) owns every
// connection while its request arrives: it reads the head and the body without blocking,
// bounds how long each may take, caps open connections (a fast 503 beyond the cap) and
// requests per connection, and hands a connection to a handler thread only once its
// request is complete. The handler runs httplib's request processing (routing, error
// handlers, streaming) on the buffered bytes, then gives the connection back to the loop
// for its next request (keep-alive, pipelining) or closes it.
//
//   ConnectionServer server(limits);
//   server.Get("/health", ...);          // the httplib::Server API for routes and hooks
//   int port = server.bind_port("127.0.0.1", 0);
//   server.serve();                      // until request_stop()
//
// Thread safety: request_stop() and stats() are safe from any thread (request_stop() also
// from a signal handler); everything else is called by the thread that owns the server.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "cpp-httplib/httplib.h"

namespace skippy::server {

struct ConnectionLimits {
    size_t max_connections = 2048;                    // open connections; beyond: 503 and close
    std::chrono::milliseconds header_timeout{10000};  // first byte to end of the head
    std::chrono::milliseconds body_timeout{30000};    // end of the head to end of the body
    std::chrono::milliseconds idle_timeout{5000};     // keep-alive wait for the next request
    std::chrono::milliseconds write_timeout{10000};   // a write making no progress
    size_t max_requests_per_connection = 100;
    size_t max_header_bytes = 32 * 1024;
    size_t max_body_bytes = 8 * 1024 * 1024;
    size_t handler_threads = 16;
    int retry_after_seconds = 1;
};

struct ConnectionStats {
    uint64_t open = 0;              // connections open now (reading, handled or idle)
    uint64_t accepted = 0;          // connections accepted
    uint64_t rejected = 0;          // refused over the connection cap (503)
    uint64_t header_timeouts = 0;   // 408: the head did not arrive in time
    uint64_t body_timeouts = 0;     // 408: the body did not arrive in time
    uint64_t oversize_headers = 0;  // 431
    uint64_t requests = 0;          // requests handed to handler threads
};

class ConnectionServer : public httplib::Server {
  public:
    explicit ConnectionServer(ConnectionLimits limits);
    ~ConnectionServer() override;

    // Binds (port 0 = any free port) and returns the port; throws std::runtime_error.
    // Raises the process's open-file limit to its hard limit and lowers max_connections to
    // what that limit allows.
    int bind_port(const std::string& host, int port);
    // Serves until request_stop(); returns once in-flight requests have finished.
    void serve();
    void request_stop() noexcept;
    bool serving() const;
    ConnectionStats stats() const;
    const ConnectionLimits& limits() const;

  private:
    struct Impl;
    friend struct Impl;
    // httplib's per-request processing on `strm` (a complete request is buffered in it).
    bool process(httplib::Stream& strm, const std::string& remote_ip, int remote_port,
                 const std::string& local_ip, int local_port, bool close_connection,
                 bool& connection_closed);
    std::unique_ptr<Impl> impl_;
};

}  // namespace skippy::server
