// TextOutput: accumulates generated text, applies stop strings and decides how much of it is
// safe to stream (never half a UTF-8 character, never the beginning of a possible stop string).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace skippy::server {

class TextOutput {
  public:
    explicit TextOutput(std::vector<std::string> stop_strings);

    // Appends a token's text. Returns true when a stop string was found (the text is then
    // cut right before it and no more text should be appended).
    bool append(std::string_view piece);
    // Text that may be sent now (advances the sent position).
    std::string take_streamable();
    // Everything not sent yet (at the end of generation).
    std::string take_rest();
    const std::string& text() const { return text_; }
    // The stop string that ended the text ("" when none did).
    const std::string& matched_stop() const { return matched_stop_; }

  private:
    std::vector<std::string> stop_strings_;
    size_t max_stop_len_ = 0;
    std::string text_;
    std::string matched_stop_;
    size_t sent_ = 0;
};

// Length of the longest prefix of `text` that does not end inside a UTF-8 sequence.
size_t utf8_complete_prefix_length(std::string_view text);
bool is_valid_utf8(std::string_view text);
// `text` with every invalid UTF-8 sequence replaced by U+FFFD exactly as the JSON responses
// do (nlohmann's error_handler_t::replace): the text a client receives and sends back.
std::string as_sent_utf8(const std::string& text);

}  // namespace skippy::server
