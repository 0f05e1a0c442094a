#include "rpc_servers.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "runtime/devices.h"

namespace skippy::testing {

namespace {

int free_loopback_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof addr;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
        if (fd >= 0) {
            ::close(fd);
        }
        return -1;
    }
    ::close(fd);
    return ntohs(addr.sin_port);
}

bool accepts_connections(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    if (fd >= 0) {
        ::close(fd);  // the rpc-server reads no HELLO, closes, and accepts the next client
    }
    return ok;
}

}  // namespace

std::string rpc_server_binary() {
#ifdef SKIPPY_RPC_SERVER_BIN
    return SKIPPY_RPC_SERVER_BIN;
#else
    return "";
#endif
}

int start_rpc_server(std::string& endpoint) {
    const std::string bin = rpc_server_binary();
    if (bin.empty() || !std::filesystem::exists(bin)) {
        endpoint = "no rpc-server at '" + bin + "' (scripts/setup builds it)";
        return -1;
    }
    for (int attempt = 0; attempt < 5; ++attempt) {
        const int port = free_loopback_port();
        if (port <= 0) {
            continue;
        }
        const std::string port_text = std::to_string(port);
        const pid_t parent = ::getpid();
        const pid_t pid = ::fork();
        if (pid < 0) {
            endpoint = "fork failed";
            return -1;
        }
        if (pid == 0) {
            // The child: dies with the thread that started it; quiet (it logs every client).
            ::prctl(PR_SET_PDEATHSIG, SIGTERM);
            if (::getppid() != parent) {
                ::_exit(1);
            }
            const int null = ::open("/dev/null", O_WRONLY);
            if (null >= 0) {
                ::dup2(null, STDOUT_FILENO);
                ::dup2(null, STDERR_FILENO);
            }
            ::execl(bin.c_str(), bin.c_str(), "-H", "127.0.0.1", "-p", port_text.c_str(), "-t", "1",
                    static_cast<char*>(nullptr));
            ::_exit(127);
        }
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (std::chrono::steady_clock::now() < deadline) {
            int status = 0;
            if (::waitpid(pid, &status, WNOHANG) == pid) {
                break;  // exited: the port was taken after all; try another
            }
            if (accepts_connections(port)) {
                endpoint = "127.0.0.1:" + port_text;
                return pid;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
    }
    endpoint = "rpc-server " + bin + " did not start listening";
    return -1;
}

const RpcServers& loopback_rpc_servers() {
    static const RpcServers servers = [] {
        RpcServers s;
        for (int i = 0; i < 2; ++i) {
            std::string endpoint;
            const int pid = start_rpc_server(endpoint);
            if (pid < 0) {
                s.error = endpoint;
                return s;
            }
            s.pids.push_back(pid);
            s.endpoints.push_back(endpoint);
        }
        try {
            s.devices = runtime::add_rpc_servers(s.endpoints);
        } catch (const std::exception& e) {
            s.error = e.what();
        }
        return s;
    }();
    return servers;
}

}  // namespace skippy::testing
