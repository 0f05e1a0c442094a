#include "runtime/seq_state_format.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "runtime/runtime_version.h"

namespace skippy::runtime {

namespace {

// Bytes of one cell's metadata in a single-sequence export, without its ext:
// i32 pos, u32 n_seq_id (= 1), [ext], i32 seq_id.
constexpr size_t kCellMetaBytes = 12;
// llama_kv_cell_ext (i32 x, i32 y, i32 tok) at the pinned llama.cpp; written after n_seq_id
// when the cache has one (M-RoPE models such as qwen35, PLE n-gram models). The section does
// not say whether it does, so both layouts are tried (see parse_llama_kv).
constexpr uint32_t kCellExtBytes = 12;
constexpr size_t kFixedHeaderBytes = 16;                   // magic, version, mode, page tokens, fp
constexpr size_t kPagedFixedBytes = 6 * sizeof(uint32_t);  // n_tokens .. ext bytes
constexpr size_t kLayerDescBytes = 16;                     // i32 type, u32, u64

class Reader {
  public:
    explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
    template <class T>
    bool read(T& value) {
        if (remaining() < sizeof(T)) {
            return false;
        }
        std::memcpy(&value, bytes_.data() + offset_, sizeof(T));
        offset_ += sizeof(T);
        return true;
    }
    // Skips `n` bytes; `at` receives their offset.
    bool skip(uint64_t n, size_t& at) {
        if (n > remaining()) {
            return false;
        }
        at = offset_;
        offset_ += static_cast<size_t>(n);
        return true;
    }
    size_t offset() const { return offset_; }
    size_t remaining() const { return bytes_.size() - offset_; }

  private:
    std::span<const uint8_t> bytes_;
    size_t offset_ = 0;
};

// Reads parts front to back (a stored payload's blocks, in place).
class PartsReader {
  public:
    explicit PartsReader(ByteParts parts) : parts_(parts) {}
    // Copies the next `n` bytes to `dst` (or skips them when `dst` is null); past the end,
    // copies what there is and ok() turns false.
    void copy(uint8_t* dst, size_t n) {
        while (n > 0) {
            if (part_ == parts_.size()) {
                ok_ = false;
                return;
            }
            const std::span<const uint8_t> p = parts_[part_];
            const size_t take = std::min(n, p.size() - offset_);
            if (dst != nullptr && take > 0) {
                std::memcpy(dst, p.data() + offset_, take);
                dst += take;
            }
            n -= take;
            offset_ += take;
            if (offset_ == p.size()) {
                ++part_;
                offset_ = 0;
            }
        }
    }
    void skip(size_t n) { copy(nullptr, n); }
    bool ok() const { return ok_; }
    bool at_end() const {
        for (size_t i = part_; i < parts_.size(); ++i) {
            if (parts_[i].size() > (i == part_ ? offset_ : 0)) {
                return false;
            }
        }
        return true;
    }

  private:
    ByteParts parts_;
    size_t part_ = 0;
    size_t offset_ = 0;
    bool ok_ = true;
};

class Writer {
  public:
    explicit Writer(std::vector<uint8_t>& out) : out_(out) {}
    template <class T>
    void put(const T& value) {
        const auto* p = reinterpret_cast<const uint8_t*>(&value);
        out_.insert(out_.end(), p, p + sizeof(T));
    }

