#include "server/observe/kv_event_publisher.h"

#include <msgpack.h>
#include <zmq.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <stdexcept>
#include <utility>

namespace skippy::server {

namespace {

std::array<uint8_t, 8> be64(uint64_t v) {
    std::array<uint8_t, 8> out{};
    for (int i = 7; i >= 0; --i) {
        out[static_cast<size_t>(i)] = static_cast<uint8_t>(v);
        v >>= 8;
    }
    return out;
}

void pack_str(msgpack_packer& pk, const std::string& s) {
    msgpack_pack_str(&pk, s.size());
    msgpack_pack_str_body(&pk, s.data(), s.size());
}

void* bind_socket(void* ctx, int type, const std::string& endpoint, const char* flag) {
    void* socket = zmq_socket(ctx, type);
    if (socket == nullptr) {
        throw std::runtime_error(std::string(flag) + " " + endpoint + ": " +
                                 zmq_strerror(zmq_errno()));
    }
    const int linger = 0;
    zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof(linger));
    if (zmq_bind(socket, endpoint.c_str()) != 0) {
        const std::string why = zmq_strerror(zmq_errno());
        zmq_close(socket);
        throw std::runtime_error(std::string(flag) + " " + endpoint + ": cannot bind (" + why +
                                 ")");
    }
    return socket;
}

// Sends the frames of one multipart message; false if the socket refused it.
bool send_frames(void* socket, std::span<const std::pair<const void*, size_t>> frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
        const int flags = (i + 1 < frames.size() ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT;
        if (zmq_send(socket, frames[i].first, frames[i].second, flags) < 0) {
            return false;
        }
    }
    return true;
}

}  // namespace

KvEventPublisher::KvEventPublisher(KvEventsOptions options)
    : options_(std::move(options)),
      ledger_({.block_size = options_.block_size, .checkpoint_only = options_.checkpoint_only}) {
    if (options_.block_size == 0) {
        throw std::runtime_error("--kv-events-block-size must be at least 1");
    }
    ctx_ = zmq_ctx_new();
    try {
        pub_ = bind_socket(ctx_, ZMQ_PUB, options_.endpoint, "--kv-events");
        zmq_setsockopt(pub_, ZMQ_SNDHWM, &options_.send_hwm, sizeof(options_.send_hwm));
        if (!options_.replay_endpoint.empty()) {
            replay_ = bind_socket(ctx_, ZMQ_ROUTER, options_.replay_endpoint, "--kv-events-replay");
        }
    } catch (...) {
        if (pub_ != nullptr) {
            zmq_close(pub_);
        }
        zmq_ctx_term(ctx_);
        throw;
    }
}

KvEventPublisher::~KvEventPublisher() {
    stop();
    if (pub_ != nullptr) {
        zmq_close(pub_);
    }
    if (replay_ != nullptr) {
        zmq_close(replay_);
    }
    zmq_ctx_term(ctx_);
}

void KvEventPublisher::start(std::string topic) {
    topic_ = std::move(topic);
    thread_ = std::thread([this] { run(); });
}

void KvEventPublisher::stop() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) {
        thread_.join();
    }
}

cache::EntryObserver KvEventPublisher::observer() {
    return [this](const cache::EntryChange& change) { enqueue(change); };
}

void KvEventPublisher::enqueue(const cache::EntryChange& change) {
    // Called with the cache mutex held: copy, push, return.
    {
        std::lock_guard lock(mu_);
        if (queue_.size() >= options_.queue_capacity) {
            dropped_.fetch_add(1, std::memory_order_relaxed);
            resync_ = true;
            return;
        }
        queue_.push_back(Change{
            change.kind, change.ns,
            std::vector<cache::Token>(change.tokens.begin(), change.tokens.end()), change.page});
    }
    cv_.notify_one();
}

