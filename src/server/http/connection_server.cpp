#include "server/http/connection_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <vector>

#include "server/http/http_framing.h"

namespace skippy::server {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kSweepInterval{100};
constexpr milliseconds kLingerTime{1000};  // reading what a refused client still sends
constexpr size_t kMaxLingerBytes = 1 << 20;
constexpr size_t kMaxClosing = 4096;  // connections lingering before their close
constexpr size_t kReadChunk = 16 * 1024;
constexpr size_t kAcceptBurst = 256;  // accepts per loop turn (timers still run)

// Set by the response logger on the handler thread: the response says "Connection: close"
// (httplib closes after every error status, whatever the request asked).
thread_local bool t_response_closes = false;

struct Connection {
    enum class State { Head, Body, Handled, Closing };
    int fd = -1;
    std::string remote_ip;
    int remote_port = 0;
    std::string local_ip;
    int local_port = 0;
    std::string buf;  // bytes received and not consumed yet start at `off`
    size_t off = 0;
    State state = State::Head;
    bool idle = false;  // Head: waiting for the first byte of a keep-alive request
    Clock::time_point deadline;
    size_t served = 0;
    size_t scanned = 0;  // Head: pending bytes already searched for the end of the head
    RequestFraming::Body body = RequestFraming::Body::None;
    uint64_t need = 0;  // ContentLength body: pending bytes the request needs
    ChunkedBodyScanner chunks;
    size_t chunk_fed = 0;      // Chunked body: pending bytes fed to the scanner
    size_t discarded = 0;      // Closing: bytes read and dropped
    bool peer_closed = false;  // the client sent end of stream

