// ConnectionServer in process, over loopback sockets: keep-alive and pipelining, the limits
// (head/body timeouts, connection cap), concurrent clients, stop with connections open.
#include "server/http/connection_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace skippy::server {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

int connect_to(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

void send_all(int fd, const std::string& data) {
    size_t sent = 0;
    while (sent < data.size()) {
        const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) {
            return;
        }
        sent += static_cast<size_t>(n);
    }
}

// Reads one response (head + Content-Length body) from `fd`, keeping any bytes after it in
// `rest`. Empty on timeout or close before a full response.
std::string read_response(int fd, std::string& rest, std::chrono::milliseconds timeout = 10s) {
    const auto until = Clock::now() + timeout;
    for (;;) {
        const size_t head_end = rest.find("\r\n\r\n");
        if (head_end != std::string::npos) {
            size_t length = 0;
            const size_t cl = rest.find("Content-Length: ");
            if (cl != std::string::npos && cl < head_end) {
                length = std::stoul(rest.substr(cl + 16));
            }
            if (rest.size() >= head_end + 4 + length) {
                std::string out = rest.substr(0, head_end + 4 + length);
                rest.erase(0, out.size());
                return out;
            }
        }
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
        pollfd p{fd, POLLIN, 0};
        if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
            return "";
        }
        char buf[4096];
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) {
            return "";
        }
        rest.append(buf, static_cast<size_t>(n));
    }
}

// True when the server closes `fd` (end of stream) within `timeout`.
bool closed_by_server(int fd, std::chrono::milliseconds timeout) {
    const auto until = Clock::now() + timeout;
    char buf[4096];
    while (Clock::now() < until) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 50) > 0) {
            const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
            if (n <= 0) {
                return true;
            }
        }
    }
    return false;
}

class ConnectionServerTest : public ::testing::Test {
  protected:
    void start(ConnectionLimits limits) {
        server_ = std::make_unique<ConnectionServer>(limits);
        server_->Get("/ping", [](const httplib::Request&, httplib::Response& res) {
            res.set_content("pong", "text/plain");
        });
        server_->Post("/echo", [](const httplib::Request& req, httplib::Response& res) {
            res.set_content(req.body, "text/plain");
        });
        port_ = server_->bind_port("127.0.0.1", 0);
        thread_ = std::thread([this] { server_->serve(); });
    }
    void TearDown() override {
        if (server_) {
            server_->request_stop();
            thread_.join();
        }
    }
    static ConnectionLimits fast_limits() {
        ConnectionLimits l;
        l.header_timeout = 300ms;
        l.body_timeout = 300ms;
        l.idle_timeout = 300ms;
        l.handler_threads = 4;
        l.max_connections = 64;
        l.max_requests_per_connection = 3;
        return l;
    }
    std::string get_ping(int fd, std::string& rest) {
        send_all(fd, "GET /ping HTTP/1.1\r\nHost: x\r\n\r\n");
        return read_response(fd, rest);
    }
    std::unique_ptr<ConnectionServer> server_;
    std::thread thread_;
    int port_ = 0;
};

TEST_F(ConnectionServerTest, ConcurrentKeepAliveClients) {
    start(fast_limits());
    std::atomic<int> ok{0};
    std::vector<std::thread> clients;
    for (int t = 0; t < 6; ++t) {
        clients.emplace_back([&] {
            int fd = -1;
            std::string rest;
            int on_connection = 0;
            for (int i = 0; i < 15; ++i) {
                if (fd < 0 || on_connection == 3) {  // the server closes after 3 requests
                    if (fd >= 0) {
                        ::close(fd);
                    }
                    fd = connect_to(port_);
                    rest.clear();
                    on_connection = 0;
                }
                const std::string r = get_ping(fd, rest);
                ++on_connection;
                if (r.rfind("HTTP/1.1 200", 0) == 0 && r.ends_with("pong")) {
                    ok.fetch_add(1);
                }
            }
            ::close(fd);
        });
    }
    for (auto& c : clients) {
        c.join();
    }
    EXPECT_EQ(ok.load(), 6 * 15);
    EXPECT_EQ(server_->stats().requests, 6u * 15u);
}

