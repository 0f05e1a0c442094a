#include "runtime/chat_template.h"

#include <stdexcept>

#include "chat.h"
#include "llama.h"
#include "runtime/model.h"

namespace skippy::runtime {

struct ChatTemplate::Impl {
    common_chat_templates_ptr templates;
};

ChatTemplate::ChatTemplate(const Model& model, const std::string& template_override)
    : impl_(std::make_unique<Impl>()) {
    impl_->templates = common_chat_templates_init(model.raw(), template_override);
    if (!impl_->templates) {
        throw std::runtime_error("model has no usable chat template");
    }
    source_ = common_chat_templates_source(impl_->templates.get());
}

ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) const {
    common_chat_templates_inputs inputs;
    inputs.use_jinja = true;
    inputs.add_generation_prompt = add_generation_prompt;
    for (const auto& message : messages) {
        common_chat_msg msg;
        msg.role = message.role;
        msg.content = message.content;
        inputs.messages.push_back(std::move(msg));
    }
    try {
        common_chat_params params = common_chat_templates_apply(impl_->templates.get(), inputs);
        return params.prompt;
    } catch (const std::exception& e) {
        throw std::invalid_argument(std::string("chat template failed: ") + e.what());
    }
}

}  // namespace skippy::runtime
