// RedisStore: URL parsing, connections (timeouts, AUTH, SELECT), the pool, and the down /
// back-off state (redis_store.h).
#include <hiredis/hiredis.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>

#include "cache/redis_store.h"

namespace skippy::cache {

namespace {

bool parse_int(std::string_view s, int& out) {
    const auto* end = s.data() + s.size();
    auto r = std::from_chars(s.data(), end, out);
    return !s.empty() && r.ec == std::errc() && r.ptr == end;
}

std::string percent_decode(std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '%' && i + 2 < s.size()) {
            int v = 0;
            if (std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16).ec == std::errc()) {
                out.push_back(static_cast<char>(v));
                i += 2;
                continue;
            }
        }
        out.push_back(s[i]);
    }
    return out;
}

timeval to_timeval(std::chrono::milliseconds ms) {
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
    return tv;
}

}  // namespace

std::string RedisUrl::redacted() const {
    std::string auth;
    if (!password.empty()) {
        auth = (user.empty() ? ":" : user + ":") + std::string("***@");
    }
    if (unix_socket) {
        return "unix://" + path + (db != 0 ? "?db=" + std::to_string(db) : "") +
               (password.empty() ? "" : (db != 0 ? "&" : "?") + std::string("password=***"));
    }
    return "redis://" + auth + host + ":" + std::to_string(port) + "/" + std::to_string(db);
}

std::optional<RedisUrl> parse_redis_url(std::string_view url, std::string* why) {
    auto fail = [&](std::string reason) -> std::optional<RedisUrl> {
        if (why != nullptr) {
            *why = std::move(reason);
        }
        return std::nullopt;
    };
    RedisUrl out;
    if (url.starts_with("rediss://")) {
        return fail(
            "rediss:// (TLS) is not supported: this build's hiredis (Debian's 0.14) has no TLS; "
            "use redis:// on a private network, a unix socket, or a TLS tunnel (stunnel, "
            "spiped) to Redis");
    }
    if (url.starts_with("unix://")) {
        out.unix_socket = true;
        std::string_view rest = url.substr(7);
        std::string_view query;
        if (auto q = rest.find('?'); q != std::string_view::npos) {
            query = rest.substr(q + 1);
            rest = rest.substr(0, q);
        }
        if (rest.empty() || rest.front() != '/') {
            return fail("unix:// needs an absolute socket path (unix:///path/to/redis.sock)");
        }
        out.path = std::string(rest);
        while (!query.empty()) {
            const size_t amp = query.find('&');
            const std::string_view kv = query.substr(0, amp);
            query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
            const size_t eq = kv.find('=');
            if (eq == std::string_view::npos) {
                return fail("unix:// query parameter without a value: " + std::string(kv));
            }
            const std::string_view k = kv.substr(0, eq);
            const std::string_view v = kv.substr(eq + 1);
            if (k == "db") {
                if (!parse_int(v, out.db) || out.db < 0) {
                    return fail("db must be a non-negative number");
                }
            } else if (k == "password") {
                out.password = percent_decode(v);
            } else if (k == "user") {
                out.user = percent_decode(v);
            } else {
                return fail("unknown unix:// query parameter: " + std::string(k) +
                            " (db, password, user)");
            }
        }
        return out;
    }
    if (!url.starts_with("redis://")) {
        return fail("the Redis URL must start with redis:// or unix:// (got '" +
                    std::string(url.substr(0, 16)) + "')");
    }
    std::string_view rest = url.substr(8);
    if (auto at = rest.rfind('@'); at != std::string_view::npos) {
        const std::string_view auth = rest.substr(0, at);
        rest = rest.substr(at + 1);
        const size_t colon = auth.find(':');
        if (colon == std::string_view::npos) {
            out.password = percent_decode(auth);  // redis://password@host (lenient)
        } else {
            out.user = percent_decode(auth.substr(0, colon));
            out.password = percent_decode(auth.substr(colon + 1));
        }
    }
    if (auto slash = rest.find('/'); slash != std::string_view::npos) {
        const std::string_view db = rest.substr(slash + 1);
        rest = rest.substr(0, slash);
        if (!db.empty() && (!parse_int(db, out.db) || out.db < 0)) {
            return fail("the database after '/' must be a non-negative number");
        }
    }
    std::string_view host = rest;
    if (!host.empty() && host.front() == '[') {  // [ipv6]:port
        const size_t close = host.find(']');
        if (close == std::string_view::npos) {
            return fail("unterminated [ in the host");
        }
        out.host = std::string(host.substr(1, close - 1));
        host = host.substr(close + 1);
        if (!host.empty()) {
            if (host.front() != ':' || !parse_int(host.substr(1), out.port)) {
                return fail("bad port");
            }
        }
    } else if (auto colon = host.rfind(':'); colon != std::string_view::npos) {
        if (!parse_int(host.substr(colon + 1), out.port)) {
            return fail("bad port");
        }
        out.host = std::string(host.substr(0, colon));
    } else {
        out.host = std::string(host);
    }
    if (out.host.empty()) {
        return fail("the Redis URL has no host");
    }
    if (out.port <= 0 || out.port > 65535) {
        return fail("port out of range");
    }
    return out;
}

