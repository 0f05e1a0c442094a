// ApiKeys: the API keys that authorize requests, and the cache tenant of each.
//
// A request carries its key as "Authorization: Bearer KEY" (OpenAI clients) or
// "x-api-key: KEY" (Anthropic clients); any configured key authorizes it. With more than one
// key configured each key is its own cache tenant (DESIGN.md, Prefix identity): requests
// under one key never restore state recorded under another. The tenant key is
// "key:" + the hex of the first 16 bytes of SHA-256(key), so it is stable across restarts
// and replicas and does not reveal the key.
//
//   ApiKeys keys({"sk-a", "sk-b"});
//   int index = keys.match(req);        // -1: no configured key
//   gen.cache_namespace = keys.tenant_namespace(index, gen.cache_namespace);
//
// Thread safety: immutable after construction.
#pragma once

#include <string>
#include <vector>

#include "cpp-httplib/httplib.h"

namespace skippy::server {

// Constant-time comparison of secrets (time depends only on the lengths).
bool secrets_equal(const std::string& a, const std::string& b);

// Keys from a file: one per line; blank lines and lines starting with '#' are skipped,
// surrounding spaces trimmed. Throws std::runtime_error when the file cannot be read.
std::vector<std::string> read_api_key_file(const std::string& path);

class ApiKeys {
  public:
    ApiKeys() = default;
    // Empty entries are dropped, duplicates kept once.
    explicit ApiKeys(std::vector<std::string> keys);

    bool enabled() const { return !keys_.empty(); }
    size_t size() const { return keys_.size(); }
    // Several keys: each is its own cache tenant.
    bool per_key_tenants() const { return keys_.size() > 1; }
    // The index of the key the request carries; -1 when it carries none of them. Every key
    // is compared (in constant time), whichever matches.
    int match(const httplib::Request& req) const;
    // The cache namespace of a request authorized by key `index` whose body asked for
    // `salt` (cache_salt, may be empty): the salt alone unless per_key_tenants(), else the
    // key's tenant, then "\x1f" and the salt when there is one.
    std::string tenant_namespace(int index, const std::string& salt) const;
    // A short, stable name of key `index` for logs (the first 8 hex digits of its tenant);
    // empty unless per_key_tenants().
    std::string log_name(int index) const;
    // "off", "on (1 key)", "on (3 keys, per-key cache tenants)".
    std::string summary() const;

  private:
    std::vector<std::string> keys_;
    std::vector<std::string> tenants_;  // "key:" + 32 hex digits, one per key
};

}  // namespace skippy::server
