#include "stage/plan.h"

#include <algorithm>

namespace skippy::stage {

std::string_view to_string(CacheDecision decision) {
    switch (decision) {
        case CacheDecision::Off:
            return "off";
        case CacheDecision::Miss:
            return "miss";
        case CacheDecision::ExactHit:
            return "exact_hit";
        case CacheDecision::Error:
            return "error";
    }
    return "?";
}

std::string_view to_string(CacheTier tier) {
    switch (tier) {
        case CacheTier::None:
            return "none";
        case CacheTier::Lane:
            return "lane";
        case CacheTier::Ram:
            return "ram";
        case CacheTier::Disk:
            return "disk";
    }
    return "?";
}

std::vector<int32_t> plan_chunks(int32_t begin, int32_t end, std::vector<int32_t> pauses,
                                 int32_t max_chunk, int32_t min_chunk) {
    std::vector<int32_t> out;
    if (end <= begin) {
        return out;
    }
    max_chunk = std::max(max_chunk, 3);
    // A split must be able to leave >= min_chunk on each side (a batch too small for that
    // gets smaller minimum chunks: the stage factory keeps the cache off there).
    min_chunk = std::clamp(min_chunk, 2, (max_chunk + 1) / 2);
    std::sort(pauses.begin(), pauses.end());
    pauses.erase(std::unique(pauses.begin(), pauses.end()), pauses.end());
    int32_t at = begin;
    size_t next = 0;
    while (at < end) {
        while (next < pauses.size() && pauses[next] < at + min_chunk) {
            ++next;  // too close to the chunk start
        }
        int32_t stop = std::min(end, at + max_chunk);
        if (next < pauses.size() && pauses[next] <= stop && end - pauses[next] >= min_chunk) {
            stop = pauses[next];
        }
        if (end - stop > 0 && end - stop < min_chunk) {
            stop = end - min_chunk;  // never leave a short tail
        }
        out.push_back(stop);
        at = stop;
    }
    return out;
}

}  // namespace skippy::stage
