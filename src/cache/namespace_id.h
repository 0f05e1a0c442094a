// IdentityFields and NamespaceId: everything that affects cached state bytes except the
// token ids and their start position. A NamespaceId names one radix tree.
//
//   IdentityFields f;
//   f.weights_digest = gguf_tensor_digest_hex;   // digest of tensor data, not a file name
//   f.layer_begin = 0; f.layer_end = n_layer;
//   f.runtime_version = "llama.cpp-80fb11ac/state-v1";
//   f.k_type = "f16"; f.v_type = "f16";
//   f.flash_attn = true; f.unified_kv = true; f.n_ctx = 32768;
//   f.devices = "CUDA0:NVIDIA H200";             // include any RPC topology
//   f.platform = current_platform();
//   NamespaceId ns = NamespaceId::from_fields(f);
//
// The digest is SHA-256 over labelled, length-prefixed fields in the fixed order of the
// struct (see labelled_field_hasher.h); an absent namespace_key hashes differently from
// every present value, including the empty string. Never put instance ids, timestamps or
// session ids here: ids must be stable across restarts.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "cache/digest.h"

namespace skippy::cache {

struct IdentityFields {
    std::string weights_digest;
    int32_t layer_begin = 0;
    int32_t layer_end = 0;  // exclusive
    std::string runtime_version;
    std::string k_type;
    std::string v_type;
    bool flash_attn = false;
    bool unified_kv = false;
    uint32_t n_ctx = 0;
    std::string devices;
    std::string platform;
    std::optional<std::string> namespace_key;  // tenant isolation; nullopt = shared
};

// "<arch>-<le|be>" of the running build, e.g. "x86_64-le".
std::string current_platform();

class NamespaceId {
  public:
    NamespaceId() = default;
    static NamespaceId from_fields(const IdentityFields& fields);
    static NamespaceId from_digest(const Digest& digest) { return NamespaceId(digest); }

    const Digest& digest() const { return digest_; }
    std::string hex() const { return digest_.hex(); }
    // 16 hex chars, for logs.
    std::string short_hex() const { return digest_.hex_prefix(8); }

    auto operator<=>(const NamespaceId&) const = default;

  private:
    explicit NamespaceId(const Digest& digest) : digest_(digest) {}
    Digest digest_{};
};

struct NamespaceIdHash {
    size_t operator()(const NamespaceId& ns) const noexcept { return DigestHash{}(ns.digest()); }
};

}  // namespace skippy::cache
