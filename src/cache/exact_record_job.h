// make_exact_record_job: the RecordQueue job that stores one exported state in an
// ExactStateCache (dedupe against stored blocks, insert, evict to limits).
//
//   ExactRecordPayload p{ns, tokens_vec, page, descriptor, std::move(exported_bytes), cuts};
//   queue.submit(make_exact_record_job(cache, std::move(p),
//                                      [](const ExactInsertResult& r) { telemetry(r); }));
//
// The job succeeds if the page ends up stored (Inserted, Replaced or AlreadyPresent; an
// entry already present is detected before any hashing) and fails otherwise; `on_done`,
// if given, sees the insert result (not called when the page was already present).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "cache/exact_state_cache.h"
#include "cache/namespace_id.h"
#include "cache/page_id.h"
#include "cache/payload_descriptor.h"
#include "cache/record_queue.h"
#include "cache/token.h"

namespace skippy::cache {

struct ExactRecordPayload {
    NamespaceId ns;
    std::vector<Token> tokens;
    PageId page;
    PayloadDescriptor descriptor;
    std::vector<uint8_t> bytes;
    std::vector<size_t> cuts;
};

RecordJob make_exact_record_job(ExactStateCache& cache, ExactRecordPayload payload,
                                std::function<void(const ExactInsertResult&)> on_done = {});
// Same, for a payload the caller keeps reading meanwhile (no copy of the bytes).
RecordJob make_exact_record_job(ExactStateCache& cache,
                                std::shared_ptr<const ExactRecordPayload> payload,
                                std::function<void(const ExactInsertResult&)> on_done = {});

}  // namespace skippy::cache
