#include "server/http/api_keys.h"

#include <algorithm>
#include <fstream>
#include <span>
#include <stdexcept>

#include "cache/sha256.h"
#include "server/http/http_framing.h"

namespace skippy::server {

namespace {

// The token of an "Authorization: Bearer TOKEN" header (the scheme is case-insensitive);
// empty when the header is missing or uses another scheme.
std::string bearer_token(const std::string& header) {
    const std::string_view value = trim(header);
    const size_t space = value.find(' ');
    if (space == std::string_view::npos || !iequals(value.substr(0, space), "bearer")) {
        return "";
    }
    return std::string(trim(value.substr(space + 1)));
}

}  // namespace

bool secrets_equal(const std::string& a, const std::string& b) {
    const size_t n = std::max(a.size(), b.size());
    unsigned char diff = a.size() == b.size() ? 0 : 1;
    for (size_t i = 0; i < n; ++i) {
        const auto ca = static_cast<unsigned char>(i < a.size() ? a[i] : 0);
        const auto cb = static_cast<unsigned char>(i < b.size() ? b[i] : 0);
        diff = static_cast<unsigned char>(diff | (ca ^ cb));
    }
    return diff == 0;
}

std::vector<std::string> read_api_key_file(const std::string& path) {
    std::ifstream in(path);
    if (!in) {
        throw std::runtime_error("cannot read the API key file " + path);
    }
    std::vector<std::string> keys;
    std::string line;
    while (std::getline(in, line)) {
        line = std::string(trim(line));
        if (!line.empty() && line[0] != '#') {
            keys.push_back(line);
        }
    }
    return keys;
}

ApiKeys::ApiKeys(std::vector<std::string> keys) {
    for (auto& key : keys) {
        key = std::string(trim(key));
        if (!key.empty() && std::find(keys_.begin(), keys_.end(), key) == keys_.end()) {
            keys_.push_back(key);
        }
    }
    for (const auto& key : keys_) {
        const auto digest = cache::Sha256::of(
            std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(key.data()), key.size()));
        tenants_.push_back("key:" + digest.hex_prefix(16));
    }
}

int ApiKeys::match(const httplib::Request& req) const {
    const std::string bearer = bearer_token(req.get_header_value("Authorization"));
    const std::string header(trim(req.get_header_value("x-api-key")));
    int found = -1;
    for (size_t i = 0; i < keys_.size(); ++i) {
        const bool by_bearer = !bearer.empty() && secrets_equal(bearer, keys_[i]);
        const bool by_header = !header.empty() && secrets_equal(header, keys_[i]);
        if ((by_bearer || by_header) && found < 0) {
            found = static_cast<int>(i);
        }
    }
    return found;
}

std::string ApiKeys::tenant_namespace(int index, const std::string& salt) const {
    if (!per_key_tenants() || index < 0 || static_cast<size_t>(index) >= tenants_.size()) {
        return salt;
    }
    std::string ns = tenants_[static_cast<size_t>(index)];
    if (!salt.empty()) {
        ns += '\x1f';
        ns += salt;
    }
    return ns;
}

std::string ApiKeys::log_name(int index) const {
    if (!per_key_tenants() || index < 0 || static_cast<size_t>(index) >= tenants_.size()) {
        return "";
    }
    return tenants_[static_cast<size_t>(index)].substr(0, 4 + 8);
}

std::string ApiKeys::summary() const {
    if (keys_.empty()) {
        return "off";
    }
    if (keys_.size() == 1) {
        return "on (1 key)";
    }
    return "on (" + std::to_string(keys_.size()) + " keys, per-key cache tenants)";
}

}  // namespace skippy::server