void KvEventPublisher::run() {
    using Clock = std::chrono::steady_clock;
    std::vector<cache::KvEvent> pending;
    Clock::time_point first_pending{};
    for (;;) {
        std::vector<Change> changes;
        bool resync = false;
        bool stopping = false;
        {
            std::unique_lock lock(mu_);
            cv_.wait_for(lock, options_.batch_interval,
                         [this] { return stop_ || !queue_.empty(); });
            changes.swap(queue_);
            resync = std::exchange(resync_, false);
            stopping = stop_;
        }
        const size_t before = pending.size();
        if (resync) {
            ledger_.clear(pending);
        }
        for (const Change& c : changes) {
            if (c.kind == cache::EntryChange::Kind::Added) {
                ledger_.add(c.ns, c.tokens, c.page, pending);
            } else {
                ledger_.remove(c.ns, c.tokens, c.page, pending);
            }
        }
        advertised_.store(ledger_.advertised_blocks(), std::memory_order_relaxed);
        if (before == 0 && !pending.empty()) {
            first_pending = Clock::now();
        }
        if (!pending.empty() && (stopping || pending.size() >= options_.max_batch_events ||
                                 Clock::now() - first_pending >= options_.batch_interval)) {
            publish(pending);
        }
        if (replay_ != nullptr) {
            service_replay();
        }
        if (stopping) {
            return;
        }
    }
}

std::string KvEventPublisher::encode_batch(double ts, std::span<const cache::KvEvent> events,
                                           uint32_t block_size, const std::string& medium,
                                           int data_parallel_rank) {
    msgpack_sbuffer buf;
    msgpack_sbuffer_init(&buf);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &buf, msgpack_sbuffer_write);
    // KVEventBatch (array_like): [ts, events, data_parallel_rank]
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, ts);
    msgpack_pack_array(&pk, events.size());
    for (const cache::KvEvent& ev : events) {
        switch (ev.type) {
            case cache::KvEventType::BlockStored:
                // [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id,
                //  medium, lora_name]; later fields have defaults and are omitted.
                msgpack_pack_array(&pk, 8);
                pack_str(pk, "BlockStored");
                msgpack_pack_array(&pk, ev.block_hashes.size());
                for (uint64_t h : ev.block_hashes) {
                    msgpack_pack_uint64(&pk, h);
                }
                if (ev.parent_block_hash) {
                    msgpack_pack_uint64(&pk, *ev.parent_block_hash);
                } else {
                    msgpack_pack_nil(&pk);
                }
                msgpack_pack_array(&pk, ev.token_ids.size());
                for (cache::Token t : ev.token_ids) {
                    msgpack_pack_int64(&pk, t);
                }
                msgpack_pack_uint32(&pk, block_size);
                msgpack_pack_nil(&pk);
                pack_str(pk, medium);
                msgpack_pack_nil(&pk);
                break;
            case cache::KvEventType::BlockRemoved:
                msgpack_pack_array(&pk, 3);
                pack_str(pk, "BlockRemoved");
                msgpack_pack_array(&pk, ev.block_hashes.size());
                for (uint64_t h : ev.block_hashes) {
                    msgpack_pack_uint64(&pk, h);
                }
                pack_str(pk, medium);
                break;
            case cache::KvEventType::AllBlocksCleared:
                msgpack_pack_array(&pk, 1);
                pack_str(pk, "AllBlocksCleared");
                break;
        }
    }
    msgpack_pack_int(&pk, data_parallel_rank);
    std::string out(buf.data, buf.size);
    msgpack_sbuffer_destroy(&buf);
    return out;
}

