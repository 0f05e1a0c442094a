#include "cache/prefix_identity.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "test_util.h"

namespace skippy::cache {
namespace {

using test::base_fields;
using test::iota_tokens;

PrefixIdentity reference_identity() {
    const NamespaceId ns = NamespaceId::from_fields(base_fields());
    const std::vector<Token> tokens = iota_tokens(100);
    return prefix_identity(ns, 0, tokens);
}

TEST(PrefixIdentity, EveryNamespaceFieldChangesTheIdentity) {
    const std::vector<std::function<void(IdentityFields&)>> mutations = {
        [](IdentityFields& f) { f.weights_digest += "0"; },
        [](IdentityFields& f) { f.layer_begin = 1; },
        [](IdentityFields& f) { f.layer_end = 31; },
        [](IdentityFields& f) { f.runtime_version = "llama.cpp-other/state-v1"; },
        [](IdentityFields& f) { f.k_type = "q8_0"; },
        [](IdentityFields& f) { f.v_type = "q8_0"; },
        [](IdentityFields& f) { f.flash_attn = false; },
        [](IdentityFields& f) { f.unified_kv = false; },
        [](IdentityFields& f) { f.n_ctx = 16384; },
        [](IdentityFields& f) { f.devices = "CUDA0;RPC:10.0.0.2:50052"; },
        [](IdentityFields& f) { f.platform = "aarch64-le"; },
        [](IdentityFields& f) { f.namespace_key = "tenant-a"; },
        [](IdentityFields& f) { f.namespace_key = ""; },  // present-but-empty != absent
    };
    const std::vector<Token> tokens = iota_tokens(10);
    std::set<std::string> seen{NamespaceId::from_fields(base_fields()).hex()};
    std::set<std::string> prefixes{
        prefix_identity(NamespaceId::from_fields(base_fields()), 0, tokens).hex()};
    for (size_t i = 0; i < mutations.size(); ++i) {
        IdentityFields f = base_fields();
        mutations[i](f);
        const NamespaceId ns = NamespaceId::from_fields(f);
        EXPECT_TRUE(seen.insert(ns.hex()).second) << "mutation " << i;
        EXPECT_TRUE(prefixes.insert(prefix_identity(ns, 0, tokens).hex()).second)
            << "mutation " << i;
    }
}

TEST(PrefixIdentity, TokenStartAndTokensChangeTheIdentity) {
    const NamespaceId ns = NamespaceId::from_fields(base_fields());
    const std::vector<Token> a = iota_tokens(100);
    std::vector<Token> b = a;
    b[57] = 9999;
    std::set<std::string> seen;
    EXPECT_TRUE(seen.insert(prefix_identity(ns, 0, a).hex()).second);
    EXPECT_TRUE(seen.insert(prefix_identity(ns, 1, a).hex()).second);
    EXPECT_TRUE(seen.insert(prefix_identity(ns, 0, b).hex()).second);
    EXPECT_TRUE(seen.insert(prefix_identity(ns, 0, std::span(a).first(99)).hex()).second);
    EXPECT_TRUE(seen.insert(prefix_identity(ns, 0, {}).hex()).second);
    const std::vector<Token> zero{0};
    const std::vector<Token> zeros{0, 0};
    EXPECT_TRUE(seen.insert(prefix_identity(ns, 0, zero).hex()).second);
    EXPECT_TRUE(seen.insert(prefix_identity(ns, 0, zeros).hex()).second);
    // The chunk size is part of the identity.
    EXPECT_TRUE(seen.insert(prefix_identity(ns, 0, a, 32).hex()).second);
}

TEST(PrefixIdentity, NoAliasingAcrossFieldBoundaries) {
    IdentityFields x = base_fields();
    IdentityFields y = base_fields();
    x.k_type = "ab";
    x.v_type = "c";
    y.k_type = "a";
    y.v_type = "bc";
    EXPECT_NE(NamespaceId::from_fields(x), NamespaceId::from_fields(y));

    x = base_fields();
    y = base_fields();
    x.weights_digest = "ab";
    x.runtime_version = "c";
    y.weights_digest = "a";
    y.runtime_version = "bc";
    EXPECT_NE(NamespaceId::from_fields(x), NamespaceId::from_fields(y));

    x = base_fields();
    y = base_fields();
    x.devices = "";
    x.platform = "ab";
    y.devices = "ab";
    y.platform = "";
    EXPECT_NE(NamespaceId::from_fields(x), NamespaceId::from_fields(y));
}

TEST(PrefixIdentity, StableAcrossRestarts) {
    // Computed once with this implementation; must never change (ids are persisted and
    // shared across restarts and replicas). A change here breaks every stored page.
    const PrefixIdentity id = reference_identity();
    EXPECT_EQ(id.hex(), "256e149a481c69b4bc3dbf6bcf28322c623f14d4833fe8544970165f191fcefe")
        << "actual: " << id.hex();
    EXPECT_EQ(id.page_id().str(), id.hex().substr(0, 16));
    EXPECT_EQ(NamespaceId::from_fields(base_fields()).hex(),
              "dbd0ff6c12de2c4968a84d1ad0efcaaa5eccea9fe6115212e8a7d41803899df3")
        << "actual: " << NamespaceId::from_fields(base_fields()).hex();
}

TEST(PrefixIdentity, SameIdentityInAChildProcess) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        const std::string hex = reference_identity().hex();
        const ssize_t n = write(fds[1], hex.data(), hex.size());
        close(fds[1]);
        _exit(n == static_cast<ssize_t>(hex.size()) ? 0 : 1);
    }
    close(fds[1]);
    std::string child;
    char buf[128];
    ssize_t n = 0;
    while ((n = read(fds[0], buf, sizeof(buf))) > 0) {
        child.append(buf, static_cast<size_t>(n));
    }
    close(fds[0]);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
    EXPECT_EQ(child, reference_identity().hex());
}

