// KvEventPublisher: the exact cache's RAM tier as KV events in vLLM's format
// (vllm/distributed/kv_events.py: ZmqEventPublisher, KVEventBatch), for KV-aware routers
// (llm-d's kv-cache indexer, NVIDIA Dynamo's KV router) that subscribe to every replica.
//
//   KvEventPublisher pub(options);          // binds both sockets; throws naming a bad one
//   cache_config.on_entry_change = pub.observer();
//   ...
//   pub.start("kv@" + replica + "@" + model);
//
// Wire format (what a SUB socket on `options.endpoint` receives), one message per batch:
//   multipart [topic, seq as 8-byte big-endian, payload]; seq starts at 0, +1 per batch;
//   payload = msgpack [ts (float64 seconds), [event, ...], data_parallel_rank (0)], events
//   as msgspec encodes tagged array_like structs:
//     ["BlockStored", [hash, ...], parent_hash | nil, [token_id, ...], block_size,
//      lora_id (nil), medium ("CPU"), lora_name (nil)]
//     ["BlockRemoved", [hash, ...], medium]
//     ["AllBlocksCleared"]
//   hashes are unsigned 64-bit integers (kv_event_ledger.h says how they chain).
// Replay (ROUTER on `options.replay_endpoint`): a DEALER/REQ client sends ["", start_seq as
// 8-byte big-endian]; it gets ["", seq, payload] for every kept batch with seq >= start_seq
// (the last `replay_batches`), then ["", -1 as 8-byte big-endian, ""].
//
// Thread safety: the observer runs on the thread that changes the cache, with the cache
// mutex held: it copies the change into a bounded queue and returns (a full queue drops the
// change, counts it, and the publisher then withdraws everything it advertised: BlockRemoved
// for every block, AllBlocksCleared). One publisher thread owns both sockets and the ledger:
// it batches what arrived in the last `batch_interval` (or `max_batch_events`), encodes,
// sends, and answers replay requests. Metrics may be read from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cache/entry_change.h"
#include "cache/kv_event_ledger.h"
#include "server/observe/metrics_writer.h"

namespace skippy::server {

struct KvEventsOptions {
    std::string endpoint;            // --kv-events tcp://HOST:PORT (bound); empty = off
    std::string replay_endpoint;     // --kv-events-replay tcp://HOST:PORT; empty = no replay
    std::string replica_id;          // --replica-id; empty = hostname:port
    uint32_t block_size = 16;        // --kv-events-block-size
    bool checkpoint_only = false;    // hybrid/recurrent model (kv_event_ledger.h)
    std::string medium = "CPU";      // the RAM tier
    size_t queue_capacity = 100000;  // entry changes waiting for the publisher thread
    size_t replay_batches = 10000;   // batches kept for replay
    int send_hwm = 100000;           // ZeroMQ high-water mark of the PUB socket
    std::chrono::milliseconds batch_interval{10};
    size_t max_batch_events = 256;
};

class KvEventPublisher {
  public:
    explicit KvEventPublisher(KvEventsOptions options);
    ~KvEventPublisher();
    KvEventPublisher(const KvEventPublisher&) = delete;
    KvEventPublisher& operator=(const KvEventPublisher&) = delete;

    // Starts the publisher thread; changes observed before are published then.
    void start(std::string topic);
    // Stops after publishing what is queued (the destructor calls it).
    void stop();
    cache::EntryObserver observer();

    const std::string& topic() const { return topic_; }
    void write_metrics(metrics::MetricsWriter& out) const;
    std::string metrics_text() const;

    // One batch payload, as sent (exposed for tests).
    static std::string encode_batch(double ts, std::span<const cache::KvEvent> events,
                                    uint32_t block_size, const std::string& medium,
                                    int data_parallel_rank = 0);

  private:
    struct Change {
        cache::EntryChange::Kind kind;
        cache::NamespaceId ns;
        std::vector<cache::Token> tokens;
        cache::PageId page;
    };

    void enqueue(const cache::EntryChange& change);
    void run();
    void publish(std::vector<cache::KvEvent>& events);
    void service_replay();

    KvEventsOptions options_;
    std::string topic_;
    void* ctx_ = nullptr;
    void* pub_ = nullptr;
    void* replay_ = nullptr;

    mutable std::mutex mu_;  // guards queue_, resync_, stop_
    std::condition_variable cv_;
    std::vector<Change> queue_;
    bool resync_ = false;
    bool stop_ = false;
    std::thread thread_;

    // Publisher thread only.
    cache::KvEventLedger ledger_;
    uint64_t next_seq_ = 0;
    std::deque<std::pair<uint64_t, std::string>> buffer_;

    std::atomic<uint64_t> batches_{0};
    std::atomic<uint64_t> stored_{0};
    std::atomic<uint64_t> removed_{0};
    std::atomic<uint64_t> cleared_{0};
    std::atomic<uint64_t> dropped_{0};
    std::atomic<uint64_t> replays_{0};
    std::atomic<uint64_t> advertised_{0};
};

}  // namespace skippy::server
