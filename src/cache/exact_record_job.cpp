#include "cache/exact_record_job.h"

#include <memory>

namespace skippy::cache {

RecordJob make_exact_record_job(ExactStateCache& cache, ExactRecordPayload payload,
                                std::function<void(const ExactInsertResult&)> on_done) {
    return make_exact_record_job(
        cache, std::make_shared<const ExactRecordPayload>(std::move(payload)), std::move(on_done));
}

RecordJob make_exact_record_job(ExactStateCache& cache,
                                std::shared_ptr<const ExactRecordPayload> shared,
                                std::function<void(const ExactInsertResult&)> on_done) {
    const PageId page = shared->page;
    return RecordJob{page, [&cache, shared, done = std::move(on_done)]() -> bool {
                         const ExactRecordPayload& p = *shared;
                         if (cache.contains(p.ns, p.tokens, p.page)) {
                             return true;
                         }
                         ExactInsertResult r =
                             cache.insert(p.ns, p.tokens, p.page, p.descriptor, p.bytes, p.cuts);
                         if (done) {
                             done(r);
                         }
                         return r.stored() || r.status == ExactInsertStatus::AlreadyPresent;
                     }};
}

}  // namespace skippy::cache
