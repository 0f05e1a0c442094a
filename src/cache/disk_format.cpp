#include "cache/disk_format.h"

// XXH3 states on the stack (a 576-byte struct): no allocation per checksum.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <bit>
#include <charconv>
#include <cstdio>
#include <cstring>

namespace skippy::cache::disk {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the disk format is little-endian; add byte swaps for big-endian hosts");

constexpr size_t kMaxTypeName = 64;
constexpr uint32_t kMaxTokens = 1u << 24;
constexpr uint32_t kMaxBlocks = 1u << 24;

class Writer {
  public:
    template <typename T>
    void put(T v) {
        const size_t at = out_.size();
        out_.resize(at + sizeof(T));
        std::memcpy(out_.data() + at, &v, sizeof(T));
    }
    void put_bytes(const void* p, size_t n) {
        const auto* b = static_cast<const uint8_t*>(p);
        out_.insert(out_.end(), b, b + n);
    }
    void put_str(const std::string& s) {
        put(static_cast<uint16_t>(s.size()));
        put_bytes(s.data(), s.size());
    }
    std::vector<uint8_t>& bytes() { return out_; }

  private:
    std::vector<uint8_t> out_;
};

class Reader {
  public:
    explicit Reader(std::span<const uint8_t> b) : b_(b) {}
    template <typename T>
    bool get(T& v) {
        if (b_.size() - at_ < sizeof(T)) {
            return false;
        }
        std::memcpy(&v, b_.data() + at_, sizeof(T));
        at_ += sizeof(T);
        return true;
    }
    bool get_bytes(void* p, size_t n) {
        if (b_.size() - at_ < n) {
            return false;
        }
        std::memcpy(p, b_.data() + at_, n);
        at_ += n;
        return true;
    }
    bool get_str(std::string& s) {
        uint16_t n = 0;
        if (!get(n) || n > kMaxTypeName || b_.size() - at_ < n) {
            return false;
        }
        s.assign(reinterpret_cast<const char*>(b_.data() + at_), n);
        at_ += n;
        return true;
    }
    size_t remaining() const { return b_.size() - at_; }

  private:
    std::span<const uint8_t> b_;
    size_t at_ = 0;
};

int hex_value(char c) {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    return -1;
}

std::optional<uint64_t> parse_hex64(std::string_view s) {
    if (s.size() != 16) {
        return std::nullopt;
    }
    uint64_t v = 0;
    for (char c : s) {
        const int h = hex_value(c);
        if (h < 0) {
            return std::nullopt;
        }
        v = (v << 4) | static_cast<uint64_t>(h);
    }
    return v;
}

std::string hex64(uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
    return std::string(buf, 16);
}

bool fail(std::string* why, const char* reason) {
    if (why != nullptr) {
        *why = reason;
    }
    return false;
}

}  // namespace

std::string block_file_name(const BlockKey& key) {
    std::string name = hex64(key.hash.high) + hex64(key.hash.low);
    if (key.variant != 0) {
        name += '-';
        name += std::to_string(key.variant);
    }
    return name;
}

std::optional<BlockKey> parse_block_file_name(std::string_view name) {
    if (name.size() < 32) {
        return std::nullopt;
    }
    auto high = parse_hex64(name.substr(0, 16));
    auto low = parse_hex64(name.substr(16, 16));
    if (!high || !low) {
        return std::nullopt;
    }
    BlockKey key{Hash128{*low, *high}, 0};
    std::string_view rest = name.substr(32);
    if (rest.empty()) {
        return key;
    }
    if (rest.size() < 2 || rest[0] != '-' || rest[1] == '0') {
        return std::nullopt;
    }
    rest.remove_prefix(1);
    uint32_t v = 0;
    auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), v);
    if (ec != std::errc{} || end != rest.data() + rest.size() || v == 0 || v >= kMaxVariants) {
        return std::nullopt;
    }
    key.variant = v;
    return key;
}

unsigned block_dir_index(const Hash128& hash) { return static_cast<unsigned>(hash.high >> 56); }

std::string block_dir_name(const Hash128& hash) {
    char buf[3];
    std::snprintf(buf, sizeof(buf), "%02x", block_dir_index(hash));
    return std::string(buf, 2);
}

std::string manifest_file_name(uint64_t seq) { return hex64(seq) + ".m"; }

std::optional<uint64_t> parse_manifest_file_name(std::string_view name) {
    if (name.size() != 18 || name.substr(16) != ".m") {
        return std::nullopt;
    }
    return parse_hex64(name.substr(0, 16));
}

uint64_t payload_checksum(uint64_t size, std::span<const BlockRef> blocks) {
    XXH3_state_t state;
    XXH3_64bits_reset(&state);
    XXH3_64bits_update(&state, &size, sizeof(size));
    for (const BlockRef& b : blocks) {
        const uint64_t words[3] = {b.key.hash.low, b.key.hash.high, b.size};
        XXH3_64bits_update(&state, words, sizeof(words));
    }
    return XXH3_64bits_digest(&state);
}

Hash128 entry_key(const NamespaceId& ns, std::span<const Token> tokens) {
    XXH3_state_t state;
    XXH3_128bits_reset(&state);
    XXH3_128bits_update(&state, ns.digest().bytes.data(), ns.digest().bytes.size());
    XXH3_128bits_update(&state, tokens.data(), tokens.size_bytes());
    const XXH128_hash_t h = XXH3_128bits_digest(&state);
    return Hash128{h.low64, h.high64};
}

