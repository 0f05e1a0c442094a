// Serving one generation request: its choices run one after the other on the scheduler, and
// their events are written in the request's dialect (ApiResponse), streamed as SSE or as one
// JSON body, while the handler thread watches for a client that went away.
#include <algorithm>
#include <chrono>
#include <deque>

#include "server/http/http_server_impl.h"

namespace skippy::server {

using nlohmann::json;

void HttpServer::Impl::send_api_error(httplib::Response& res, const ApiResponse& writer, int status,
                                      const std::string& type, const std::string& message) const {
    if (status == 503 || status == 429) {
        res.set_header("Retry-After", std::to_string(options.retry_after_seconds));
    }
    res.status = status;
    res.set_content(dump_json(writer.error_json(status, type, message, "", "")),
                    "application/json");
}

namespace {

// The generations of one request: its choices run one after the other.
struct ChoiceRun {
    std::shared_ptr<const ParsedRequest> parsed;
    std::shared_ptr<ApiResponse> writer;
    std::shared_ptr<AccessRecord> record;
    size_t choice = 0;
    std::shared_ptr<GenerationStream> stream;
    std::deque<StreamEvent> pending;
    bool started = false;  // streaming: stream_start() sent

    size_t choices() const { return static_cast<size_t>(std::max(parsed->n, 1)); }

