// PrefixGhosts: what a tier evicted or quarantined is recognised by a later prompt that
// shares its prefix (at every 64-token step and at the full length), per namespace, bounded.
#include "cache/prefix_ghosts.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace skippy::cache {
namespace {

NamespaceId ns_of(const char* key) {
    IdentityFields f;
    f.weights_digest = "w";
    f.namespace_key = key;
    return NamespaceId::from_fields(f);
}

std::vector<Token> tokens(size_t n, Token first = 1) {
    std::vector<Token> t(n);
    std::iota(t.begin(), t.end(), first);
    return t;
}

TEST(PrefixGhosts, FindsTheLongestForgottenPrefix) {
    PrefixGhosts ghosts;
    const NamespaceId a = ns_of("a");
    ghosts.add(a, tokens(200), GhostCause::Evicted);
    // The same path: its full length.
    auto m = ghosts.longest(a, tokens(200));
    ASSERT_TRUE(m);
    EXPECT_EQ(m->len, 200u);
    EXPECT_EQ(m->cause, GhostCause::Evicted);
    // A prompt that goes on past it, and one that diverges inside it (a 64-token step).
    EXPECT_EQ(ghosts.longest(a, tokens(300))->len, 200u);
    std::vector<Token> diverged = tokens(150);
    diverged.push_back(-5);
    EXPECT_EQ(ghosts.longest(a, diverged)->len, 128u);
    EXPECT_FALSE(ghosts.longest(a, tokens(50)));
    EXPECT_FALSE(ghosts.longest(a, tokens(150), 129));  // below min_len
    // Another namespace never matches.
    EXPECT_FALSE(ghosts.longest(ns_of("b"), tokens(200)));
}

TEST(PrefixGhosts, LaterCauseWinsAndTheBoundHolds) {
    PrefixGhosts ghosts(100);
    const NamespaceId a = ns_of("a");
    ghosts.add(a, tokens(128), GhostCause::Evicted);
    ghosts.add(a, tokens(128), GhostCause::Quarantined);
    EXPECT_EQ(ghosts.longest(a, tokens(128))->cause, GhostCause::Quarantined);
    for (Token start = 1000; start < 1000 + 200 * 1000; start += 1000) {
        ghosts.add(a, tokens(640, start), GhostCause::Evicted);
    }
    EXPECT_LE(ghosts.size(), 100u);
    EXPECT_FALSE(ghosts.longest(a, tokens(128)));  // the oldest was forgotten
    EXPECT_TRUE(ghosts.longest(a, tokens(640, 1000 + 199 * 1000)));
}

}  // namespace
}  // namespace skippy::cache
