// Incremental SHA-256 on OpenSSL's libcrypto EVP API.
//
//   Sha256 h;
//   h.update(bytes);
//   Digest d = h.finish();      // the hasher is reset and can be reused
//   Digest e = Sha256::of(bytes);
//
// Not thread-safe; use one instance per thread. Construction throws std::runtime_error
// if libcrypto cannot provide SHA-256.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "cache/digest.h"

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX, kept out of this header.

namespace skippy::cache {

class Sha256 {
  public:
    Sha256();
    ~Sha256();
    Sha256(Sha256&& other) noexcept;
    Sha256& operator=(Sha256&& other) noexcept;
    Sha256(const Sha256&) = delete;
    Sha256& operator=(const Sha256&) = delete;

    void update(const void* data, size_t size);
    void update(std::span<const uint8_t> bytes) { update(bytes.data(), bytes.size()); }
    // Returns the digest of everything updated since the last finish()/construction and
    // starts a new message.
    Digest finish();

    static Digest of(std::span<const uint8_t> bytes);

  private:
    void restart();

    evp_md_ctx_st* ctx_ = nullptr;
};

}  // namespace skippy::cache