    Admission submit(Scheduler& scheduler) {
        GenerationRequest gen = parsed->generation;
        if (choice > 0) {
            gen.render_turn_end = nullptr;  // the conversation continues with choice 0
            if (gen.sampling.seed != 0xFFFFFFFFu) {
                gen.sampling.seed += static_cast<uint32_t>(choice);
            }
        }
        writer->prepare_choice(choice, gen);
        stream = std::make_shared<GenerationStream>();
        if (parsed->stream) {
            stream->expect_handoff();
        }
        return scheduler.submit(std::move(gen), stream);
    }
};

}  // namespace

void HttpServer::Impl::serve(std::shared_ptr<const ParsedRequest> parsed,
                             std::shared_ptr<ApiResponse> writer, const httplib::Request& req,
                             httplib::Response& res) {
    auto run = std::make_shared<ChoiceRun>();
    run->parsed = parsed;
    run->writer = writer;
    run->record = AccessLog::shared_record(res);
    if (!parsed->notes.ignored_fields.empty()) {
        res.set_header("x-skippy-ignored-fields",
                       AccessLog::header_value(parsed->notes.ignored_fields));
    }
    if (!parsed->notes.dropped_tools.empty()) {
        res.set_header("x-skippy-dropped-tools",
                       AccessLog::header_value(parsed->notes.dropped_tools));
    }
    const auto admit = [&](ChoiceRun& r) {
        switch (r.submit(scheduler)) {
            case Admission::Accepted:
                return true;
            case Admission::QueueFull:
                res.set_header("Retry-After", std::to_string(options.retry_after_seconds));
                res.status = 429;
                res.set_content(dump_json(r.writer->error_json(
                                    429, "rate_limit_error",
                                    "Server is busy: the request queue is full, retry later", "",
                                    "queue_full")),
                                "application/json");
                r.record->error_code = "queue_full";
                return false;
            case Admission::Stopped:
                send_api_error(res, *r.writer, 503, "server_error", "Server is shutting down");
                return false;
        }
        return false;
    };
    if (!admit(*run)) {
        return;
    }
    if (!parsed->stream) {
        // Checked on a timer, not only when no event came: while tokens flow, the wait never
        // times out, and a client that left would keep its lane until max_tokens.
        auto next_check = std::chrono::steady_clock::now() + kDisconnectCheck;
        for (;;) {
            auto events = run->stream->take_all(kDisconnectCheck);
            if (events.empty() || std::chrono::steady_clock::now() >= next_check) {
                next_check = std::chrono::steady_clock::now() + kDisconnectCheck;
                if (req.is_connection_closed()) {
                    run->stream->cancel();
                    run->record->cancelled = true;
                    return;
                }
            }
            for (auto& event : events) {
                switch (event.kind) {
                    case StreamEvent::Kind::Delta:
                        writer->on_delta(run->choice, event);
                        break;
                    case StreamEvent::Kind::Progress:
                        break;  // (streamed responses only)
                    case StreamEvent::Kind::Error:
                        send_api_error(res, *writer, event.http_status, event.error_type,
                                       event.error_message);
                        return;
                    case StreamEvent::Kind::Done:
                        run->record->add(event.stats);
                        writer->on_done(run->choice, event.stats);
                        if (run->choice == 0) {
                            background.post_next_turn(*parsed, event.text);
                        }
                        if (++run->choice < run->choices()) {
                            if (!admit(*run)) {
                                return;
                            }
                            break;
                        }
                        res.set_content(writer->finish(), "application/json");
                        return;
                }
            }
        }
    }
    // Wait for the first event so that errors before any output keep their HTTP status.
    for (;;) {
        auto events = run->stream->take_all(kDisconnectCheck);
        if (events.empty()) {
            if (req.is_connection_closed()) {
                run->stream->cancel();
                run->record->cancelled = true;
                return;
            }
            continue;
        }
        const StreamEvent& first = events.front();
        if (first.kind == StreamEvent::Kind::Error) {
            send_api_error(res, *writer, first.http_status, first.error_type, first.error_message);
            return;
        }
        run->pending = std::move(events);
        break;
    }
    res.set_header("Cache-Control", "no-cache");
    run->record->streamed = true;  // logged when the stream ends (the releaser below)
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, run](size_t, httplib::DataSink& sink) {
            // Everything that is ready goes out in one write.
            std::string out;
            if (!run->started) {
                run->started = true;
                out += run->writer->stream_start();
            }
            for (;;) {
                if (run->pending.empty()) {
                    run->pending = run->stream->take_all(
                        out.empty() ? kDisconnectCheck : std::chrono::milliseconds(0));
                }
                if (run->pending.empty()) {
                    if (!out.empty()) {
                        if (!sink.write(out.data(), out.size())) {
                            run->stream->cancel();
                            return false;
                        }
                        run->stream->handed_off();
                        out.clear();
                        continue;
                    }
                    if (!sink.is_writable()) {
                        run->stream->cancel();
                        return false;
                    }
                    continue;
                }
                StreamEvent event = std::move(run->pending.front());
                run->pending.pop_front();
                if (event.kind == StreamEvent::Kind::Delta) {
                    out += run->writer->on_delta(run->choice, event);
                    continue;
                }
                if (event.kind == StreamEvent::Kind::Progress) {
                    out += run->writer->on_progress(run->choice, event);
                    continue;
                }
                if (event.kind == StreamEvent::Kind::Error) {
                    run->record->stream_error = event.error_type;
                    out += run->writer->stream_error(event.http_status, event.error_type,
                                                     event.error_message);
                } else {
                    run->record->add(event.stats);
                    out += run->writer->on_done(run->choice, event.stats);
                    if (run->choice == 0) {
                        background.post_next_turn(*run->parsed, event.text);
                    }
                    if (++run->choice < run->choices()) {
                        if (run->submit(scheduler) == Admission::Accepted) {
                            continue;
                        }
                        run->record->stream_error = "server_error";
                        out += run->writer->stream_error(503, "server_error",
                                                         "Server is busy: the next choice was "
                                                         "not admitted");
                    } else {
                        out += run->writer->finish();
                    }
                }
                if (!sink.write(out.data(), out.size())) {
                    run->stream->cancel();
                    return false;
                }
                sink.done();
                return true;
            }
        },
        [this, run](bool completed) {
            // Connection finished (normally or not): make sure the lane is freed.
            if (run->stream && !run->stream->closed()) {
                run->stream->cancel();
            }
            access_log.stream_finished(*run->record, completed);
        });
}

}  // namespace skippy::server
