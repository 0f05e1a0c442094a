#include "cache/candidate_policy.h"

#include <algorithm>
#include <stdexcept>

namespace skippy::cache {
namespace {

void validate(const CandidatePolicy& policy) {
    if (policy.stride == 0) {
        throw std::invalid_argument("CandidatePolicy: stride must be > 0");
    }
}

size_t floor_min(const CandidatePolicy& policy) { return std::max<size_t>(policy.min_tokens, 1); }

class Ladder {
  public:
    Ladder(size_t exact_len, const CandidatePolicy& policy)
        : exact_len_(exact_len), policy_(policy), min_(floor_min(policy)) {}

    // Returns true if `len` was added.
    bool add(size_t len) {
        if (len < min_ || len > exact_len_ || full()) {
            return false;
        }
        if (std::find(rungs_.begin(), rungs_.end(), len) != rungs_.end()) {
            return false;
        }
        if (policy_.record_token_budget != 0 && used_ + len > policy_.record_token_budget) {
            return false;
        }
        rungs_.push_back(len);
        used_ += len;
        return true;
    }
    bool full() const { return rungs_.size() >= policy_.record_limit; }
    std::vector<size_t> sorted() && {
        std::sort(rungs_.begin(), rungs_.end());
        return std::move(rungs_);
    }

  private:
    size_t exact_len_;
    const CandidatePolicy& policy_;
    size_t min_;
    size_t used_ = 0;
    std::vector<size_t> rungs_;
};

}  // namespace

std::vector<size_t> lookup_candidates(size_t reusable_len, const CandidatePolicy& policy) {
    validate(policy);
    const size_t min = floor_min(policy);
    std::vector<size_t> out;
    if (reusable_len < min) {
        return out;
    }
    out.push_back(reusable_len);
    size_t grid = ((reusable_len - 1) / policy.stride) * policy.stride;  // strictly below
    while (grid >= min && grid > 0) {
        out.push_back(grid);
        grid -= policy.stride;
    }
    return out;
}

std::vector<size_t> record_ladder(size_t exact_len, std::span<const size_t> structural_positions,
                                  const CandidatePolicy& policy) {
    validate(policy);
    Ladder ladder(exact_len, policy);
    if (exact_len == 0) {
        return {};
    }
    ladder.add(exact_len);

    const size_t grid_below = ((exact_len - 1) / policy.stride) * policy.stride;
    ladder.add(grid_below);

    std::vector<size_t> structural(structural_positions.begin(), structural_positions.end());
    std::sort(structural.begin(), structural.end());
    structural.erase(std::unique(structural.begin(), structural.end()), structural.end());
    std::erase_if(structural, [&](size_t p) { return p < floor_min(policy) || p > exact_len; });
    if (!structural.empty()) {
        ladder.add(structural.front());
        for (auto it = structural.rbegin(); it != structural.rend(); ++it) {
            ladder.add(*it);
        }
    }

    const size_t max_geometric = policy.record_limit >= 2 ? policy.record_limit - 2 : 0;
    std::vector<size_t> geometric;
    for (size_t rung = policy.stride; rung < grid_below; rung *= 2) {
        geometric.push_back(rung);
        if (rung > SIZE_MAX / 2) {
            break;
        }
    }
    size_t taken = 0;
    for (auto it = geometric.rbegin(); it != geometric.rend() && taken < max_geometric; ++it) {
        if (ladder.add(*it)) {
            ++taken;
        }
    }
    return std::move(ladder).sorted();
}

}  // namespace skippy::cache
