// Helpers for the DiskStore tests: temporary folders, deterministic prefix payloads whose
// pages are shared between a shorter and a longer prefix, and file-level tampering.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cache/disk_store.h"
#include "cache/prefix_identity.h"
#include "test_util.h"

namespace skippy::cache::test {

namespace fs = std::filesystem;

// A fresh folder under $TMPDIR (or /tmp), removed with everything in it at scope exit.
class TempDir {
  public:
    TempDir() {
        const char* base = std::getenv("TMPDIR");
        std::string tmpl =
            std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/skippy-disk-XXXXXX";
        if (::mkdtemp(tmpl.data()) == nullptr) {
            throw std::runtime_error("mkdtemp failed");
        }
        path_ = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        // Restore permissions a test may have removed, so that everything can be deleted.
        for (auto it = fs::recursive_directory_iterator(
                 path_, fs::directory_options::skip_permission_denied, ec);
             !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
            ::chmod(it->path().c_str(), 0700);
        }
        fs::remove_all(path_, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;

    const std::string& path() const { return path_; }
    std::string sub(const std::string& name) const { return path_ + "/" + name; }

  private:
    std::string path_;
};

inline constexpr size_t kPageTokens = 64;

// The payload of tokens[0, n_tokens): one page of `page_bytes` bytes per kPageTokens
// tokens (the last page may be partial), page i depending only on (seed, i), so that a
// longer prefix with the same seed shares the pages of a shorter one. Cut at pages.
struct PrefixPayload {
    std::vector<Token> tokens;
    PageId page;
    PayloadDescriptor descriptor;
    std::vector<uint8_t> bytes;
    std::vector<size_t> cuts;
};

inline PrefixPayload prefix_payload(const NamespaceId& ns, uint64_t seed, size_t n_tokens,
                                    size_t page_bytes = 4096) {
    PrefixPayload p;
    p.tokens.resize(n_tokens);
    for (size_t i = 0; i < n_tokens; ++i) {
        p.tokens[i] = static_cast<Token>((seed * 7919 + i * 31) % 50000);
    }
    const size_t pages = (n_tokens + kPageTokens - 1) / kPageTokens;
    for (size_t i = 0; i < pages; ++i) {
        std::mt19937_64 rng(seed * 1000003 + i);
        const size_t tokens_in_page = std::min(kPageTokens, n_tokens - i * kPageTokens);
        const size_t n = page_bytes * tokens_in_page / kPageTokens;
        if (i != 0) {
            p.cuts.push_back(p.bytes.size());
        }
        for (size_t b = 0; b < n; ++b) {
            p.bytes.push_back(static_cast<uint8_t>(rng()));
        }
    }
    p.page = prefix_identity(ns, 0, p.tokens).page_id();
    p.descriptor.kind = PayloadKind::FullState;
    p.descriptor.token_begin = 0;
    p.descriptor.token_end = static_cast<uint32_t>(n_tokens);
    p.descriptor.layer_begin = 0;
    p.descriptor.layer_end = 32;
    p.descriptor.k_type = "f16";
    p.descriptor.v_type = "f16";
    p.descriptor.payload_bytes = p.bytes.size();
    return p;
}

inline DiskSubmit submit(DiskStore& store, const NamespaceId& ns, const PrefixPayload& p) {
    return store.submit_write(ns, p.tokens, p.page, p.descriptor, p.bytes, p.cuts);
}

// Quiet options: faults go to `log` (a vector the test can inspect) instead of stderr.
inline DiskStoreOptions quiet_options(const std::string& dir,
                                      std::vector<std::string>* log = nullptr) {
    DiskStoreOptions o;
    o.dir = dir;
    o.log = [log](std::string_view line) {
        if (log != nullptr) {
            log->emplace_back(line);
        }
    };
    return o;
}

inline std::unique_ptr<DiskStore> open_ok(DiskStoreOptions options) {
    DiskOpenResult r = DiskStore::open(std::move(options));
    EXPECT_EQ(r.error, DiskOpenError::None) << r.message;
    if (r.store) {
        r.store->flush();  // the start-up sweep
    }
    return std::move(r.store);
}

// Reads the entry exactly at p.tokens; returns the error and the bytes.
inline DiskReadError read_exact(DiskStore& store, const NamespaceId& ns, const PrefixPayload& p,
                                std::vector<uint8_t>* out = nullptr) {
    std::optional<DiskHit> hit = store.acquire_longest(ns, p.tokens);
    if (!hit || hit->len != p.tokens.size()) {
        return DiskReadError::NotFound;
    }
    std::vector<uint8_t> buf;
    DiskReadError e = store.read_into(hit->lease, buf);
    if (out != nullptr) {
        *out = std::move(buf);
    }
    return e;
}

inline size_t count_files(const std::string& dir, const std::string& suffix = "") {
    size_t n = 0;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (it->is_regular_file() && name != "LOCK" &&
            (suffix.empty() ||
             (name.size() >= suffix.size() &&
              name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0))) {
            ++n;
        }
    }
    return n;
}

inline void flip_byte(const std::string& path, size_t offset) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << path;
    f.seekg(static_cast<std::streamoff>(offset));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(&c, 1);
}

inline void truncate_to(const std::string& path, uint64_t size) {
    ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(size)), 0) << path;
}

inline std::vector<uint8_t> read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)),
                                std::istreambuf_iterator<char>());
}

inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

}  // namespace skippy::cache::test
