#include "cache/sha256.h"

#include <openssl/evp.h>

#include <stdexcept>
#include <utility>

namespace skippy::cache {
namespace {

// Explicitly fetched once: an implicit fetch on every EVP_DigestInit_ex is much slower
// in OpenSSL 3. Never freed (process lifetime).
const EVP_MD* sha256_md() {
    static const EVP_MD* md = [] {
        EVP_MD* fetched = EVP_MD_fetch(nullptr, "SHA256", nullptr);
        if (fetched == nullptr) {
            throw std::runtime_error("libcrypto: SHA256 is not available");
        }
        return fetched;
    }();
    return md;
}

}  // namespace

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
    if (ctx_ == nullptr) {
        throw std::runtime_error("libcrypto: EVP_MD_CTX_new failed");
    }
    try {
        restart();
    } catch (...) {
        EVP_MD_CTX_free(ctx_);
        throw;
    }
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }

Sha256::Sha256(Sha256&& other) noexcept : ctx_(std::exchange(other.ctx_, nullptr)) {}

Sha256& Sha256::operator=(Sha256&& other) noexcept {
    if (this != &other) {
        EVP_MD_CTX_free(ctx_);
        ctx_ = std::exchange(other.ctx_, nullptr);
    }
    return *this;
}

void Sha256::restart() {
    if (EVP_DigestInit_ex(ctx_, sha256_md(), nullptr) != 1) {
        throw std::runtime_error("libcrypto: EVP_DigestInit_ex failed");
    }
}

void Sha256::update(const void* data, size_t size) {
    if (ctx_ == nullptr) {
        throw std::logic_error("Sha256: use after move");
    }
    if (size == 0) {
        return;
    }
    if (EVP_DigestUpdate(ctx_, data, size) != 1) {
        throw std::runtime_error("libcrypto: EVP_DigestUpdate failed");
    }
}

Digest Sha256::finish() {
    if (ctx_ == nullptr) {
        throw std::logic_error("Sha256: use after move");
    }
    Digest out;
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(ctx_, out.bytes.data(), &len) != 1 || len != out.bytes.size()) {
        throw std::runtime_error("libcrypto: EVP_DigestFinal_ex failed");
    }
    restart();
    return out;
}

Digest Sha256::of(std::span<const uint8_t> bytes) {
    Sha256 h;
    h.update(bytes);
    return h.finish();
}

}  // namespace skippy::cache
