// On-disk format of the disk tier (DiskStore): block file names and the manifest codec.
//
//   <dir>/LOCK                          flock(2) lock file; holds the owner's pid
//   <dir>/blocks/<hh>/<32 hex>[-<v>]    one content-addressed block: its raw bytes only
//   <dir>/manifests/<16 hex seq>.m      one manifest per entry (the commit point)
//   *.tmp                               a write in progress; deleted at start-up
//
// A block is named by the XXH3-128 of its bytes (high word first), `hh` being the first
// two hex chars. Two different blocks with the same hash (a real collision, or a file that
// no longer matches its name after a bit flip) are told apart by a variant suffix `-<v>`.
//
// Manifest v1, little-endian, every field fixed width:
//   u32 magic 'SKDM' | u32 version=1 | u64 seq | 32 bytes namespace digest | u64 page id
//   descriptor: u8 kind | u32 token_begin | u32 token_end | i32 layer_begin | i32 layer_end
//               | u16 len + k_type | u16 len + v_type | u64 payload | u64 kv | u64 recurrent
//   u64 payload checksum (XXH3-64 over size and every block's (hash, size), as BlockStore)
//   u32 n_tokens | i32 tokens[n_tokens]
//   u32 n_blocks | { u64 hash.low | u64 hash.high | u64 size | u32 variant }[n_blocks]
//   u64 XXH3-64 of every byte before it
// decode_manifest() rejects anything inconsistent (sizes, checksums, descriptor) so that
// an entry whose manifest decodes is well-formed; only its blocks remain to be verified.
//
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache/block_store.h"
#include "cache/namespace_id.h"
#include "cache/page_id.h"
#include "cache/payload_descriptor.h"
#include "cache/token.h"

namespace skippy::cache::disk {

inline constexpr uint32_t kManifestMagic = 0x4d444b53;  // "SKDM"
inline constexpr uint32_t kManifestVersion = 1;
inline constexpr uint32_t kMaxVariants = 16;

// One block of a stored payload.
struct BlockKey {
    Hash128 hash;
    uint32_t variant = 0;
    auto operator<=>(const BlockKey&) const = default;
};

struct BlockKeyHash {
    size_t operator()(const BlockKey& k) const noexcept {
        return Hash128Hash{}(k.hash) ^ (static_cast<size_t>(k.variant) * 0x100000001b3ULL);
    }
};

struct BlockRef {
    BlockKey key;
    uint64_t size = 0;
};

struct Manifest {
    uint64_t seq = 0;
    NamespaceId ns;
    PageId page;
    PayloadDescriptor descriptor;
    uint64_t payload_checksum = 0;
    std::vector<Token> tokens;
    std::vector<BlockRef> blocks;  // in payload order; may repeat a block
};

// "<32 hex>" or "<32 hex>-<variant>".
std::string block_file_name(const BlockKey& key);
// Inverse of block_file_name; nullopt for any other name (including "*.tmp").
std::optional<BlockKey> parse_block_file_name(std::string_view name);
// The two-hex-char sub-folder of a block ("00".."ff"), and its number 0..255.
std::string block_dir_name(const Hash128& hash);
unsigned block_dir_index(const Hash128& hash);

// "<16 hex seq>.m"; parse_manifest_file_name returns the seq.
std::string manifest_file_name(uint64_t seq);
std::optional<uint64_t> parse_manifest_file_name(std::string_view name);

// XXH3-64 over the payload size and each block's (hash.low, hash.high, size); equal to
// PreparedPayload::checksum for the same blocks.
uint64_t payload_checksum(uint64_t size, std::span<const BlockRef> blocks);

// Key of an entry (namespace + token path), for duplicate detection.
Hash128 entry_key(const NamespaceId& ns, std::span<const Token> tokens);

std::vector<uint8_t> encode_manifest(const Manifest& m);
// nullopt + reason in `why` if the bytes are not a valid manifest.
std::optional<Manifest> decode_manifest(std::span<const uint8_t> bytes, std::string* why);

}  // namespace skippy::cache::disk