  private:
    std::vector<uint8_t>& out_;
};

bool mul_ok(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }
bool add_ok(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_add_overflow(a, b, &out); }

struct Entry {
    int32_t type = 0;
    uint32_t n_embd = 0;  // transposed V: embedding dims; else 0
    uint64_t size = 0;    // row size, or element size for transposed V
    size_t src = 0;       // offset of the entry's data in the llama.cpp section
};

struct ParsedKv {
    uint32_t n_cells = 0;
    uint32_t ext_bytes = 0;             // per cell; 0 = no ext
    size_t meta_src = 0;                // offset of the first cell's metadata
    std::vector<uint32_t> cell_of_pos;  // cell index (in the section) holding position p
    bool v_trans = false;
    std::vector<Entry> k;
    std::vector<Entry> v;
};

// Parses a llama_kv_cache single-sequence section. nullopt + reason when the layout is not
// one the codec pages (the caller stores it raw).
std::optional<ParsedKv> parse_llama_kv(std::span<const uint8_t> section, uint32_t ext_bytes,
                                       std::string& why) {
    // One stream per sequence (non-unified KV): a single sequence's export writes every
    // stream's cell count, and the cells of exactly one stream. The data of that stream is
    // parsed on its own; the zero counts of the streams after it are checked and dropped.
    uint32_t n_stream = 0;
    size_t stream_begin = 0;
    {
        Reader head(section);
        if (!head.read(n_stream) || n_stream == 0 || n_stream > 4096) {
            why = "truncated or invalid stream count";
            return std::nullopt;
        }
        uint32_t s = 0;
        uint32_t count = 0;
        for (; s < n_stream; ++s) {
            if (!head.read(count)) {
                why = "truncated cell count";
                return std::nullopt;
            }
            if (count != 0) {
                break;
            }
        }
        if (s == n_stream) {
            why = "no cells";
            return std::nullopt;
        }
        const size_t tail = static_cast<size_t>(n_stream - s - 1) * sizeof(uint32_t);
        const size_t begin = head.offset() - sizeof(uint32_t);
        if (section.size() < begin + tail) {
            why = "stream counts do not fit";
            return std::nullopt;
        }
        for (size_t i = section.size() - tail; i < section.size(); ++i) {
            if (section[i] != 0) {
                why = "cells in more than one stream";
                return std::nullopt;
            }
        }
        section = section.subspan(begin, section.size() - tail - begin);
        stream_begin = begin;
    }
    Reader r(section);
    ParsedKv kv;
    if (!r.read(kv.n_cells) || kv.n_cells == 0) {
        why = "truncated cell count";
        return std::nullopt;
    }
    kv.ext_bytes = ext_bytes;
    kv.meta_src = r.offset();
    uint64_t meta_bytes = 0;
    if (!mul_ok(kv.n_cells, kCellMetaBytes + ext_bytes, meta_bytes) || meta_bytes > r.remaining()) {
        why = "cell metadata does not fit";
        return std::nullopt;
    }
    constexpr uint32_t kUnset = 0xffffffffu;
    kv.cell_of_pos.assign(kv.n_cells, kUnset);
    int32_t first_seq = 0;
    for (uint32_t i = 0; i < kv.n_cells; ++i) {
        int32_t pos = 0;
        uint32_t n_seq_id = 0;
        int32_t seq_id = 0;
        size_t ext_at = 0;
        r.read(pos);
        r.read(n_seq_id);
        r.skip(ext_bytes, ext_at);
        r.read(seq_id);
        if (n_seq_id != 1) {
            why = "cell with n_seq_id != 1";
            return std::nullopt;
        }
        if (i == 0) {
            first_seq = seq_id;
        } else if (seq_id != first_seq) {
            why = "cells of several sequences";
            return std::nullopt;
        }
        if (pos < 0 || static_cast<uint32_t>(pos) >= kv.n_cells ||
            kv.cell_of_pos[static_cast<uint32_t>(pos)] != kUnset) {
            why = "cell positions are not exactly 0..n-1";
            return std::nullopt;
        }
        kv.cell_of_pos[static_cast<uint32_t>(pos)] = i;
    }
    uint32_t v_trans = 0;
    uint32_t n_layer = 0;
    if (!r.read(v_trans) || !r.read(n_layer)) {
        why = "truncated data header";
        return std::nullopt;
    }
    if (v_trans > 1 || n_layer == 0) {
        why = "unexpected v_trans/n_layer";
        return std::nullopt;
    }
    kv.v_trans = v_trans == 1;
    for (uint32_t l = 0; l < n_layer; ++l) {
        Entry e;
        uint64_t bytes = 0;
        if (!r.read(e.type) || !r.read(e.size) || e.size == 0 ||
            !mul_ok(e.size, kv.n_cells, bytes) || !r.skip(bytes, e.src)) {
            why = "K layer " + std::to_string(l) + " does not fit";
            return std::nullopt;
        }
        kv.k.push_back(e);
    }
    // Layers without V are skipped by the writer, so V entries run to the section's end.
    while (r.remaining() > 0) {
        if (kv.v.size() == n_layer) {
            why = "trailing bytes after the V layers";
            return std::nullopt;
        }
        Entry e;
        uint64_t bytes = 0;
        bool ok = r.read(e.type);
        if (!kv.v_trans) {
            ok = ok && r.read(e.size) && e.size != 0 && mul_ok(e.size, kv.n_cells, bytes);
        } else {
            uint32_t el = 0;
            ok = ok && r.read(el) && r.read(e.n_embd) && el != 0 && e.n_embd != 0 &&
                 mul_ok(el, kv.n_cells, bytes) && mul_ok(bytes, e.n_embd, bytes);
            e.size = el;
        }
        if (!ok || !r.skip(bytes, e.src)) {
            why = "V entry " + std::to_string(kv.v.size()) + " does not fit";
            return std::nullopt;
        }
        kv.v.push_back(e);
    }
    // Offsets relative to the whole attention section.
    kv.meta_src += stream_begin;
    for (Entry& e : kv.k) {
        e.src += stream_begin;
    }
    for (Entry& e : kv.v) {
        e.src += stream_begin;
    }
    return kv;
}

// Tries the cell layouts without and with ext; exactly one must account for every byte.
std::optional<ParsedKv> parse_llama_kv(std::span<const uint8_t> section, std::string& why) {
    std::string why_plain;
    std::string why_ext;
    auto plain = parse_llama_kv(section, 0, why_plain);
    auto ext = parse_llama_kv(section, kCellExtBytes, why_ext);
    if (plain && ext) {
        why = "ambiguous cell layout (parses with and without cell ext)";
        return std::nullopt;
    }
    if (!plain && !ext) {
        why = why_plain + " (without cell ext); " + why_ext + " (with cell ext)";
        return std::nullopt;
    }
    return plain ? std::move(plain) : std::move(ext);
}

// Appends the rows of positions [a, b) (each `row` bytes, cell i at base + i * row).
void gather_rows(const uint8_t* base, uint64_t row, const std::vector<uint32_t>& cell_of_pos,
                 uint32_t a, uint32_t b, std::vector<uint8_t>& out) {
    uint32_t p = a;
    while (p < b) {
        uint32_t q = p + 1;
        while (q < b && cell_of_pos[q] == cell_of_pos[q - 1] + 1) {
            ++q;
        }
        const uint8_t* src = base + static_cast<size_t>(cell_of_pos[p]) * row;
        out.insert(out.end(), src, src + static_cast<size_t>(q - p) * row);
        p = q;
    }
}

uint64_t bytes_per_token(uint32_t ext_bytes, const std::vector<Entry>& k,
                         const std::vector<Entry>& v, bool v_trans, bool& ok) {
    uint64_t total = ext_bytes;
    ok = true;
    for (const Entry& e : k) {
        ok = ok && add_ok(total, e.size, total);
    }
    for (const Entry& e : v) {
        uint64_t b = e.size;
        if (v_trans) {
            ok = ok && mul_ok(b, e.n_embd, b);
        }
        ok = ok && add_ok(total, b, total);
    }
    return total;
}

void put_fixed_header(Writer& w, KvPagesMode mode) {
    w.put(kKvPagesMagic);
    w.put(kKvPagesVersion);
    w.put(static_cast<uint8_t>(mode));
    w.put(static_cast<uint16_t>(kKvPageTokens));
    w.put(llama_state_format_fingerprint());
}

uint32_t pages_for(uint32_t n_tokens) { return (n_tokens + kKvPageTokens - 1) / kKvPageTokens; }

struct Header {
    KvPagesInfo info;
    std::vector<Entry> k;
    std::vector<Entry> v;
};

// `section`: the section's first bytes (all of its header), `total`: its whole size.
std::optional<Header> read_header(std::span<const uint8_t> section, uint64_t total,
                                  std::string& why) {
    Reader r(section);
    const auto rest = [&] { return total - r.offset(); };  // bytes after what was read
    uint32_t magic = 0;
    uint8_t version = 0;
    uint8_t mode = 0;
    uint16_t page_tokens = 0;
    uint64_t fingerprint = 0;
    if (total == 0) {
        why = "kv pages: empty section";
        return std::nullopt;
    }
    if (!r.read(magic) || magic != kKvPagesMagic) {
        why = "kv pages: bad magic (not a paged attention section)";
        return std::nullopt;
    }
    if (!r.read(version)) {
        why = "kv pages: truncated header";
        return std::nullopt;
    }
    if (version != kKvPagesVersion) {
        why = "kv pages: format version " + std::to_string(version) + " (this build reads " +
              std::to_string(kKvPagesVersion) + ")";
        return std::nullopt;
    }
    if (!r.read(mode) || !r.read(page_tokens) || !r.read(fingerprint)) {
        why = "kv pages: truncated header";
        return std::nullopt;
    }
    if (page_tokens != kKvPageTokens) {
        why = "kv pages: page size " + std::to_string(page_tokens) + " tokens (this build uses " +
              std::to_string(kKvPageTokens) + ")";
        return std::nullopt;
    }
    if (fingerprint != llama_state_format_fingerprint()) {
        why = "kv pages: written for another llama.cpp state format (this build: " +
              runtime::runtime_version() + ")";
        return std::nullopt;
    }
    Header h;
    KvPagesInfo& info = h.info;
    switch (mode) {
        case static_cast<uint8_t>(KvPagesMode::Empty):
            info.mode = KvPagesMode::Empty;
            info.header_bytes = r.offset();
            if (rest() != 0) {
                why = "kv pages: trailing bytes after an empty section";
                return std::nullopt;
            }
            return h;
        case static_cast<uint8_t>(KvPagesMode::Raw):
            info.mode = KvPagesMode::Raw;
            if (!r.read(info.raw_bytes)) {
                why = "kv pages: truncated raw header";
                return std::nullopt;
            }
            info.header_bytes = r.offset();
            if (info.raw_bytes != rest()) {
                why = "kv pages: raw section size mismatch";
                return std::nullopt;
            }
            return h;
        case static_cast<uint8_t>(KvPagesMode::Paged):
            info.mode = KvPagesMode::Paged;
            break;
        default:
            why = "kv pages: unknown mode " + std::to_string(mode);
            return std::nullopt;
    }
    uint32_t v_trans = 0;
    if (!r.read(info.n_tokens) || !r.read(info.n_pages) || !r.read(v_trans) ||
        !r.read(info.n_k_layers) || !r.read(info.n_v_entries) || !r.read(info.cell_ext_bytes)) {
        why = "kv pages: truncated paged header";
        return std::nullopt;
    }
    if (info.n_tokens == 0) {
        why = "kv pages: no tokens";
        return std::nullopt;
    }
    if (info.n_pages != pages_for(info.n_tokens)) {
        why = "kv pages: " + std::to_string(info.n_pages) + " pages for " +
              std::to_string(info.n_tokens) + " tokens";
        return std::nullopt;
    }
    if (v_trans > 1) {
        why = "kv pages: bad v_trans";
        return std::nullopt;
    }
    info.v_trans = v_trans == 1;
    if (info.cell_ext_bytes != 0 && info.cell_ext_bytes != kCellExtBytes) {
        why = "kv pages: cell ext of " + std::to_string(info.cell_ext_bytes) +
              " bytes (this build: " + std::to_string(kCellExtBytes) + ")";
        return std::nullopt;
    }
    if (info.n_k_layers == 0 || info.n_v_entries > info.n_k_layers) {
        why = "kv pages: bad layer counts";
        return std::nullopt;
    }
    const uint64_t n_desc = uint64_t{info.n_k_layers} + info.n_v_entries;
    if (n_desc * kLayerDescBytes > r.remaining()) {
        why = "kv pages: truncated layer table";
        return std::nullopt;
    }
    for (uint64_t i = 0; i < n_desc; ++i) {
        Entry e;
        r.read(e.type);
        r.read(e.n_embd);
        r.read(e.size);
        const bool is_v = i >= info.n_k_layers;
        const bool transposed = is_v && info.v_trans;
        if (e.size == 0 || (transposed ? e.n_embd == 0 || e.size > UINT32_MAX : e.n_embd != 0)) {
            why = "kv pages: bad layer table entry " + std::to_string(i);
            return std::nullopt;
        }
        (is_v ? h.v : h.k).push_back(e);
    }
    info.header_bytes = r.offset();
    bool ok = true;
    info.bytes_per_token = bytes_per_token(info.cell_ext_bytes, h.k, h.v, info.v_trans, ok);
    uint64_t page_bytes = 0;
    if (!ok || !mul_ok(info.bytes_per_token, info.n_tokens, page_bytes)) {
        why = "kv pages: sizes overflow";
        return std::nullopt;
    }
    if (page_bytes != rest()) {
        why = "kv pages: page bytes (" + std::to_string(rest()) + ") do not match " +
              std::to_string(info.n_tokens) + " tokens x " + std::to_string(info.bytes_per_token) +
              " bytes";
        return std::nullopt;
    }
    return h;
}

}  // namespace

const char* to_string(KvPagesMode mode) {
    switch (mode) {
        case KvPagesMode::Empty:
            return "empty";
        case KvPagesMode::Paged:
            return "paged";
        case KvPagesMode::Raw:
            return "raw";
    }
    return "?";
}

uint64_t llama_state_format_fingerprint() {
    static const uint64_t fp = [] {
        const std::string v = runtime::runtime_version();
        return static_cast<uint64_t>(XXH3_128bits(v.data(), v.size()).low64);
    }();
    return fp;
}

EncodedKvPages encode_kv_pages(std::span<const uint8_t> attention, uint32_t n_tokens,
                               uint32_t held_tokens, std::vector<uint8_t> storage) {
    EncodedKvPages out;
    out.bytes = std::move(storage);
    out.bytes.clear();
    Writer w(out.bytes);
    if (attention.empty()) {
        out.mode = KvPagesMode::Empty;
        put_fixed_header(w, out.mode);
        return out;
    }
    if (held_tokens == 0) {
        held_tokens = n_tokens;
    }
    std::optional<ParsedKv> kv = parse_llama_kv(attention, out.raw_reason);
    if (kv && (kv->n_cells != held_tokens || n_tokens > held_tokens || n_tokens == 0)) {
        throw std::runtime_error("KV state holds " + std::to_string(kv->n_cells) +
                                 " tokens, expected " + std::to_string(held_tokens) + " to page " +
                                 std::to_string(n_tokens));
    }
    if (!kv && held_tokens != n_tokens) {
        throw std::runtime_error("cannot page a prefix of an unpaged KV layout: " + out.raw_reason);
    }
    if (!kv) {
        out.mode = KvPagesMode::Raw;
        put_fixed_header(w, out.mode);
        w.put(static_cast<uint64_t>(attention.size()));
        out.cuts.push_back(out.bytes.size());
        out.bytes.insert(out.bytes.end(), attention.begin(), attention.end());
        return out;
    }
    out.mode = KvPagesMode::Paged;
    const uint32_t n_pages = pages_for(n_tokens);
    bool ok = true;
    const uint64_t per_token = bytes_per_token(kv->ext_bytes, kv->k, kv->v, kv->v_trans, ok);
    out.bytes.reserve(kFixedHeaderBytes + kPagedFixedBytes +
                      (kv->k.size() + kv->v.size()) * kLayerDescBytes + per_token * n_tokens);
    put_fixed_header(w, out.mode);
    w.put(n_tokens);
    w.put(n_pages);
    w.put(static_cast<uint32_t>(kv->v_trans ? 1 : 0));
    w.put(static_cast<uint32_t>(kv->k.size()));
    w.put(static_cast<uint32_t>(kv->v.size()));
    w.put(kv->ext_bytes);
    for (const Entry& e : kv->k) {
        w.put(e.type);
        w.put(uint32_t{0});
        w.put(e.size);
    }
    for (const Entry& e : kv->v) {
        w.put(e.type);
        w.put(e.n_embd);
        w.put(e.size);
    }
    out.cuts.push_back(out.bytes.size());
    const uint8_t* src = attention.data();
    for (uint32_t page = 0; page < n_pages; ++page) {
        const uint32_t a = page * kKvPageTokens;
        const uint32_t b = std::min(n_tokens, a + kKvPageTokens);
        const size_t meta_stride = kCellMetaBytes + kv->ext_bytes;
        for (uint32_t p = a; p < b && kv->ext_bytes > 0; ++p) {
            const uint8_t* ext = src + kv->meta_src + kv->cell_of_pos[p] * meta_stride + 8;
            out.bytes.insert(out.bytes.end(), ext, ext + kv->ext_bytes);
        }
        for (const Entry& e : kv->k) {
            gather_rows(src + e.src, e.size, kv->cell_of_pos, a, b, out.bytes);
        }
        for (const Entry& e : kv->v) {
            if (!kv->v_trans) {
                gather_rows(src + e.src, e.size, kv->cell_of_pos, a, b, out.bytes);
                continue;
            }
            const size_t dim_stride = static_cast<size_t>(e.size) * kv->n_cells;
            for (uint32_t j = 0; j < e.n_embd; ++j) {
                gather_rows(src + e.src + j * dim_stride, e.size, kv->cell_of_pos, a, b, out.bytes);
            }
        }
        if (page + 1 < n_pages) {
            out.cuts.push_back(out.bytes.size());
        }
    }
    return out;
}

std::optional<KvPagesInfo> inspect_kv_pages(std::span<const uint8_t> section, std::string* reason) {
    std::string why;
    auto h = read_header(section, section.size(), why);
    if (!h) {
        if (reason != nullptr) {
            *reason = why;
        }
        return std::nullopt;
    }
    return h->info;
}

size_t parts_size(ByteParts parts) {
    size_t total = 0;
    for (const auto& p : parts) {
        total += p.size();
    }
    return total;
}

std::vector<std::span<const uint8_t>> slice_parts(ByteParts parts, size_t begin, size_t end) {
    std::vector<std::span<const uint8_t>> out;
    size_t at = 0;  // offset of the current part
    for (const auto& p : parts) {
        const size_t a = std::max(begin, at);
        const size_t b = std::min(end, at + p.size());
        if (a < b) {
            out.push_back(p.subspan(a - at, b - a));
        }
        at += p.size();
    }
    return out;
}

void append_parts(std::vector<uint8_t>& out, ByteParts parts) {
    for (const auto& p : parts) {
        out.insert(out.end(), p.begin(), p.end());
    }
}

bool decode_kv_pages(std::span<const uint8_t> section, uint32_t expected_tokens,
                     int32_t cell_seq_id, uint32_t n_stream, std::vector<uint8_t>& out,
                     std::string* reason) {
    const std::span<const uint8_t> one[1] = {section};
    return decode_kv_pages(ByteParts(one), expected_tokens, cell_seq_id, n_stream, out, reason);
}

bool decode_kv_pages(ByteParts section, uint32_t expected_tokens, int32_t cell_seq_id,
                     uint32_t n_stream, std::vector<uint8_t>& out, std::string* reason) {
    std::string why;
    auto fail = [&](std::string msg) {
        if (reason != nullptr) {
            *reason = std::move(msg);
        }
        return false;
    };
    const size_t total = parts_size(section);
    auto h =
        read_header(section.empty() ? std::span<const uint8_t>() : section.front(), total, why);
    if (!h && section.size() > 1) {
        // The header may go on in the next part (a header longer than a block): once, joined.
        std::vector<uint8_t> joined;
        joined.reserve(total);
        append_parts(joined, section);
        const std::span<const uint8_t> one[1] = {joined};
        return decode_kv_pages(ByteParts(one), expected_tokens, cell_seq_id, n_stream, out, reason);
    }
    if (!h) {
        return fail(why);
    }
    PartsReader src(section);
    src.skip(h->info.header_bytes);
    const KvPagesInfo& info = h->info;
    if (info.mode == KvPagesMode::Empty) {
        return true;
    }
    if (info.mode == KvPagesMode::Raw) {
        append_parts(out, slice_parts(section, info.header_bytes, total));
        return true;
    }
    if (info.n_tokens != expected_tokens) {
        return fail("kv pages: hold " + std::to_string(info.n_tokens) + " tokens, expected " +
                    std::to_string(expected_tokens));
    }
    const uint32_t n = info.n_tokens;
    // Output layout (llama_kv_cache::state_write for one sequence, cells in pos order).
    const size_t base = out.size();
    const size_t ext = info.cell_ext_bytes;
    const size_t meta_at = base + 2 * sizeof(uint32_t);  // first cell's metadata
    const size_t meta_stride = kCellMetaBytes + ext;
    if (n_stream == 0) {
        return fail("kv pages: destination has no KV stream");
    }
    size_t size =
        2 * sizeof(uint32_t) + static_cast<size_t>(n) * meta_stride + 2 * sizeof(uint32_t);
    std::vector<size_t> k_at;  // offset (in out) of each K layer's first row
    std::vector<size_t> v_at;
    for (const Entry& e : h->k) {
        size += sizeof(int32_t) + sizeof(uint64_t);
        k_at.push_back(base + size);
        size += static_cast<size_t>(e.size) * n;
    }
    for (const Entry& e : h->v) {
        size += info.v_trans ? sizeof(int32_t) + 2 * sizeof(uint32_t)
                             : sizeof(int32_t) + sizeof(uint64_t);
        v_at.push_back(base + size);
        size += static_cast<size_t>(e.size) * (info.v_trans ? e.n_embd : 1u) * n;
    }
    out.resize(base + size);
    uint8_t* o = out.data() + base;
    auto put = [&o](const auto& value) {
        std::memcpy(o, &value, sizeof value);
        o += sizeof value;
    };
    put(n_stream);  // the destination's stream count; the cells go to the first stream
    put(n);         // cell_count (the reader puts them in the destination sequence's stream)
    for (uint32_t p = 0; p < n; ++p) {
        put(static_cast<int32_t>(p));
        put(uint32_t{1});
        o += ext;  // filled from the pages below
        put(cell_seq_id);
    }
    put(static_cast<uint32_t>(info.v_trans ? 1 : 0));
    put(info.n_k_layers);
    for (size_t l = 0; l < h->k.size(); ++l) {
        put(h->k[l].type);
        put(h->k[l].size);
        o = out.data() + k_at[l] + static_cast<size_t>(h->k[l].size) * n;
    }
    for (size_t l = 0; l < h->v.size(); ++l) {
        put(h->v[l].type);
        if (info.v_trans) {
            put(static_cast<uint32_t>(h->v[l].size));
            put(h->v[l].n_embd);
            o = out.data() + v_at[l] + static_cast<size_t>(h->v[l].size) * h->v[l].n_embd * n;
        } else {
            put(h->v[l].size);
            o = out.data() + v_at[l] + static_cast<size_t>(h->v[l].size) * n;
        }
    }
    uint8_t* dst = out.data();
    // (read_header checked that the parts hold every byte copied below)
    for (uint32_t page = 0; page < info.n_pages; ++page) {
        const uint32_t a = page * kKvPageTokens;
        const uint32_t t = std::min(n, a + kKvPageTokens) - a;
        for (uint32_t i = 0; i < t && ext > 0; ++i) {
            src.copy(dst + meta_at + (a + i) * meta_stride + 8, ext);
        }
        for (size_t l = 0; l < h->k.size(); ++l) {
            const size_t bytes = static_cast<size_t>(h->k[l].size) * t;
            src.copy(dst + k_at[l] + static_cast<size_t>(h->k[l].size) * a, bytes);
        }
        for (size_t l = 0; l < h->v.size(); ++l) {
            const auto el = static_cast<size_t>(h->v[l].size);
            if (!info.v_trans) {
                src.copy(dst + v_at[l] + el * a, el * t);
                continue;
            }
            for (uint32_t j = 0; j < h->v[l].n_embd; ++j) {
                src.copy(dst + v_at[l] + (static_cast<size_t>(j) * n + a) * el, el * t);
            }
        }
    }
    if (!src.ok() || !src.at_end()) {  // read_header checked the sizes
        out.resize(base);
        return fail("kv pages: internal size mismatch");
    }
    out.insert(out.end(), static_cast<size_t>(n_stream - 1) * sizeof(uint32_t), 0);  // empty
    return true;
}

namespace {
constexpr uint32_t kLlamaSeqStateMagic = 0xaf143cd8;
}  // namespace

std::span<const uint8_t> seq_state_body(std::span<const uint8_t> blob) {
    uint32_t magic = 0;
    if (blob.size() < kSeqStateHeaderBytes) {
        throw std::runtime_error("state export shorter than its header");
    }
    std::memcpy(&magic, blob.data(), sizeof magic);
    if (magic != kLlamaSeqStateMagic) {
        throw std::runtime_error("unsupported llama.cpp sequence state format (magic mismatch)");
    }
    return blob.subspan(kSeqStateHeaderBytes);
}

void append_seq_state_header(std::vector<uint8_t>& out) {
    const int32_t source_seq = 0;
    const auto* m = reinterpret_cast<const uint8_t*>(&kLlamaSeqStateMagic);
    const auto* q = reinterpret_cast<const uint8_t*>(&source_seq);
    out.insert(out.end(), m, m + sizeof kLlamaSeqStateMagic);
    out.insert(out.end(), q, q + sizeof source_seq);
}

}  // namespace skippy::runtime
