// RedisStore's wire helpers (redis_store.cpp, redis_store_read.cpp): pipelined commands
// over one hiredis connection, and reply checks. Internal to src/cache.
#pragma once

#include <hiredis/hiredis.h>

#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cache/redis_store.h"

namespace skippy::cache::detail {

using Reply = RedisReplyPtr;
using Command = std::vector<std::string_view>;

// Sends every command, then reads every reply (one round trip). False when the connection
// failed (c->err says why: a timeout, a closed connection); error replies are replies.
inline bool pipeline(redisContext* c, const std::vector<Command>& commands,
                     std::vector<Reply>& out) {
    out.clear();
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const Command& cmd : commands) {
        argv.clear();
        lens.clear();
        for (std::string_view a : cmd) {
            argv.push_back(a.data());
            lens.push_back(a.size());
        }
        if (redisAppendCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()) !=
            REDIS_OK) {
            return false;
        }
    }
    for (size_t i = 0; i < commands.size(); ++i) {
        void* reply = nullptr;
        if (redisGetReply(c, &reply) != REDIS_OK || reply == nullptr) {
            return false;
        }
        out.emplace_back(static_cast<redisReply*>(reply));
    }
    return true;
}

inline bool is_error(const Reply& r) { return r && r->type == REDIS_REPLY_ERROR; }
inline bool is_oom(const Reply& r) {
    return is_error(r) && std::string_view(r->str, r->len).starts_with("OOM");
}
inline std::string error_text(const Reply& r) { return std::string(r->str, r->len); }

// disk::entry_key(ns, tokens[0, b)) of every boundary b = k * page with lo <= b <= tokens.size(),
// shallowest first, in one XXH3 pass over the tokens (redis_store.cpp).
std::vector<std::pair<size_t, Hash128>> page_prefix_keys(const NamespaceId& ns,
                                                         std::span<const Token> tokens, size_t page,
                                                         size_t lo);

inline std::string hex128(const Hash128& h) {
    char buf[33];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h.high),
                  static_cast<unsigned long long>(h.low));
    return buf;
}

}  // namespace skippy::cache::detail