void KvEventPublisher::publish(std::vector<cache::KvEvent>& events) {
    const double ts =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    for (size_t at = 0; at < events.size(); at += options_.max_batch_events) {
        const size_t n = std::min(options_.max_batch_events, events.size() - at);
        const std::span<const cache::KvEvent> part(events.data() + at, n);
        std::string payload = encode_batch(ts, part, options_.block_size, options_.medium);
        const uint64_t seq = next_seq_++;
        const auto seq_bytes = be64(seq);
        const std::array<std::pair<const void*, size_t>, 3> frames{{
            {topic_.data(), topic_.size()},
            {seq_bytes.data(), seq_bytes.size()},
            {payload.data(), payload.size()},
        }};
        // A PUB socket drops for subscribers past their high-water mark; a refusal here is
        // recoverable through replay, as for those.
        (void)send_frames(pub_, frames);
        for (const cache::KvEvent& ev : part) {
            switch (ev.type) {
                case cache::KvEventType::BlockStored:
                    stored_.fetch_add(1, std::memory_order_relaxed);
                    break;
                case cache::KvEventType::BlockRemoved:
                    removed_.fetch_add(1, std::memory_order_relaxed);
                    break;
                case cache::KvEventType::AllBlocksCleared:
                    cleared_.fetch_add(1, std::memory_order_relaxed);
                    break;
            }
        }
        batches_.fetch_add(1, std::memory_order_relaxed);
        buffer_.emplace_back(seq, std::move(payload));
        while (buffer_.size() > options_.replay_batches) {
            buffer_.pop_front();
        }
    }
    events.clear();
}

void KvEventPublisher::service_replay() {
    for (;;) {
        std::vector<std::string> frames;
        int more = 0;
        do {
            zmq_msg_t msg;
            zmq_msg_init(&msg);
            if (zmq_msg_recv(&msg, replay_, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&msg);
                if (frames.empty()) {
                    return;  // nothing waiting
                }
                break;
            }
            frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
            more = zmq_msg_more(&msg);
            zmq_msg_close(&msg);
        } while (more != 0);
        // [client id, "", start seq (8 bytes, big-endian)]
        if (frames.size() != 3 || frames[2].size() != 8) {
            continue;
        }
        uint64_t start = 0;
        for (unsigned char c : frames[2]) {
            start = (start << 8) | c;
        }
        replays_.fetch_add(1, std::memory_order_relaxed);
        const std::string& id = frames[0];
        for (const auto& [seq, payload] : buffer_) {
            if (seq < start) {
                continue;
            }
            const auto seq_bytes = be64(seq);
            const std::array<std::pair<const void*, size_t>, 4> reply{{
                {id.data(), id.size()},
                {"", 0},
                {seq_bytes.data(), seq_bytes.size()},
                {payload.data(), payload.size()},
            }};
            if (!send_frames(replay_, reply)) {
                break;
            }
        }
        const auto end = be64(~uint64_t{0});  // -1 as a signed 8-byte big-endian integer
        const std::array<std::pair<const void*, size_t>, 4> done{{
            {id.data(), id.size()},
            {"", 0},
            {end.data(), end.size()},
            {"", 0},
        }};
        (void)send_frames(replay_, done);
    }
}

void KvEventPublisher::write_metrics(metrics::MetricsWriter& out) const {
    const auto v = [](const std::atomic<uint64_t>& a) {
        return static_cast<double>(a.load(std::memory_order_relaxed));
    };
    out.counter("skippy_kv_events_batches_total", "KV event batches published.", v(batches_));
    const char* help = "KV events published, by vLLM event type.";
    out.counter("skippy_kv_events_events_total", help, v(stored_), {{"type", "BlockStored"}});
    out.counter("skippy_kv_events_events_total", help, v(removed_), {{"type", "BlockRemoved"}});
    out.counter("skippy_kv_events_events_total", help, v(cleared_), {{"type", "AllBlocksCleared"}});
    out.counter("skippy_kv_events_dropped_total",
                "Cache entry changes dropped because the KV event queue was full (each drop "
                "withdraws every advertised block).",
                v(dropped_));
    out.counter("skippy_kv_events_replays_total", "KV event replay requests answered.",
                v(replays_));
    out.gauge("skippy_kv_events_advertised_blocks", "Blocks currently advertised to routers.",
              v(advertised_));
}

std::string KvEventPublisher::metrics_text() const {
    metrics::MetricsWriter w;
    write_metrics(w);
    return w.text();
}

}  // namespace skippy::server