std::vector<uint8_t> encode_manifest(const Manifest& m) {
    Writer w;
    w.bytes().reserve(160 + m.tokens.size() * sizeof(Token) + m.blocks.size() * 28);
    w.put(kManifestMagic);
    w.put(kManifestVersion);
    w.put(m.seq);
    w.put_bytes(m.ns.digest().bytes.data(), m.ns.digest().bytes.size());
    w.put(m.page.value());
    const PayloadDescriptor& d = m.descriptor;
    w.put(static_cast<uint8_t>(d.kind));
    w.put(d.token_begin);
    w.put(d.token_end);
    w.put(d.layer_begin);
    w.put(d.layer_end);
    w.put_str(d.k_type);
    w.put_str(d.v_type);
    w.put(d.payload_bytes);
    w.put(d.kv_bytes);
    w.put(d.recurrent_bytes);
    w.put(m.payload_checksum);
    w.put(static_cast<uint32_t>(m.tokens.size()));
    w.put_bytes(m.tokens.data(), m.tokens.size() * sizeof(Token));
    w.put(static_cast<uint32_t>(m.blocks.size()));
    for (const BlockRef& b : m.blocks) {
        w.put(b.key.hash.low);
        w.put(b.key.hash.high);
        w.put(b.size);
        w.put(b.key.variant);
    }
    const uint64_t sum = XXH3_64bits(w.bytes().data(), w.bytes().size());
    w.put(sum);
    return std::move(w.bytes());
}

std::optional<Manifest> decode_manifest(std::span<const uint8_t> bytes, std::string* why) {
    if (bytes.size() < sizeof(uint64_t) + 8) {
        fail(why, "truncated manifest");
        return std::nullopt;
    }
    const std::span<const uint8_t> body = bytes.first(bytes.size() - sizeof(uint64_t));
    uint64_t stored_sum = 0;
    std::memcpy(&stored_sum, bytes.data() + body.size(), sizeof(stored_sum));
    Reader r(body);
    uint32_t magic = 0;
    uint32_t version = 0;
    if (!r.get(magic) || magic != kManifestMagic) {
        fail(why, "not a manifest (bad magic)");
        return std::nullopt;
    }
    if (!r.get(version) || version != kManifestVersion) {
        fail(why, "unsupported manifest version");
        return std::nullopt;
    }
    if (XXH3_64bits(body.data(), body.size()) != stored_sum) {
        fail(why, "manifest checksum mismatch");
        return std::nullopt;
    }
    Manifest m;
    Digest ns;
    uint64_t page = 0;
    uint8_t kind = 0;
    PayloadDescriptor& d = m.descriptor;
    if (!r.get(m.seq) || !r.get_bytes(ns.bytes.data(), ns.bytes.size()) || !r.get(page) ||
        !r.get(kind) || !r.get(d.token_begin) || !r.get(d.token_end) || !r.get(d.layer_begin) ||
        !r.get(d.layer_end) || !r.get_str(d.k_type) || !r.get_str(d.v_type) ||
        !r.get(d.payload_bytes) || !r.get(d.kv_bytes) || !r.get(d.recurrent_bytes) ||
        !r.get(m.payload_checksum)) {
        fail(why, "truncated manifest header");
        return std::nullopt;
    }
    if (kind > static_cast<uint8_t>(PayloadKind::KvPages)) {
        fail(why, "unknown payload kind");
        return std::nullopt;
    }
    d.kind = static_cast<PayloadKind>(kind);
    m.ns = NamespaceId::from_digest(ns);
    m.page = PageId(page);
    uint32_t n_tokens = 0;
    if (!r.get(n_tokens) || n_tokens == 0 || n_tokens > kMaxTokens ||
        r.remaining() < size_t{n_tokens} * sizeof(Token)) {
        fail(why, "bad token list");
        return std::nullopt;
    }
    m.tokens.resize(n_tokens);
    r.get_bytes(m.tokens.data(), size_t{n_tokens} * sizeof(Token));
    uint32_t n_blocks = 0;
    constexpr size_t kBlockRecord = 3 * sizeof(uint64_t) + sizeof(uint32_t);
    if (!r.get(n_blocks) || n_blocks == 0 || n_blocks > kMaxBlocks ||
        r.remaining() != size_t{n_blocks} * kBlockRecord) {
        fail(why, "bad block list");
        return std::nullopt;
    }
    m.blocks.resize(n_blocks);
    uint64_t total = 0;
    for (BlockRef& b : m.blocks) {
        r.get(b.key.hash.low);
        r.get(b.key.hash.high);
        r.get(b.size);
        r.get(b.key.variant);
        if (b.key.variant >= kMaxVariants || b.size == 0 || b.size > (uint64_t{1} << 40)) {
            fail(why, "bad block record");
            return std::nullopt;
        }
        total += b.size;
    }
    if (total != d.payload_bytes) {
        fail(why, "block sizes do not add up to the payload size");
        return std::nullopt;
    }
    if (auto bad = d.validate_against(total)) {
        if (why != nullptr) {
            *why = "invalid descriptor: " + *bad;
        }
        return std::nullopt;
    }
    if (d.token_end != n_tokens) {
        fail(why, "descriptor token_end differs from the token count");
        return std::nullopt;
    }
    if (payload_checksum(total, m.blocks) != m.payload_checksum) {
        fail(why, "payload checksum does not match the block list");
        return std::nullopt;
    }
    return m;
}

}  // namespace skippy::cache::disk
