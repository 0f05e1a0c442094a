// DirectChatRender: renders chat messages with a Jinja chat template the way llama.cpp's
// common_chat_templates_apply renders the prompt, without what that call does besides: for
// templates without a specialized handler it analyses the template (renders it a dozen
// times with probe messages) and builds an output parser on every call, 2-9 ms at 40
// messages, on the path of every chat request. The prompt of that route is
// common_chat_template_direct_apply of the messages after the same preparation (typed or
// string content, developer -> system, system merged into the first user message where the
// template has no system role, empty content beside tool calls, tool-call arguments as
// objects, the date and template kwargs as context); this file does that preparation.
//
// Only for templates that take that route: `eligible` is false for templates with a
// specialized handler (they adjust messages in ways of their own) and for those whose
// content llama.cpp trims first. ChatTemplate checks on a probe conversation that both paths
// agree before it renders this way, and tests compare them on every template llama.cpp ships.
//
// Internal to src/runtime (llama.cpp types). Thread safety: render is const and reentrant.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chat.h"

namespace skippy::runtime {

class DirectChatRender {
  public:
    DirectChatRender(const std::string& source, const std::string& bos, const std::string& eos,
                     bool add_bos, bool add_eos);
    ~DirectChatRender();

    // False when the prompt of common_chat_templates_apply is not the direct render.
    bool eligible() const { return eligible_; }

    // The prompt of common_chat_templates_apply(inputs) for an eligible template. Throws
    // what the template throws.
    std::string render(const common_chat_templates_inputs& inputs) const;

  private:
    std::unique_ptr<common_chat_template> tmpl_;
    bool add_bos_ = false;
    bool add_eos_ = false;
    bool eligible_ = false;
};

}  // namespace skippy::runtime
