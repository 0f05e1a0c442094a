// A redis-server of the test's own: no persistence, no TCP port, a unix socket in a temp
// folder it creates and removes. Used by the tests of the Redis tier (the store itself and
// a restore through it); those skip when redis-server is not installed.
//
//   skippy::testing::RedisServer redis;
//   if (!RedisServer::installed()) GTEST_SKIP() << "redis-server is not installed";
//   ASSERT_TRUE(redis.start()) << redis.error();
//   options.url = redis.url();               // "unix:///tmp/skippy-redis-XXXXXX/r.sock"
//   redis.signal(SIGSTOP);                    // a Redis that hangs with connections open
//   redis.stop();                             // SIGKILL, reaped; start() runs a fresh one
//
// Ready means a connection was accepted: the socket file appears at bind(), before listen(),
// and a connect in between is refused (a test that took the file for readiness saw its
// client mark Redis down on a loaded machine). Not thread safe: one test thread drives it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

namespace skippy::testing {

class RedisServer {
  public:
    static constexpr const char* kBinary = "/usr/bin/redis-server";
    static bool installed();

    RedisServer();   // makes the folder; starts nothing
    ~RedisServer();  // stop(), then removes the folder
    RedisServer(const RedisServer&) = delete;
    RedisServer& operator=(const RedisServer&) = delete;

    // Starts redis-server (its output appended to redis.log in the folder) and waits until
    // it accepts a connection. False, with error() (the log's tail included: the folder goes
    // with the helper), if it does not within `timeout`.
    bool start(std::chrono::milliseconds timeout = std::chrono::seconds(10));
    // Kills the server (SIGKILL), reaps it and removes the socket file.
    void stop();
    // Sends `sig` to the running server (SIGSTOP / SIGCONT).
    void signal(int sig) const;
    // Whether a connection to the socket is accepted now.
    bool accepts() const;

    const std::string& socket() const { return socket_; }
    std::string url() const { return "unix://" + socket_; }
    const std::string& error() const { return error_; }

  private:
    std::string folder_;
    std::string socket_;
    std::string error_;
    pid_t pid_ = -1;
};

}  // namespace skippy::testing
