#include "redis_server.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace skippy::testing {

namespace {

// The last `max` bytes of the server's log, for an error that outlives the temp folder.
std::string log_tail(const std::string& path, size_t max = 2000) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    std::string all = text.str();
    if (all.size() > max) {
        all = "..." + all.substr(all.size() - max);
    }
    return all.empty() ? "(empty log)" : all;
}

}  // namespace

bool RedisServer::installed() { return ::access(kBinary, X_OK) == 0; }

RedisServer::RedisServer() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl =
        std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/skippy-redis-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
        error_ = "mkdtemp failed";
        return;
    }
    folder_ = tmpl;
    socket_ = folder_ + "/r.sock";
}

RedisServer::~RedisServer() {
    stop();
    if (!folder_.empty()) {
        std::error_code ec;
        std::filesystem::remove_all(folder_, ec);
    }
}

bool RedisServer::start(std::chrono::milliseconds timeout) {
    stop();
    if (folder_.empty()) {
        return false;  // error_ says why
    }
    const std::string log = folder_ + "/redis.log";
    pid_ = ::fork();
    if (pid_ == 0) {
        if (std::freopen(log.c_str(), "a", stdout) != nullptr) {
            ::dup2(STDOUT_FILENO, STDERR_FILENO);
        }
        ::execl(kBinary, kBinary, "--port", "0", "--unixsocket", socket_.c_str(),
                "--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--dir",
                folder_.c_str(), "--daemonize", "no", static_cast<char*>(nullptr));
        ::_exit(127);
    }
    if (pid_ < 0) {
        error_ = "fork failed";
        return false;
    }
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
        if (accepts()) {
            error_.clear();
            return true;
        }
        if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {  // it exited (a bad flag, a busy path)
            pid_ = -1;
            error_ = "redis-server exited at start; its log: " + log_tail(log);
            return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    stop();
    error_ = "redis-server did not accept a connection in time; its log: " + log_tail(log);
    return false;
}

void RedisServer::stop() {
    if (pid_ > 0) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
        ::unlink(socket_.c_str());
    }
}

void RedisServer::signal(int sig) const {
    if (pid_ > 0) {
        ::kill(pid_, sig);
    }
}

bool RedisServer::accepts() const {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return false;
    }
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", socket_.c_str());
    const bool ok = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    return ok;
}

}  // namespace skippy::testing
