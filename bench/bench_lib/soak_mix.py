"""One soak client: a thread that loops over a weighted mix of requests until told to stop
(multi-turn chats that continue their own history, tools, structured output, completions,
Anthropic Messages, Responses, cancels mid-prefill and mid-stream, bad inputs), recording
each one's outcome (see soak_client)."""
import json
import random
import threading
import traceback

from . import soak_client as sc
from .soak_client import SCHEMA, SYSTEM_PROMPTS, TENANTS, TOOLS, prose

# kind -> weight
MIX = {
    "chat": 26, "chat_fresh": 6, "long_prompt": 3, "tools": 7, "json_schema": 5,
    "completions": 6, "messages": 4, "responses": 4, "cancel_prefill": 4,
    "cancel_stream": 5, "bad_input": 10, "info": 3,
}
MAX_CONVERSATIONS = 3   # per client
MAX_TURNS = 12


class Client(threading.Thread):
    def __init__(self, index, port, model_id, seed, stop, recorder, timeout, lane_ctx):
        super().__init__(name=f"soak-client-{index}", daemon=True)
        self.index = index
        self.port = port
        self.model_id = model_id
        self.rng = random.Random(f"soak-{seed}-{index}")
        self.stop = stop
        self.rec = recorder
        self.timeout = timeout
        self.lane_ctx = lane_ctx
        self.conn = [None]
        self.conversations = []
        self.kinds = list(MIX)
        self.weights = [MIX[k] for k in self.kinds]

    def run(self):
        while not self.stop.is_set():
            kind = self.rng.choices(self.kinds, self.weights)[0]
            try:
                getattr(self, "do_" + kind)()
            except Exception:  # a harness bug: counted as a failure, visible in the report
                self.rec.add(kind, "harness_error", detail=traceback.format_exc())
            self.stop.wait(self.rng.uniform(0.0, 0.25))
        if self.conn[0] is not None:
            self.conn[0].close()

    # ---------------------------------------------------------------------------- helpers

    def post(self, path, body, stream=False):
        if stream and path in ("/v1/chat/completions", "/v1/completions"):
            body["stream_options"] = {"include_usage": True}
        if stream:
            body["stream"] = True
        return sc.http_request(self.conn, self.port, path, body, self.timeout, stream=stream)

    def finish(self, kind, res, stream=False, check=None):
        """Classifies a valid request's result; returns True when it succeeded."""
        detail = ""
        if res.error:
            outcome = ("timeout" if res.error == "timeout" else
                       "stream_error" if res.error.startswith("stream_error") else "conn_error")
            detail = res.error
        elif res.status in (429, 503):
            outcome = str(res.status)
            self.backoff(res)
        elif 200 <= res.status < 300:
            outcome = "ok"
            if stream and not res.done:
                outcome, detail = "stream_error", "no terminal event"
            elif not stream and check is not None:
                try:
                    good = check(res.body)
                except (KeyError, IndexError, TypeError, ValueError) as e:
                    good, detail = False, f"{type(e).__name__}: {e}"
                if not good:
                    outcome = "bad_body"
                    detail = (detail + " " + json.dumps(res.body)[:400]).strip()
        elif 400 <= res.status < 500:
            outcome, detail = f"unexpected_4xx:{res.status}", json.dumps(res.body)[:400]
        else:
            outcome, detail = f"5xx:{res.status}", json.dumps(res.body)[:400]
        self.rec.add(kind, outcome, res, detail)
        if outcome == "ok":
            self.rec.add_usage(res.usage if stream else (res.body or {}).get("usage"))
        return outcome == "ok"

    def backoff(self, res):
        try:
            wait = float(res.headers.get("retry-after", "1"))
        except ValueError:
            wait = 1.0
        self.stop.wait(min(wait, 3.0) * self.rng.uniform(0.5, 1.0))

    def sampling(self, body):
        body["temperature"] = self.rng.choice([0, 0, 0.7, 1.0])
        if self.rng.random() < 0.5:
            body["seed"] = self.rng.randrange(1 << 30)
        return body

    def user_text(self):
        if self.rng.random() < 0.15:
            return prose(self.rng, self.rng.randint(200, 500))
        return prose(self.rng, self.rng.randint(5, 40))

    # ------------------------------------------------------------------------- the kinds

    def do_chat(self):
        """A turn of one of this client's conversations (a new one now and then)."""
        if not self.conversations or (self.rng.random() < 0.2 and
                                      len(self.conversations) < MAX_CONVERSATIONS):
            self.conversations.append({
                "system": self.rng.randrange(len(SYSTEM_PROMPTS)),
                "tenant": self.rng.choice(TENANTS), "messages": []})
        conv = self.rng.choice(self.conversations)
        messages = conv["messages"] + [{"role": "user", "content": self.user_text()}]
        body = self.sampling({"messages": [{"role": "system",
                                            "content": SYSTEM_PROMPTS[conv["system"]]}] +
                              messages, "max_tokens": self.rng.randint(8, 32)})
        if conv["tenant"]:
            body["cache_salt"] = conv["tenant"]
        stream = self.rng.random() < 0.5
        res = self.post("/v1/chat/completions", body, stream)
        if not self.finish("chat", res, stream, check=lambda b: "content" in
                           b["choices"][0]["message"]):
            return
        reply = res.text if stream else res.body["choices"][0]["message"]["content"] or ""
        conv["messages"] = messages + [{"role": "assistant", "content": reply}]
        usage = (res.usage if stream else res.body.get("usage")) or {}
        if usage.get("prompt_tokens", 0) > 0.6 * self.lane_ctx or \
                len(conv["messages"]) >= 2 * MAX_TURNS:
            self.conversations.remove(conv)

    def do_chat_fresh(self):
        body = self.sampling({"messages": [
            {"role": "system", "content": self.rng.choice(SYSTEM_PROMPTS)},
            {"role": "user", "content": prose(self.rng, self.rng.randint(3, 30))}],
            "max_tokens": self.rng.randint(4, 24)})
        if self.rng.random() < 0.5:
            body["cache_salt"] = self.rng.choice(TENANTS[1:])
        stream = self.rng.random() < 0.5
        self.finish("chat_fresh", self.post("/v1/chat/completions", body, stream), stream,
                    check=lambda b: b["choices"][0]["finish_reason"] is not None)

    def do_long_prompt(self):
        """A cold prompt of ~1-2k tokens: nothing to hit, one large recording."""
        body = {"messages": [{"role": "user", "content": prose(self.rng,
                                                               self.rng.randint(800, 1600))}],
                "max_tokens": 4, "temperature": 0}
        self.finish("long_prompt", self.post("/v1/chat/completions", body),
                    check=lambda b: b["usage"]["prompt_tokens"] > 500)

    def do_tools(self):
        choice = self.rng.choice(["auto", "required", "none",
                                  {"type": "function", "function": {"name": "get_weather"}}])
        messages = [{"role": "system", "content": SYSTEM_PROMPTS[0]}]
        if self.rng.random() < 0.4:  # a history with an answered call
            call_id = f"call_{self.rng.randrange(1 << 30)}"
            messages += [
                {"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": call_id, "type": "function", "function": {
                        "name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}}]},
                {"role": "tool", "tool_call_id": call_id, "content": prose(self.rng, 30)}]
        messages.append({"role": "user", "content": prose(self.rng, self.rng.randint(3, 20))})
        body = self.sampling({"messages": messages, "tools": TOOLS, "tool_choice": choice,
                              "max_tokens": self.rng.randint(32, 80)})
        if self.rng.random() < 0.5:
            body["parallel_tool_calls"] = False
        if self.rng.random() < 0.5:
            body["cache_salt"] = self.rng.choice(TENANTS[1:])
        stream = self.rng.random() < 0.4

        def check(b):
            c = b["choices"][0]
            if isinstance(choice, dict) or choice == "required":
                # constrained from the first token: a call unless cut by max_tokens
                return c["finish_reason"] == "length" or bool(c["message"].get("tool_calls"))
            return "message" in c
        self.finish("tools", self.post("/v1/chat/completions", body, stream), stream, check)

    def do_json_schema(self):
        if self.rng.random() < 0.7:
            fmt = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA}}
        else:
            fmt = {"type": "json_object"}
        body = self.sampling({"messages": [
            {"role": "system", "content": SYSTEM_PROMPTS[1]},
            {"role": "user", "content": "Describe one item as JSON. " + prose(self.rng, 10)}],
            "response_format": fmt, "max_tokens": self.rng.randint(48, 96)})
        stream = self.rng.random() < 0.3

        def check(b):
            c = b["choices"][0]
            if c["finish_reason"] == "stop":  # complete: must be valid JSON
                json.loads(c["message"]["content"])
            return True
        self.finish("json_schema", self.post("/v1/chat/completions", body, stream), stream,
                    check)

    def do_completions(self):
        if self.rng.random() < 0.7:
            prompt = self.rng.choice(SYSTEM_PROMPTS) + " " + prose(self.rng,
                                                                   self.rng.randint(5, 60))
        else:
            prompt = [self.rng.randrange(100, 100000) for _ in range(self.rng.randint(8, 300))]
        body = self.sampling({"prompt": prompt, "max_tokens": self.rng.randint(4, 24)})
        if self.rng.random() < 0.3:
            body["logprobs"] = 2
        stream = self.rng.random() < 0.4
        self.finish("completions", self.post("/v1/completions", body, stream), stream,
                    check=lambda b: isinstance(b["choices"][0]["text"], str))

    def do_messages(self):
        body = {"model": self.model_id, "max_tokens": self.rng.randint(8, 32),
                "system": self.rng.choice(SYSTEM_PROMPTS),
                "messages": [{"role": "user", "content": prose(self.rng,
                                                               self.rng.randint(3, 30))}]}
        if self.rng.random() < 0.25:
            body["tools"] = [{"name": t["function"]["name"],
                              "input_schema": t["function"]["parameters"]} for t in TOOLS]
            body["tool_choice"] = {"type": "any"}
            body["max_tokens"] = 64
        stream = self.rng.random() < 0.4
        self.finish("messages", self.post("/v1/messages", body, stream), stream,
                    check=lambda b: b["type"] == "message" and isinstance(b["content"], list))

    def do_responses(self):
        text = prose(self.rng, self.rng.randint(3, 30))
        body = {"instructions": self.rng.choice(SYSTEM_PROMPTS),
                "input": text if self.rng.random() < 0.5 else [
                    {"type": "message", "role": "user", "content": text}],
                "max_output_tokens": self.rng.randint(8, 32),
                "temperature": self.rng.choice([0, 0.8])}
        if self.rng.random() < 0.5:
            body["cache_salt"] = self.rng.choice(TENANTS[1:])
        if self.rng.random() < 0.25:
            body["tools"] = [dict(t["function"], type="function") for t in TOOLS]
            body["tool_choice"] = "required"
            body["max_output_tokens"] = 64
        stream = self.rng.random() < 0.4
        self.finish("responses", self.post("/v1/responses", body, stream), stream,
                    check=lambda b: b["object"] == "response" and
                    isinstance(b["output"], list))

    def do_cancel_prefill(self):
        """A long unique prompt; the socket is closed before the first byte comes back."""
        stream = self.rng.random() < 0.5
        body = {"messages": [{"role": "system", "content": self.rng.choice(SYSTEM_PROMPTS)},
                             {"role": "user", "content": prose(self.rng,
                                                               self.rng.randint(600, 1400))}],
                "max_tokens": 16, "stream": stream}
        status, head, cancelled = sc.raw_exchange(
            self.port, sc.post_bytes("/v1/chat/completions", json.dumps(body).encode()),
            close_after_s=self.rng.uniform(0.02, 0.4), first_data=stream, timeout=self.timeout)
        self.raw_outcome("cancel_prefill", status, head, cancelled)

    def do_cancel_stream(self):
        """A streamed reply; the socket is closed after the first SSE chunk."""
        body = {"messages": [{"role": "system", "content": self.rng.choice(SYSTEM_PROMPTS)},
                             {"role": "user", "content": prose(self.rng, 20)}],
                "max_tokens": 200, "ignore_eos": True, "stream": True}
        if self.rng.random() < 0.5:
            body["cache_salt"] = self.rng.choice(TENANTS[1:])
        status, head, cancelled = sc.raw_exchange(
            self.port, sc.post_bytes("/v1/chat/completions", json.dumps(body).encode()),
            first_data=True, timeout=self.timeout)
        self.raw_outcome("cancel_stream", status, head, cancelled)

    def raw_outcome(self, kind, status, head, cancelled):
        if cancelled:
            outcome = "cancelled"
        elif status is None:
            outcome = "conn_error"
        elif status in (429, 503):
            outcome = str(status)
            self.stop.wait(self.rng.uniform(0.5, 1.5))
        elif 200 <= status < 300:
            outcome = "ok"  # answered before we closed
        elif 400 <= status < 500:
            outcome = f"unexpected_4xx:{status}"
        else:
            outcome = f"5xx:{status}"
        self.rec.add(kind, outcome, detail=head[:400].decode(errors="replace"))

    def do_bad_input(self):
        name, data = bad_input(self.rng, self.model_id)
        status, buf, _ = sc.raw_exchange(self.port, data, timeout=self.timeout)
        kind = "bad:" + name
        body = buf.partition(b"\r\n\r\n")[2]
        if status is None:
            outcome = "conn_error"
        elif status in (429, 503):
            outcome = str(status)
        elif 200 <= status < 300:
            outcome = "accepted_bad_input"
        elif 400 <= status < 500:
            try:
                err = json.loads(body)
                outcome = f"4xx:{status}" if "error" in err else "bad_error_body"
            except ValueError:
                outcome = "bad_error_body"
        else:
            outcome = f"5xx:{status}"
        self.rec.add(kind, outcome, detail=buf[:400].decode(errors="replace"))

    def do_info(self):
        what = self.rng.randrange(4)
        if what == 0:
            res = sc.http_request(self.conn, self.port, "/v1/models", None, self.timeout,
                                  method="GET")
            self.finish("info", res, check=lambda b: b["data"][0]["id"])
        elif what == 1:
            res = sc.http_request(self.conn, self.port, "/health", None, self.timeout,
                                  method="GET")
            self.finish("info", res, check=lambda b: b["status"] == "ok")
        elif what == 2:
            res = sc.http_request(self.conn, self.port, "/tokenize",
                                  {"content": prose(self.rng, 30)}, self.timeout)
            self.finish("info", res, check=lambda b: len(b["tokens"]) > 0)
        else:
            res = self.post("/v1/messages/count_tokens", {
                "model": self.model_id, "messages": [{"role": "user", "content": "hi"}]})
            self.finish("info", res, check=lambda b: b["input_tokens"] > 0)