TEST(PrefixIdentity, ChainEqualsDirectForEveryLength) {
    const NamespaceId ns = NamespaceId::from_fields(base_fields());
    std::mt19937_64 rng(7);
    const std::vector<Token> tokens = test::random_tokens(rng, 300, 150000);
    for (size_t chunk : {size_t{1}, size_t{7}, size_t{64}}) {
        std::vector<size_t> lengths;
        for (size_t len = 0; len <= tokens.size(); ++len) {
            lengths.push_back(len);
        }
        std::shuffle(lengths.begin(), lengths.end(), rng);
        const auto ids = identities_for_lengths(ns, 5, tokens, lengths, chunk);
        ASSERT_EQ(ids.size(), lengths.size());
        for (size_t i = 0; i < lengths.size(); ++i) {
            const PrefixIdentity direct =
                prefix_identity(ns, 5, std::span(tokens).first(lengths[i]), chunk);
            ASSERT_EQ(ids[i], direct) << "chunk " << chunk << " len " << lengths[i];
            EXPECT_EQ(ids[i].token_count, lengths[i]);
            EXPECT_EQ(ids[i].token_start, 5u);
        }
    }
}

TEST(PrefixIdentity, StreamingHasherMatchesAnySlicing) {
    const NamespaceId ns = NamespaceId::from_fields(base_fields());
    std::mt19937_64 rng(11);
    const std::vector<Token> tokens = test::random_tokens(rng, 1000, 50);
    for (int round = 0; round < 20; ++round) {
        PrefixHasher h(ns, 0);
        size_t pos = 0;
        while (pos < tokens.size()) {
            const size_t take = std::min<size_t>(rng() % 150, tokens.size() - pos);
            h.append(std::span(tokens).subspan(pos, take));
            pos += take;
            if (rng() % 4 == 0) {
                ASSERT_EQ(h.identity(), prefix_identity(ns, 0, std::span(tokens).first(pos)));
            }
        }
        ASSERT_EQ(h.size(), tokens.size());
        EXPECT_EQ(h.identity(), prefix_identity(ns, 0, tokens));
    }
}

TEST(PrefixIdentity, LengthsKeepOrderAndDuplicates) {
    const NamespaceId ns = NamespaceId::from_fields(base_fields());
    const std::vector<Token> tokens = iota_tokens(200);
    const std::vector<size_t> lengths{199, 64, 199, 0, 128};
    const auto ids = identities_for_lengths(ns, 0, tokens, lengths);
    ASSERT_EQ(ids.size(), 5u);
    EXPECT_EQ(ids[0], ids[2]);
    EXPECT_EQ(ids[1].token_count, 64u);
    EXPECT_EQ(ids[3].token_count, 0u);
    const std::vector<size_t> too_long{201};
    EXPECT_THROW(identities_for_lengths(ns, 0, tokens, too_long), std::invalid_argument);
    EXPECT_THROW(prefix_identity(ns, 0, tokens, 0), std::invalid_argument);
}

TEST(PageId, PrintableRoundTrip) {
    const PrefixIdentity id = reference_identity();
    const PageId page = id.page_id();
    const std::string s = page.str();
    EXPECT_EQ(s.size(), 16u);
    EXPECT_EQ(PageId::parse(s), page);
    std::string upper = s;
    for (char& c : upper) {
        c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
    EXPECT_EQ(PageId::parse(upper), page);
    EXPECT_FALSE(PageId::parse("123").has_value());
    EXPECT_FALSE(PageId::parse("zzzzzzzzzzzzzzzz").has_value());
    EXPECT_EQ(PageId(0x1a).str(), "000000000000001a");
}

TEST(Platform, CurrentPlatformNamesEndianness) {
    const std::string p = current_platform();
    EXPECT_TRUE(p.ends_with("-le") || p.ends_with("-be")) << p;
}

}  // namespace
}  // namespace skippy::cache
