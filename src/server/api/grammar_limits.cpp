#include "server/api/grammar_limits.h"

#include <optional>

#include "server/api/api_error.h"

namespace skippy::server {

namespace {

// Skips what llama.cpp's grammar parser treats as space: blanks, newlines, # comments.
size_t skip_grammar_space(const std::string& g, size_t i) {
    while (i < g.size()) {
        if (g[i] == ' ' || g[i] == '\t' || g[i] == '\n' || g[i] == '\r') {
            ++i;
        } else if (g[i] == '#') {
            while (i < g.size() && g[i] != '\n' && g[i] != '\r') {
                ++i;
            }
        } else {
            break;
        }
    }
    return i;
}

// Reads the decimal number at `i` (nullopt when there is none or it has over 9 digits).
std::optional<uint64_t> grammar_number(const std::string& g, size_t& i) {
    const size_t begin = i;
    while (i < g.size() && g[i] >= '0' && g[i] <= '9') {
        ++i;
    }
    if (i == begin || i - begin > 9) {
        return std::nullopt;
    }
    return std::stoull(g.substr(begin, i - begin));
}

// A repetition "{m,n}" starting at `open`: llama.cpp loops (practically) forever on m > n
// (it counts n - m optional copies in unsigned arithmetic).
void check_grammar_repetition(const std::string& g, size_t open) {
    size_t i = skip_grammar_space(g, open + 1);
    const size_t min_digits = i;
    const auto min_times = grammar_number(g, i);
    if (!min_times) {
        if (i > min_digits) {
            throw invalid_request("'grammar' has a repetition count that is too large", "grammar");
        }
        return;  // not a repetition: llama.cpp reports the syntax error
    }
    i = skip_grammar_space(g, i);
    if (i >= g.size() || g[i] != ',') {
        return;
    }
    i = skip_grammar_space(g, i + 1);
    const size_t digits = i;
    const auto max_times = grammar_number(g, i);
    if (!max_times && i > digits) {
        throw invalid_request("'grammar' has a repetition count that is too large", "grammar");
    }
    if (max_times && *max_times < *min_times) {
        throw invalid_request("'grammar' has a repetition {m,n} with m > n", "grammar");
    }
}

// Checks a GBNF grammar against what llama.cpp's grammar parser (which runs on the
// scheduler thread) handles without crashing or hanging: nesting of parenthesized groups
// (it recurses per group), number of rules, size, and repetition bounds. Quoted literals,
// character classes and comments are skipped, so parentheses inside them do not count.
}  // namespace

void check_grammar(const std::string& grammar, const GrammarLimits& limits) {
    if (grammar.size() > limits.max_bytes) {
        throw invalid_request(
            "'grammar' is longer than " + std::to_string(limits.max_bytes) + " bytes", "grammar");
    }
    enum class State { Normal, Literal, CharClass, Comment };
    State state = State::Normal;
    size_t depth = 0;
    size_t rules = 0;
    for (size_t i = 0; i < grammar.size(); ++i) {
        const char c = grammar[i];
        switch (state) {
            case State::Normal:
                if (c == '"') {
                    state = State::Literal;
                } else if (c == '[') {
                    state = State::CharClass;
                } else if (c == '#') {
                    state = State::Comment;
                } else if (c == '(') {
                    if (++depth > limits.max_depth) {
                        throw invalid_request("'grammar' nests groups deeper than " +
                                                  std::to_string(limits.max_depth),
                                              "grammar");
                    }
                } else if (c == ')') {
                    depth = depth > 0 ? depth - 1 : 0;
                } else if (c == '{') {
                    check_grammar_repetition(grammar, i);
                } else if (c == ':' && grammar.compare(i, 3, "::=") == 0) {
                    if (++rules > limits.max_rules) {
                        throw invalid_request("'grammar' has more than " +
                                                  std::to_string(limits.max_rules) + " rules",
                                              "grammar");
                    }
                    i += 2;
                }
                break;
            case State::Literal:
                if (c == '\\') {
                    ++i;
                } else if (c == '"') {
                    state = State::Normal;
                }
                break;
            case State::CharClass:
                if (c == '\\') {
                    ++i;
                } else if (c == ']') {
                    state = State::Normal;
                }
                break;
            case State::Comment:
                if (c == '\n' || c == '\r') {
                    state = State::Normal;
                }
                break;
        }
    }
}

}  // namespace skippy::server
