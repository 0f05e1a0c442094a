#include "server/schedule/generation_stream.h"

namespace skippy::server {

void GenerationStream::push(StreamEvent event) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (closed_) {
            return;
        }
        if (event.kind == StreamEvent::Kind::Done || event.kind == StreamEvent::Kind::Error) {
            closed_ = true;
        }
        events_.push_back(std::move(event));
    }
    ready_.notify_all();
}

void GenerationStream::push_delta(std::string text, std::vector<runtime::Token> tokens) {
    StreamEvent event;
    event.kind = StreamEvent::Kind::Delta;
    event.text = std::move(text);
    event.tokens = std::move(tokens);
    push(std::move(event));
}

void GenerationStream::push_progress(const PromptProgress& progress) {
    StreamEvent event;
    event.kind = StreamEvent::Kind::Progress;
    event.progress = progress;
    push(std::move(event));
}

void GenerationStream::finish(const GenerationStats& stats, std::string reply) {
    StreamEvent event;
    event.kind = StreamEvent::Kind::Done;
    event.stats = stats;
    event.text = std::move(reply);
    push(std::move(event));
}

void GenerationStream::fail(int http_status, std::string type, std::string message) {
    StreamEvent event;
    event.kind = StreamEvent::Kind::Error;
    event.http_status = http_status;
    event.error_type = std::move(type);
    event.error_message = std::move(message);
    push(std::move(event));
}

std::optional<StreamEvent> GenerationStream::next(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })) {
        return std::nullopt;
    }
    StreamEvent event = std::move(events_.front());
    events_.pop_front();
    return event;
}

std::deque<StreamEvent> GenerationStream::take_all(std::chrono::milliseconds timeout) {
    std::deque<StreamEvent> out;
    std::unique_lock<std::mutex> lock(mutex_);
    if (ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })) {
        out.swap(events_);
    }
    return out;
}

void GenerationStream::expect_handoff() {
    std::lock_guard<std::mutex> lock(mutex_);
    handoff_expected_ = true;
}

void GenerationStream::handed_off() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (handed_off_) {
            return;
        }
        handed_off_ = true;
    }
    handoff_.notify_all();
}

void GenerationStream::await_handoff(std::chrono::microseconds limit) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!handoff_expected_) {
        return;
    }
    handoff_expected_ = false;  // once per stream
    handoff_.wait_for(lock, limit, [&] { return handed_off_ || cancelled(); });
}

bool GenerationStream::closed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return closed_;
}

}  // namespace skippy::server
