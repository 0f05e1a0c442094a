// ChatTemplate: renders OpenAI-style messages into the model's prompt text with the
// chat template stored in the GGUF (llama.cpp common/ chat code, Jinja).
//
//   ChatTemplate tmpl(model);
//   std::string prompt = tmpl.render(messages, /*add_generation_prompt=*/true);
//
// Thread safety: render() is const and safe from any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace skippy::runtime {

class Model;

struct ChatMessage {
    std::string role;
    std::string content;
};

class ChatTemplate {
  public:
    // template_override: a Jinja template to use instead of the GGUF's (empty = from model).
    explicit ChatTemplate(const Model& model, const std::string& template_override = "");
    ~ChatTemplate();
    ChatTemplate(const ChatTemplate&) = delete;
    ChatTemplate& operator=(const ChatTemplate&) = delete;

    // Throws std::invalid_argument when the template cannot render the messages.
    std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
    // Stop strings the template asks for besides end-of-generation tokens.
    const std::vector<std::string>& additional_stops() const { return additional_stops_; }
    const std::string& source() const { return source_; }

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    std::vector<std::string> additional_stops_;
    std::string source_;
};

}  // namespace skippy::runtime
