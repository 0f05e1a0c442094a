#include "cache/namespace_id.h"

#include <bit>

#include "cache/labelled_field_hasher.h"
#include "cache/sha256.h"

namespace skippy::cache {

std::string current_platform() {
#if defined(__x86_64__) || defined(_M_X64)
    std::string arch = "x86_64";
#elif defined(__aarch64__) || defined(_M_ARM64)
    std::string arch = "aarch64";
#elif defined(__riscv) && __riscv_xlen == 64
    std::string arch = "riscv64";
#elif defined(__powerpc64__)
    std::string arch = "ppc64";
#else
    std::string arch = "unknown";
#endif
    return arch + (std::endian::native == std::endian::little ? "-le" : "-be");
}

NamespaceId NamespaceId::from_fields(const IdentityFields& f) {
    Sha256 sha;
    LabelledFieldHasher h(sha);
    h.string("skippy.namespace", "v1");
    h.string("weights_digest", f.weights_digest);
    h.i64("layer_begin", f.layer_begin);
    h.i64("layer_end", f.layer_end);
    h.string("runtime_version", f.runtime_version);
    h.string("k_type", f.k_type);
    h.string("v_type", f.v_type);
    h.boolean("flash_attn", f.flash_attn);
    h.boolean("unified_kv", f.unified_kv);
    h.u64("n_ctx", f.n_ctx);
    h.string("devices", f.devices);
    h.string("platform", f.platform);
    if (f.namespace_key.has_value()) {
        h.string("namespace_key", *f.namespace_key);
    } else {
        h.absent("namespace_key");
    }
    return NamespaceId(sha.finish());
}

}  // namespace skippy::cache
