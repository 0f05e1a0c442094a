// PayloadDescriptor: what an exact-state payload contains, stored next to its bytes so the
// restore path can check a payload before importing it.
//
//   PayloadDescriptor d;
//   d.kind = PayloadKind::KvPages;
//   d.token_begin = 0; d.token_end = 1024;          // state taken at position 1024
//   d.layer_begin = 0; d.layer_end = 48;
//   d.k_type = "f16"; d.v_type = "f16";
//   d.kv_bytes = kv.size(); d.recurrent_bytes = ssm.size();
//   d.payload_bytes = d.kv_bytes + d.recurrent_bytes;
//   if (auto why = d.validate_against(bytes.size())) reject(*why);
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace skippy::cache {

enum class PayloadKind : uint8_t {
    FullState,    // "full-state": the whole per-sequence state blob
    KvPages,  // "kv-pages": attention KV token-range pages (+ recurrent state at the checkpoint)
};
const char* to_string(PayloadKind kind);  // "full-state" / "kv-pages"

struct PayloadDescriptor {
    PayloadKind kind = PayloadKind::FullState;
    uint32_t token_begin = 0;  // first position covered
    uint32_t token_end = 0;    // one past the last position; the state is taken here
    int32_t layer_begin = 0;
    int32_t layer_end = 0;  // exclusive
    std::string k_type;
    std::string v_type;
    uint64_t payload_bytes = 0;    // total serialized size
    uint64_t kv_bytes = 0;         // kv-pages: attention KV section
    uint64_t recurrent_bytes = 0;  // kv-pages: recurrent/SSM section (0 for dense)

    // nullopt if consistent with itself and with a payload of `actual_bytes`; otherwise
    // the reason ("size mismatch", ...).
    std::optional<std::string> validate_against(uint64_t actual_bytes) const;

    bool operator==(const PayloadDescriptor&) const = default;
};

}  // namespace skippy::cache