def bad_input(rng, model_id):
    """(name, raw HTTP request bytes) of one request that must get a 4xx JSON error."""
    chat = "/v1/chat/completions"
    user = [{"role": "user", "content": "hello"}]

    def js(path, body):
        return sc.post_bytes(path, json.dumps(body).encode())
    wrong_type = rng.choice([{"messages": "hello"}, {"messages": user, "max_tokens": "ten"},
                             {"messages": user, "temperature": "hot"},
                             {"messages": user, "stream": "yes"},
                             {"messages": user, "stop": 5},
                             {"messages": [{"role": "user", "content": 42}]}])
    garbage = bytes(b for b in rng.randbytes(120) if b not in (10, 13))
    cases = {
        "malformed_json": lambda: sc.post_bytes(chat, b'{"messages": [{"role": "user", "con'),
        "not_an_object": lambda: sc.post_bytes(chat, b"[1, 2, 3]"),
        "wrong_type": lambda: js(chat, wrong_type),
        "unknown_model": lambda: js(chat, {"model": "no-such-model", "messages": user}),
        "missing_tool": lambda: js(chat, {"messages": user, "tools": TOOLS, "tool_choice": {
            "type": "function", "function": {"name": "delete_everything"}}}),
        "huge_max_tokens": lambda: js(chat, {"messages": user, "max_tokens": 10 ** 9}),
        "context_overflow": lambda: js(chat, {"messages": [
            {"role": "user", "content": prose(rng, 6000)}], "max_tokens": 8}),
        "garbage_body": lambda: sc.post_bytes(chat, rng.randbytes(200)),
        "garbage_request": lambda: garbage + b"\r\n\r\n",
        "unsupported_field": lambda: js(chat, {"messages": user, "functions": [
            {"name": "f", "parameters": {"type": "object"}}]}),
        "invalid_utf8": lambda: sc.post_bytes(
            chat, b'{"messages": [{"role": "user", "content": "\xff\xfe\xfd"}]}'),
        "bad_token_ids": lambda: js("/v1/completions", {"prompt": [10 ** 9, -5],
                                                        "max_tokens": 4}),
        "wrong_content_type": lambda: sc.post_bytes(chat, json.dumps({"messages": user})
                                                    .encode(), b"text/plain"),
        "empty_messages": lambda: js(chat, {"messages": []}),
        "unsupported_schema": lambda: js(chat, {"messages": user, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": {
                "oneOf": [{"type": "string"}, {"type": "integer"}]}}}}),
        "previous_response_id": lambda: js("/v1/responses", {
            "input": "hi", "previous_response_id": "resp_123"}),
        "anthropic_no_max_tokens": lambda: js("/v1/messages", {"model": model_id,
                                                               "messages": user}),
        "absurd_sampling": lambda: js(chat, rng.choice([
            {"messages": user, "temperature": -3}, {"messages": user, "n": 1000},
            {"messages": user, "top_p": 7}])),
        "unknown_endpoint": lambda: js("/v1/nope", {"messages": user}),
        # Declared larger than --max-body-bytes: answered 413 before the body is sent.
        "oversize_body": lambda: (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                  b"Content-Type: application/json\r\nContent-Length: "
                                  b"67108864\r\nConnection: close\r\n\r\n"),
    }
    name = rng.choice(sorted(cases))
    return name, cases[name]()
