#include "stage/lane_record_job.h"

#include <stdexcept>

#include "runtime/seq_state_format.h"

namespace skippy::stage {

namespace {

struct ReleaseGuard {
    ReleaseGuard() = default;
    ReleaseGuard(const ReleaseGuard&) = delete;
    ReleaseGuard& operator=(const ReleaseGuard&) = delete;
    std::function<void()> fn;
    ~ReleaseGuard() {
        if (fn) {
            fn();
        }
    }
};

// The payload of the first item.n tokens of a captured lane.
EncodedPayload encode_item(const CapturedState& captured, const LaneRecordItem& item,
                           const PayloadLayout& layout, std::vector<uint8_t> storage) {
    if (layout.kind == cache::PayloadKind::FullState) {
        if (item.n != static_cast<int32_t>(captured.n_tokens)) {
            throw std::runtime_error("a full state exists only for the lane's own end");
        }
        return encode_payload(captured, layout, std::move(storage));
    }
    const auto body = runtime::seq_state_body(captured.blob);
    const size_t attention_bytes = body.size() - captured.recurrent_bytes;
    EncodedPayload encoded;
    auto& d = encoded.descriptor;
    runtime::EncodedKvPages pages =
        runtime::encode_kv_pages(body.first(attention_bytes), static_cast<uint32_t>(item.n),
                                 captured.n_tokens, std::move(storage));
    encoded.bytes = std::move(pages.bytes);
    encoded.cuts = std::move(pages.cuts);
    d.kind = layout.kind;
    d.token_begin = 0;
    d.token_end = static_cast<uint32_t>(item.n);
    d.layer_begin = 0;
    d.layer_end = layout.n_layer;
    d.k_type = layout.k_type;
    d.v_type = layout.v_type;
    d.kv_bytes = encoded.bytes.size();
    if (layout.has_recurrent) {
        if (!item.recurrent) {
            throw std::runtime_error("no recurrent state for the checkpoint");
        }
        const auto rec = runtime::seq_state_body(*item.recurrent);
        encoded.cuts.push_back(encoded.bytes.size());
        encoded.bytes.insert(encoded.bytes.end(), rec.begin(), rec.end());
        d.recurrent_bytes = rec.size();
    }
    d.payload_bytes = encoded.bytes.size();
    return encoded;
}

}  // namespace

std::function<bool()> make_lane_record_job(LaneRecord record, cache::ExactStateCache& exact,
                                           cache::DiskStore* disk, CacheTelemetry& telemetry,
                                           const PayloadLayout& layout,
                                           std::shared_ptr<BufferPool> buffers,
                                           std::function<void()> on_release,
                                           cache::RedisStore* redis) {
    auto shared = std::make_shared<LaneRecord>(std::move(record));
    auto guard = std::make_shared<ReleaseGuard>();  // built in place: it must run fn once
    guard->fn = std::move(on_release);
    return [shared, guard, &exact, disk, redis, &telemetry, layout, buffers]() -> bool {
        bool all_ok = true;
        for (const LaneRecordItem& item : shared->items) {
            RecordEvent done;
            done.payload = cache::to_string(layout.kind);
            done.tokens = item.n;
            done.page_id = item.page.str();
            try {
                EncodedPayload encoded =
                    encode_item(*shared->captured, item, layout,
                                buffers ? buffers->take_empty() : std::vector<uint8_t>());
                const auto key = std::span<const cache::Token>(shared->tokens)
                                     .first(static_cast<size_t>(item.n));
                const cache::ExactInsertResult r = exact.insert(
                    shared->ns, key, item.page, encoded.descriptor, encoded.bytes, encoded.cuts);
                done.bytes = encoded.bytes.size();
                done.decision = r.stored() ? "stored"
                                : r.status == cache::ExactInsertStatus::AlreadyPresent
                                    ? "already_present"
                                    : "failed";
                if (done.decision == "failed") {
                    done.reason = cache::to_string(r.status);
                    all_ok = false;
                }
                if (redis != nullptr && r.snapshot) {
                    // The shared tier too (the snapshot shares the RAM tier's blocks).
                    redis->submit_write(shared->ns, key, item.page, encoded.descriptor, *r.snapshot,
                                        encoded.cuts);
                }
                if (disk != nullptr && r.snapshot) {
                    // The disk tier writes from the RAM tier's blocks: the encoded bytes are
                    // freed now, so the next record reuses their (already faulted) memory.
                    disk->submit_write(shared->ns, key, item.page, encoded.descriptor,
                                       std::move(*r.snapshot), std::move(encoded.cuts));
                }
                if (buffers) {
                    buffers->give(std::move(encoded.bytes));  // (stored as blocks, or dropped)
                }
                done.new_blocks = r.blocks.new_blocks;
                done.reused_blocks = r.blocks.reused_blocks;
                done.hash_ms = r.blocks.hash_seconds * 1000.0;
                done.evicted = r.evicted.size();
            } catch (const std::exception& e) {
                done.decision = "failed";
                done.reason = e.what();
                all_ok = false;
            }
            if (auto stats = exact.try_stats()) {
                done.entries = stats->entries;
            }
            telemetry.record(done);
        }
        if (buffers) {
            buffers->give(std::move(shared->captured->blob));  // for the next capture
        }
        return all_ok;
    };
}

}  // namespace skippy::stage