    std::string_view pending() const { return std::string_view(buf).substr(off); }
    void compact() {
        buf.erase(0, off);
        off = 0;
    }
};

std::string ip_of(const sockaddr_storage& addr, int& port) {
    char text[INET6_ADDRSTRLEN] = {};
    if (addr.ss_family == AF_INET) {
        sockaddr_in a{};
        std::memcpy(&a, &addr, sizeof a);
        inet_ntop(AF_INET, &a.sin_addr, text, sizeof text);
        port = ntohs(a.sin_port);
    } else if (addr.ss_family == AF_INET6) {
        sockaddr_in6 a{};
        std::memcpy(&a, &addr, sizeof a);
        inet_ntop(AF_INET6, &a.sin6_addr, text, sizeof text);
        port = ntohs(a.sin6_port);
    }
    return text;
}

bool poll_fd(int fd, short events, milliseconds timeout) {
    const auto until = Clock::now() + timeout;
    for (;;) {
        pollfd p{fd, events, 0};
        const auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
        const int n = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
        if (n > 0) {
            return true;
        }
        if (n == 0 || errno != EINTR) {
            return false;
        }
    }
}

void send_best_effort(int fd, const std::string& data) {
    (void)::send(fd, data.data(), data.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

// The httplib::Stream a handler thread reads its request from: the bytes the event loop
// buffered first, then the socket (reads bounded by a deadline, writes by a no-progress
// timeout). Leftover bytes (a pipelined next request) stay in the connection's buffer.
class ConnectionStream final : public httplib::Stream {
  public:
    ConnectionStream(Connection& c, Clock::time_point read_deadline, milliseconds write_timeout)
        : c_(c), read_deadline_(read_deadline), write_timeout_(write_timeout) {}

    bool is_readable() const override { return c_.off < c_.buf.size(); }
    bool wait_readable() const override { return is_readable() || poll_fd(c_.fd, POLLIN, left()); }
    bool wait_writable() const override { return poll_fd(c_.fd, POLLOUT, write_timeout_); }

    ssize_t read(char* ptr, size_t size) override {
        if (is_readable()) {
            const size_t n = std::min(size, c_.buf.size() - c_.off);
            std::memcpy(ptr, c_.buf.data() + c_.off, n);
            c_.off += n;
            return static_cast<ssize_t>(n);
        }
        for (;;) {
            if (!poll_fd(c_.fd, POLLIN, left())) {
                return -1;  // the body did not arrive in time
            }
            const ssize_t n = ::recv(c_.fd, ptr, size, MSG_DONTWAIT);
            if (n >= 0) {
                return n;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                return -1;
            }
        }
    }

    ssize_t write(const char* ptr, size_t size) override {
        for (;;) {
            const ssize_t n = ::send(c_.fd, ptr, size, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n >= 0) {
                return n;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                return -1;
            }
            if (!poll_fd(c_.fd, POLLOUT, write_timeout_)) {
                return -1;
            }
        }
    }

    void get_remote_ip_and_port(std::string& ip, int& port) const override {
        ip = c_.remote_ip;
        port = c_.remote_port;
    }
    void get_local_ip_and_port(std::string& ip, int& port) const override {
        ip = c_.local_ip;
        port = c_.local_port;
    }
    socket_t socket() const override { return c_.fd; }
    time_t duration() const override {
        return std::chrono::duration_cast<milliseconds>(Clock::now() - start_).count();
    }
    const char* buffered_data(size_t& size) const override {
        size = c_.buf.size() - c_.off;
        return size > 0 ? c_.buf.data() + c_.off : nullptr;
    }
    void consume_buffered(size_t size) override {
        c_.off += std::min(size, c_.buf.size() - c_.off);
    }

  private:
    milliseconds left() const {
        return std::max(milliseconds(0),
                        std::chrono::duration_cast<milliseconds>(read_deadline_ - Clock::now()));
    }
    Connection& c_;
    Clock::time_point read_deadline_;
    milliseconds write_timeout_;
    Clock::time_point start_ = Clock::now();
};

}  // namespace

struct ConnectionServer::Impl {
    ConnectionServer& owner;
    ConnectionLimits limits;
    HeadLimits head_limits;
    int listen_fd = -1;
    int epoll_fd = -1;
    int wake_fd = -1;
    int reserve_fd = -1;  // given up to accept (and refuse) a client when out of descriptors
    std::atomic<bool> stopping{false};
    std::atomic<bool> running{false};

    // Loop thread only.
    std::unordered_map<int, std::unique_ptr<Connection>> conns;
    size_t closing = 0;

    // Shared with handler threads.
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<std::unique_ptr<Connection>> queue;
    std::vector<std::unique_ptr<Connection>> returned;
    bool handlers_stop = false;
    std::vector<std::thread> handlers;

    std::atomic<uint64_t> open{0};
    std::atomic<uint64_t> accepted{0};
    std::atomic<uint64_t> rejected{0};
    std::atomic<uint64_t> header_timeouts{0};
    std::atomic<uint64_t> body_timeouts{0};
    std::atomic<uint64_t> oversize_headers{0};
    std::atomic<uint64_t> requests{0};

    std::string busy_response;

    Impl(ConnectionServer& o, ConnectionLimits l) : owner(o), limits(l) {
        head_limits.max_bytes = limits.max_header_bytes;
        busy_response =
            canned_error_response(503, "server_error", "Server is busy: too many open connections",
                                  "too_many_connections", limits.retry_after_seconds);
    }

    ~Impl() {
        // listen_fd belongs to httplib::Server (svr_sock_), which closes it in stop().
        for (int fd : {epoll_fd, wake_fd, reserve_fd}) {
            if (fd >= 0) {
                ::close(fd);
            }
        }
    }

    // ---- event loop ----

    void watch(Connection& c) {
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLRDHUP;
        ev.data.fd = c.fd;
        epoll_ctl(epoll_fd, EPOLL_CTL_ADD, c.fd, &ev);
    }

    void close_now(Connection& c) {
        const int fd = c.fd;
        if (c.state == Connection::State::Closing) {
            --closing;
        } else {
            open.fetch_sub(1, std::memory_order_relaxed);
        }
        ::close(fd);  // also leaves the epoll set
        conns.erase(fd);
    }

    // Sends what is left to say (if anything), then reads and drops what the client still
    // sends for a moment before closing, so that the response is not lost to a reset.
    void close_gracefully(Connection& c, const std::string& response, Clock::time_point now) {
        if (!response.empty()) {
            send_best_effort(c.fd, response);
        }
        if (c.state != Connection::State::Closing) {
            open.fetch_sub(1, std::memory_order_relaxed);
            ++closing;
            c.state = Connection::State::Closing;
        }
        ::shutdown(c.fd, SHUT_WR);
        c.deadline = now + kLingerTime;
        c.buf.clear();
        c.off = 0;
        if (closing > kMaxClosing) {
            close_now(c);
        }
    }

    // Over the connection cap: a 503 at once, then a short linger (when there is room for
    // one) so that the client's request bytes do not turn the close into a reset.
    void refuse(int fd, Clock::time_point now, bool linger) {
        rejected.fetch_add(1, std::memory_order_relaxed);
        if (!linger || closing >= kMaxClosing) {
            send_best_effort(fd, busy_response);
            ::close(fd);
            return;
        }
        auto c = std::make_unique<Connection>();
        c->fd = fd;
        c->state = Connection::State::Closing;
        ++closing;
        watch(*c);
        Connection& ref = *c;
        conns.emplace(fd, std::move(c));
        close_gracefully(ref, busy_response, now);
    }

    void accept_all(Clock::time_point now) {
        for (size_t k = 0; k < kAcceptBurst; ++k) {
            sockaddr_storage addr{};
            socklen_t len = sizeof addr;
            const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len,
                                     SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) {
                if (errno == EINTR || errno == ECONNABORTED) {
                    continue;
                }
                if ((errno == EMFILE || errno == ENFILE) && reserve_fd >= 0) {
                    // Out of descriptors: free the reserve to take the client off the
                    // backlog and refuse it, instead of spinning on a readable listener.
                    ::close(reserve_fd);
                    const int refused = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
                    if (refused >= 0) {
                        refuse(refused, now, false);
                    }
                    reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
                    continue;
                }
                return;  // EAGAIN: nothing left to accept
            }
            accepted.fetch_add(1, std::memory_order_relaxed);
            if (open.load(std::memory_order_relaxed) >= limits.max_connections) {
                refuse(fd, now, true);
                continue;
            }
            const int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            auto c = std::make_unique<Connection>();
            c->fd = fd;
            c->remote_ip = ip_of(addr, c->remote_port);
            sockaddr_storage local{};
            socklen_t local_len = sizeof local;
            if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) == 0) {
                c->local_ip = ip_of(local, c->local_port);
            }
            c->deadline = now + limits.header_timeout;  // from accept to the end of the head
            open.fetch_add(1, std::memory_order_relaxed);
            watch(*c);
            conns.emplace(fd, std::move(c));
        }
    }

    void dispatch(Connection& c) {
        epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.fd, nullptr);
        c.state = Connection::State::Handled;
        requests.fetch_add(1, std::memory_order_relaxed);
        auto node = conns.extract(c.fd);
        {
            std::lock_guard<std::mutex> lock(mutex);
            queue.push_back(std::move(node.mapped()));
        }
        ready.notify_one();
    }

    // Looks at what a connection has buffered: waits for more, hands a complete request to
    // a handler, or answers by itself.
    void advance(Connection& c, Clock::time_point now) {
        const std::string_view p = c.pending();
        if (c.state == Connection::State::Head) {
            const size_t from = c.scanned >= 3 ? c.scanned - 3 : 0;
            const size_t found = find_head_end(p.substr(from));
            const size_t end = found == 0 ? 0 : from + found;
            c.scanned = p.size();
            if (end == 0 || end > limits.max_header_bytes) {
                if (p.size() > limits.max_header_bytes) {
                    oversize_headers.fetch_add(1, std::memory_order_relaxed);
                    close_gracefully(
                        c,
                        canned_error_response(431, "invalid_request_error",
                                              "Request headers are too large", "headers_too_large"),
                        now);
                }
                return;
            }
            const RequestFraming framing = parse_framing(p.substr(0, end), head_limits);
            if (framing.problem != RequestFraming::Problem::None) {
                oversize_headers.fetch_add(1, std::memory_order_relaxed);
                close_gracefully(c,
                                 canned_error_response(
                                     431, "invalid_request_error",
                                     framing.problem == RequestFraming::Problem::TooManyHeaders
                                         ? "Too many request headers (limit " +
                                               std::to_string(head_limits.max_count) + ")"
                                         : "A request header line is too long (limit " +
                                               std::to_string(head_limits.max_line) + " bytes)",
                                     "headers_too_large"),
                                 now);
                return;
            }
            c.body = framing.body;
            // Bodies the client only sends after a 100 Continue, bodies above the limit (413
            // before they are read) and unclear framing go to httplib right away.
            const bool hand_over_now = framing.body == RequestFraming::Body::None ||
                                       framing.body == RequestFraming::Body::HandOver ||
                                       framing.expect_continue ||
                                       (framing.body == RequestFraming::Body::ContentLength &&
                                        framing.content_length > limits.max_body_bytes);
            if (hand_over_now) {
                dispatch(c);
                return;
            }
            c.state = Connection::State::Body;
            c.deadline = now + limits.body_timeout;
            c.need = end + framing.content_length;
            c.chunks = ChunkedBodyScanner(limits.max_body_bytes);
            c.chunk_fed = end;
        }
        if (c.state == Connection::State::Body) {
            if (c.body == RequestFraming::Body::ContentLength) {
                if (p.size() >= c.need) {
                    dispatch(c);
                }
                return;
            }
            const auto result = c.chunks.feed(p.substr(c.chunk_fed));
            c.chunk_fed = p.size();
            if (result == ChunkedBodyScanner::Result::Complete) {
                dispatch(c);
            } else if (result == ChunkedBodyScanner::Result::TooLarge) {
                close_gracefully(
                    c,
                    canned_error_response(413, "invalid_request_error",
                                          "Request body is too large (limit " +
                                              std::to_string(limits.max_body_bytes) + " bytes)",
                                          "request_too_large"),
                    now);
            } else if (result == ChunkedBodyScanner::Result::Invalid) {
                close_gracefully(
                    c,
                    canned_error_response(400, "invalid_request_error",
                                          "Malformed chunked request body", "invalid_chunked_body"),
                    now);
            }
        }
    }

    void on_readable(Connection& c, Clock::time_point now) {
        char chunk[kReadChunk];
        for (;;) {
            // Read no more than the request can use: a head over the limit is refused,
            // a body beyond its length is the next (pipelined) request.
            if (c.state == Connection::State::Head &&
                c.pending().size() > limits.max_header_bytes) {
                break;
            }
            if (c.state == Connection::State::Body &&
                c.body == RequestFraming::Body::ContentLength && c.pending().size() >= c.need) {
                break;
            }
            if (c.state == Connection::State::Body &&
                c.pending().size() > limits.max_body_bytes + limits.max_header_bytes + kReadChunk) {
                break;  // the chunk scanner has seen enough to decide
            }
            const ssize_t n = ::recv(c.fd, chunk, sizeof chunk, 0);
            if (n > 0) {
                if (c.state == Connection::State::Closing) {
                    c.discarded += static_cast<size_t>(n);
                    if (c.discarded > kMaxLingerBytes) {
                        close_now(c);
                        return;
                    }
                    continue;
                }
                if (c.idle) {
                    c.idle = false;  // a keep-alive request starts: its head has a deadline
                    c.deadline = now + limits.header_timeout;
                }
                c.buf.append(chunk, static_cast<size_t>(n));
                continue;
            }
            if (n < 0 && errno == EINTR) {
                continue;
            }
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                break;
            }
            if (n < 0 || c.state == Connection::State::Closing) {
                close_now(c);
                return;
            }
            // End of stream: a client may half-close after sending its request and still
            // read the answer, so a complete request is served (and the connection closed
            // after it); anything else is dropped.
            c.peer_closed = true;
            const int fd = c.fd;
            advance(c, now);
            if (const auto it = conns.find(fd);
                it != conns.end() && it->second->state != Connection::State::Handled) {
                close_now(*it->second);
            }
            return;
        }
        if (c.state != Connection::State::Closing) {
            advance(c, now);
        }
    }

    void take_returned(Clock::time_point now) {
        std::vector<std::unique_ptr<Connection>> back;
        {
            std::lock_guard<std::mutex> lock(mutex);
            back.swap(returned);
        }
        for (auto& owned : back) {
            Connection& c = *owned;
            const int fd = c.fd;
            conns.emplace(fd, std::move(owned));
            watch(c);
            if (c.state == Connection::State::Closing) {
                // Counted as open until here; close_gracefully moves it to `closing`.
                c.state = Connection::State::Handled;
                close_gracefully(c, "", now);
                continue;
            }
            if (!c.buf.empty()) {
                advance(c, now);  // a pipelined request is already here
            }
        }
    }

    void sweep(Clock::time_point now) {
        std::vector<Connection*> late;
        for (auto& [fd, c] : conns) {
            if (c->deadline <= now) {
                late.push_back(c.get());
            }
        }
        for (Connection* c : late) {
            switch (c->state) {
                case Connection::State::Head:
                    if (c->idle) {
                        close_now(*c);  // keep-alive connection unused: close quietly
                        break;
                    }
                    header_timeouts.fetch_add(1, std::memory_order_relaxed);
                    close_gracefully(
                        *c,
                        canned_error_response(408, "invalid_request_error",
                                              "The request head did not arrive in time",
                                              "request_timeout"),
                        now);
                    break;
                case Connection::State::Body:
                    body_timeouts.fetch_add(1, std::memory_order_relaxed);
                    close_gracefully(
                        *c,
                        canned_error_response(408, "invalid_request_error",
                                              "The request body did not arrive in time",
                                              "request_timeout"),
                        now);
                    break;
                case Connection::State::Closing:
                case Connection::State::Handled:
                    close_now(*c);
                    break;
            }
        }
    }

    void run_loop() {
        epoll_event events[256];
        auto last_sweep = Clock::now();
        while (!stopping.load(std::memory_order_acquire)) {
            const int n =
                epoll_wait(epoll_fd, events, 256, static_cast<int>(kSweepInterval.count()));
            const auto now = Clock::now();
            for (int i = 0; i < n; ++i) {
                const int fd = events[i].data.fd;
                if (fd == listen_fd) {
                    accept_all(now);
                } else if (fd == wake_fd) {
                    uint64_t value = 0;
                    (void)!::read(wake_fd, &value, sizeof value);
                    take_returned(now);
                } else if (const auto it = conns.find(fd); it != conns.end()) {
                    on_readable(*it->second, now);
                }
            }
            if (now - last_sweep >= kSweepInterval) {
                last_sweep = now;
                sweep(now);
            }
        }
    }

    // ---- handler threads ----

    void handle(Connection& c) {
        ConnectionStream strm(c, Clock::now() + limits.body_timeout, limits.write_timeout);
        const bool last = c.served + 1 >= limits.max_requests_per_connection ||
                          stopping.load(std::memory_order_relaxed);
        bool closed = false;
        bool ok = false;
        t_response_closes = false;
        try {
            ok = owner.process(strm, c.remote_ip, c.remote_port, c.local_ip, c.local_port, last,
                               closed);
        } catch (...) {
            ok = false;
        }
        ++c.served;
        c.compact();
        c.scanned = 0;
        if (!ok || closed || last || t_response_closes || c.peer_closed) {
            c.state = Connection::State::Closing;
            return;
        }
        c.state = Connection::State::Head;
        c.idle = c.buf.empty();
        c.deadline = Clock::now() + (c.idle ? limits.idle_timeout : limits.header_timeout);
    }

    void handler_loop() {
        for (;;) {
            std::unique_ptr<Connection> c;
            {
                std::unique_lock<std::mutex> lock(mutex);
                ready.wait(lock, [&] { return handlers_stop || !queue.empty(); });
                if (handlers_stop) {
                    return;
                }
                c = std::move(queue.front());
                queue.pop_front();
            }
            handle(*c);
            {
                std::lock_guard<std::mutex> lock(mutex);
                returned.push_back(std::move(c));
            }
            const uint64_t one = 1;
            (void)!::write(wake_fd, &one, sizeof one);
        }
    }
};

