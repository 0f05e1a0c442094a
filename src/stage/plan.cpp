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
        case CacheTier::Redis:
            return "redis";
    }
    return "?";
}

int32_t ExactRule::body_end(int32_t n, std::span<const int32_t> boundaries) const {
    if (!has_tail() || n <= 0) {
        return std::max(n, 0);
    }
    int32_t anchor = 0;
    bool messages = false;
    for (int32_t b : boundaries) {
        messages = messages || (b > 0 && b < n);
        if (b >= body_min && b <= n - 1 && b > anchor) {
            anchor = b;
        }
    }
    if (anchor > 0 && n - anchor <= max_tail) {
        return anchor;  // a short last message: restored at its start, prefilled row by row
    }
    if (messages) {
        // A chat prompt with a long last message: all body. Its next turn restores a state
        // at or after this prompt's end, so no single-token chunk is spent on the last token.
        return n >= body_min ? n : 0;
    }
    return n - 1 >= body_min ? n - 1 : 0;  // a completion: the same prompt again is one token
}

std::vector<int32_t> ExactRule::chunks(int32_t begin, int32_t n,
                                       std::span<const int32_t> boundaries,
                                       int32_t max_chunk) const {
    return plan_chunks(begin, n, {}, max_chunk, body_min, body_end(n, boundaries));
}

namespace {

// One regime's part of a plan: [begin, end) in chunks of min_chunk..max_chunk tokens.
void plan_part(int32_t begin, int32_t end, const std::vector<int32_t>& pauses, int32_t max_chunk,
               int32_t min_chunk, std::vector<int32_t>& out) {
    int32_t at = begin;
    size_t next = 0;
    while (at < end) {
        while (next < pauses.size() && pauses[next] < at + min_chunk) {
            ++next;  // too close to the chunk start
        }
        int32_t stop = std::min(end, at + max_chunk);
        if (next < pauses.size() && pauses[next] <= stop && end - pauses[next] >= min_chunk) {
            stop = pauses[next];
        } else if (next < pauses.size()) {
            // A pause just past this chunk would be too close to the next chunk's start
            // (a system prompt ending a few tokens after a stride): stop one minimum chunk
            // before it instead, so that the next chunk ends there.
            const int32_t p = pauses[next];
            if (p > stop && p - stop < min_chunk && end - p >= min_chunk &&
                p - min_chunk - at >= min_chunk) {
                stop = p - min_chunk;
            }
        }
        if (end - stop > 0 && end - stop < min_chunk) {
            stop = std::max(at + 1, end - min_chunk);  // never leave a short rest
        }
        out.push_back(stop);
        at = stop;
    }
}

}  // namespace

std::vector<int32_t> plan_chunks(int32_t begin, int32_t end, std::vector<int32_t> pauses,
                                 int32_t max_chunk, int32_t min_chunk, int32_t body_end) {
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
    const int32_t split = std::clamp(body_end, begin, end);
    plan_part(begin, split, pauses, max_chunk, min_chunk, out);
    // A tail is < 64 tokens, or exactly 64 (then one chunk, computed like the body's).
    plan_part(split, end, pauses, max_chunk, end - split >= min_chunk ? min_chunk : 2, out);
    return out;
}

}  // namespace skippy::stage
