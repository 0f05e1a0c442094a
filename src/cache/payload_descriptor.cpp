#include "cache/payload_descriptor.h"

namespace skippy::cache {

const char* to_string(PayloadKind kind) {
    switch (kind) {
        case PayloadKind::FullState:
            return "full-state";
        case PayloadKind::KvPages:
            return "kv-pages";
    }
    return "?";
}

std::optional<std::string> PayloadDescriptor::validate_against(uint64_t actual_bytes) const {
    if (payload_bytes == 0) {
        return "empty payload";
    }
    if (payload_bytes != actual_bytes) {
        return "size mismatch";
    }
    if (token_end <= token_begin) {
        return "empty token range";
    }
    if (layer_end <= layer_begin) {
        return "empty layer range";
    }
    if (kind == PayloadKind::KvPages &&
        (kv_bytes > payload_bytes || recurrent_bytes != payload_bytes - kv_bytes)) {
        return "section sizes do not add up";
    }
    return std::nullopt;
}

}  // namespace skippy::cache