ConnectionServer::ConnectionServer(ConnectionLimits limits)
    : impl_(std::make_unique<Impl>(*this, limits)) {
    set_logger([](const httplib::Request&, const httplib::Response& res) {
        t_response_closes = res.get_header_value("Connection") == "close";
    });
    set_keep_alive_max_count(std::max<size_t>(1, limits.max_requests_per_connection));
    set_keep_alive_timeout(std::max<time_t>(
        1, std::chrono::duration_cast<std::chrono::seconds>(limits.idle_timeout).count()));
    set_payload_max_length(limits.max_body_bytes);
}

ConnectionServer::~ConnectionServer() {
    request_stop();
    httplib::Server::stop();  // the listening socket, if serve() never ran
}

bool ConnectionServer::process(httplib::Stream& strm, const std::string& remote_ip, int remote_port,
                               const std::string& local_ip, int local_port, bool close_connection,
                               bool& connection_closed) {
    return process_request(strm, remote_ip, remote_port, local_ip, local_port, close_connection,
                           connection_closed, nullptr, nullptr);
}

int ConnectionServer::bind_port(const std::string& host, int port) {
    Impl& m = *impl_;
    // Every connection is a descriptor: use what the hard limit allows.
    rlimit files{};
    if (getrlimit(RLIMIT_NOFILE, &files) == 0) {
        if (files.rlim_cur < files.rlim_max) {
            files.rlim_cur = std::min<rlim_t>(files.rlim_max, 1 << 20);
            setrlimit(RLIMIT_NOFILE, &files);
            getrlimit(RLIMIT_NOFILE, &files);
        }
        constexpr rlim_t kReserved = 256;  // model files, logs, the cache's own files
        const rlim_t usable =
            files.rlim_cur > 2 * kReserved ? files.rlim_cur - kReserved : files.rlim_cur / 2;
        m.limits.max_connections = std::min<size_t>(m.limits.max_connections, usable);
    }
    const int bound = port == 0 ? bind_to_any_port(host) : (bind_to_port(host, port) ? port : -1);
    if (bound < 0) {
        throw std::runtime_error("cannot bind to " + host + ":" + std::to_string(port));
    }
    // The socket stays httplib's (svr_sock_): httplib ends streamed responses once it is
    // gone, which is what stop() does.
    m.listen_fd = svr_sock_.load();
    ::listen(m.listen_fd, 4096);  // a deeper backlog than httplib's for connection bursts
    fcntl(m.listen_fd, F_SETFL, fcntl(m.listen_fd, F_GETFL) | O_NONBLOCK);
    m.epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    m.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    m.reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (m.epoll_fd < 0 || m.wake_fd < 0) {
        throw std::runtime_error(std::string("cannot set up the event loop: ") +
                                 std::strerror(errno));
    }
    for (int fd : {m.listen_fd, m.wake_fd}) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.fd = fd;
        epoll_ctl(m.epoll_fd, EPOLL_CTL_ADD, fd, &ev);
    }
    return bound;
}