void RedisStore::ContextFree::operator()(redisContext* c) const {
    if (c != nullptr) {
        redisFree(c);
    }
}

RedisErrorKind RedisStore::kind_of(const redisContext* c) {
    if (c == nullptr) {
        return RedisErrorKind::Connect;
    }
    if (c->err == REDIS_ERR_IO) {
        const std::string_view s = c->errstr;
        if (s.find("temporarily unavailable") != std::string_view::npos ||
            s.find("timed out") != std::string_view::npos ||
            s.find("Timeout") != std::string_view::npos) {
            return RedisErrorKind::Timeout;
        }
    }
    return RedisErrorKind::Io;
}

RedisStore::Conn RedisStore::connect(std::string* why) {
    const timeval tv = to_timeval(options_.timeout);
    redisContext* raw = url_.unix_socket
                            ? redisConnectUnixWithTimeout(url_.path.c_str(), tv)
                            : redisConnectWithTimeout(url_.host.c_str(), url_.port, tv);
    Conn c(raw);
    if (!c || c->err != 0) {
        *why = std::string("connect to ") + url_.redacted() + ": " +
               (c ? c->errstr : "cannot allocate a context");
        return nullptr;
    }
    if (redisSetTimeout(c.get(), tv) != REDIS_OK) {
        *why = "setting the command timeout failed";
        return nullptr;
    }
    auto command = [&](std::vector<std::string> args, const char* what) -> bool {
        std::vector<const char*> argv;
        std::vector<size_t> lens;
        for (const auto& a : args) {
            argv.push_back(a.data());
            lens.push_back(a.size());
        }
        auto* reply = static_cast<redisReply*>(
            redisCommandArgv(c.get(), static_cast<int>(argv.size()), argv.data(), lens.data()));
        if (reply == nullptr) {
            *why = std::string(what) + ": " + c->errstr;
            return false;
        }
        const bool ok = reply->type != REDIS_REPLY_ERROR;
        if (!ok) {
            *why = std::string(what) + " refused: " + std::string(reply->str, reply->len);
        }
        freeReplyObject(reply);
        return ok;
    };
    if (!url_.password.empty()) {
        std::vector<std::string> args{"AUTH"};
        if (!url_.user.empty()) {
            args.push_back(url_.user);
        }
        args.push_back(url_.password);
        if (!command(std::move(args), "AUTH")) {
            return nullptr;
        }
    }
    if (url_.db != 0 && !command({"SELECT", std::to_string(url_.db)}, "SELECT")) {
        return nullptr;
    }
    return c;
}

bool RedisStore::available() {
    std::lock_guard lock(mu_);
    if (!down_) {
        return true;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now < retry_at_) {
        ++counters_.skipped_down;
        return false;
    }
    retry_at_ = now + options_.backoff;  // this caller tries; the others wait for it
    return true;
}

void RedisStore::count_error(RedisErrorKind kind, const std::string& why) {
    std::lock_guard lock(mu_);
    ++counters_.errors[static_cast<size_t>(kind)];
    counters_.last_error = why;
}

void RedisStore::mark_down(RedisErrorKind kind, const std::string& why) {
    bool log = false;
    {
        std::lock_guard lock(mu_);
        ++counters_.errors[static_cast<size_t>(kind)];
        counters_.last_error = why;
        retry_at_ = std::chrono::steady_clock::now() + options_.backoff;
        generation_.fetch_add(1);
        if (!down_) {
            down_ = true;
            ++counters_.outages;
            log = true;
        }
        up_.store(false, std::memory_order_relaxed);
    }
    {
        std::lock_guard lock(pool_mu_);
        pool_.clear();  // stale after an outage (a restarted Redis closed them)
    }
    if (log) {
        options_.log("skippy: redis tier " + url_.redacted() + " down (" + to_string(kind) + ": " +
                     why + "); serving from the local tiers, retrying every " +
                     std::to_string(options_.backoff.count()) + " ms");
    }
}

void RedisStore::mark_up() {
    bool log = false;
    {
        std::lock_guard lock(mu_);
        if (down_) {
            down_ = false;
            log = true;
        }
        up_.store(true, std::memory_order_relaxed);
    }
    if (log) {
        options_.log("skippy: redis tier " + url_.redacted() + " back up");
    }
}

RedisStore::Conn RedisStore::acquire() {
    if (!available()) {
        return nullptr;
    }
    {
        std::lock_guard lock(pool_mu_);
        if (!pool_.empty()) {
            Conn c = std::move(pool_.back());
            pool_.pop_back();
            return c;
        }
    }
    std::string why;
    Conn c = connect(&why);
    if (!c) {
        mark_down(RedisErrorKind::Connect, why);
    }
    return c;
}

void RedisStore::give_back(Conn conn) {
    if (!conn || conn->err != 0) {
        return;
    }
    std::lock_guard lock(pool_mu_);
    if (pool_.size() < options_.pool_size) {
        pool_.push_back(std::move(conn));
    }
}

}  // namespace skippy::cache