TEST_F(ConnectionServerTest, PipelinedRequestsAreAnsweredInOrder) {
    start(fast_limits());
    const int fd = connect_to(port_);
    send_all(fd,
             "GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"
             "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
             "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
             "2\r\nde\r\n0\r\n\r\n");
    std::string rest;
    EXPECT_TRUE(read_response(fd, rest).ends_with("pong"));
    EXPECT_TRUE(read_response(fd, rest).ends_with("abc"));
    const std::string third = read_response(fd, rest);
    EXPECT_TRUE(third.ends_with("de")) << third;
    EXPECT_NE(third.find("Connection: close"), std::string::npos);  // 3 requests per connection
    EXPECT_TRUE(closed_by_server(fd, 2s));
    ::close(fd);
}

TEST_F(ConnectionServerTest, SlowHeadsTimeOutWithoutHoldingHandlers) {
    start(fast_limits());
    std::vector<int> slow;
    for (int i = 0; i < 20; ++i) {  // five times the handler threads
        slow.push_back(connect_to(port_));
        send_all(slow.back(), "GET /ping HTTP/1.1\r\nHost:");
    }
    const int fd = connect_to(port_);
    std::string rest;
    EXPECT_TRUE(get_ping(fd, rest).ends_with("pong"));
    ::close(fd);
    for (int s : slow) {
        std::string r;
        EXPECT_EQ(read_response(s, r, 5s).rfind("HTTP/1.1 408", 0), 0u);
        ::close(s);
    }
    EXPECT_EQ(server_->stats().header_timeouts, 20u);
}

TEST_F(ConnectionServerTest, SlowBodyTimesOut) {
    start(fast_limits());
    const int fd = connect_to(port_);
    send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc");
    std::string rest;
    const std::string r = read_response(fd, rest, 5s);
    EXPECT_EQ(r.rfind("HTTP/1.1 408", 0), 0u) << r;
    ::close(fd);
    EXPECT_EQ(server_->stats().body_timeouts, 1u);
}

TEST_F(ConnectionServerTest, IdleKeepAliveConnectionIsClosed) {
    start(fast_limits());
    const int fd = connect_to(port_);
    std::string rest;
    EXPECT_TRUE(get_ping(fd, rest).ends_with("pong"));
    EXPECT_TRUE(closed_by_server(fd, 3s));
    ::close(fd);
}

TEST_F(ConnectionServerTest, OverTheCapClientsGet503AtOnce) {
    ConnectionLimits limits = fast_limits();
    limits.max_connections = 8;
    limits.header_timeout = 10s;
    start(limits);
    std::vector<int> held;
    for (int i = 0; i < 8; ++i) {
        held.push_back(connect_to(port_));
    }
    // The loop accepts the held connections before the next one (same listen queue order).
    std::this_thread::sleep_for(100ms);
    const int extra = connect_to(port_);
    std::string rest;
    const std::string r = read_response(extra, rest, 5s);
    EXPECT_EQ(r.rfind("HTTP/1.1 503", 0), 0u) << r;
    EXPECT_NE(r.find("Retry-After: 1"), std::string::npos);
    ::close(extra);
    for (int fd : held) {
        ::close(fd);
    }
    // Once they are gone, new clients are served again.
    bool served = false;
    for (int attempt = 0; attempt < 50 && !served; ++attempt) {
        std::this_thread::sleep_for(20ms);
        const int fd = connect_to(port_);
        std::string again;
        served = get_ping(fd, again).ends_with("pong");
        ::close(fd);
    }
    EXPECT_TRUE(served);
    EXPECT_GE(server_->stats().rejected, 1u);
}

TEST_F(ConnectionServerTest, StopReturnsWithConnectionsOpen) {
    ConnectionLimits limits = fast_limits();
    limits.header_timeout = 60s;
    start(limits);
    std::vector<int> open;
    for (int i = 0; i < 10; ++i) {
        open.push_back(connect_to(port_));
        send_all(open.back(), "GET /ping HTTP/1.1\r\n");
    }
    std::this_thread::sleep_for(50ms);
    const auto t0 = Clock::now();
    server_->request_stop();
    thread_.join();
    server_.reset();
    EXPECT_LT(Clock::now() - t0, 5s);
    for (int fd : open) {
        EXPECT_TRUE(closed_by_server(fd, 2s));
        ::close(fd);
    }
}

}  // namespace
}  // namespace skippy::server