void ConnectionServer::serve() {
    Impl& m = *impl_;
    if (m.listen_fd < 0) {
        throw std::logic_error("ConnectionServer::serve before bind_port");
    }
    m.running = true;
    for (size_t i = 0; i < std::max<size_t>(1, m.limits.handler_threads); ++i) {
        m.handlers.emplace_back([&m] { m.handler_loop(); });
    }
    m.run_loop();
    // Stop: no new connections (httplib then also ends streamed responses), drop the
    // connections waiting for a request, let handlers finish what they are serving.
    m.listen_fd = -1;
    httplib::Server::stop();
    while (!m.conns.empty()) {
        m.close_now(*m.conns.begin()->second);
    }
    {
        std::lock_guard<std::mutex> lock(m.mutex);
        m.handlers_stop = true;
    }
    m.ready.notify_all();
    for (auto& t : m.handlers) {
        t.join();
    }
    m.handlers.clear();
    for (auto* list : {&m.queue}) {
        for (auto& c : *list) {
            ::close(c->fd);
        }
        list->clear();
    }
    for (auto& c : m.returned) {
        ::close(c->fd);
    }
    m.returned.clear();
    m.open = 0;
    m.running = false;
}

void ConnectionServer::request_stop() noexcept {
    impl_->stopping.store(true, std::memory_order_release);
    if (impl_->wake_fd >= 0) {
        const uint64_t one = 1;
        (void)!::write(impl_->wake_fd, &one, sizeof one);
    }
}

bool ConnectionServer::serving() const { return impl_->running.load(); }

const ConnectionLimits& ConnectionServer::limits() const { return impl_->limits; }

ConnectionStats ConnectionServer::stats() const {
    const Impl& m = *impl_;
    ConnectionStats s;
    s.open = m.open.load(std::memory_order_relaxed);
    s.accepted = m.accepted.load(std::memory_order_relaxed);
    s.rejected = m.rejected.load(std::memory_order_relaxed);
    s.header_timeouts = m.header_timeouts.load(std::memory_order_relaxed);
    s.body_timeouts = m.body_timeouts.load(std::memory_order_relaxed);
    s.oversize_headers = m.oversize_headers.load(std::memory_order_relaxed);
    s.requests = m.requests.load(std::memory_order_relaxed);
    return s;
}

}  // namespace skippy::server
