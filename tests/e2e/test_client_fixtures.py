"""The requests the real agent CLIs send, replayed from fixtures (tests/e2e/fixtures/, captured
from Claude Code and Codex CLI by fixtures/capture.py): each is POSTed to its path as
captured (/v1/messages?beta=true, /v1/responses) with only the output cap lowered, and must
get a 200 with a well-formed stream. The server reports what it left out in response headers
(x-skippy-ignored-fields, x-skippy-dropped-tools): Codex sends a built-in `web_search` tool,
which must be named there. The replay runs in the clients' order on one lane, so it also
checks the cache across a session's tool loop (turn 2 restores turn 1's prompt) and across
sessions (session 2's first request restores session 1's)."""
import os
import sys
import unittest

import skippy_harness as h

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
import agent_wire as wire  # noqa: E402

# One lane holds the largest prompt (Claude Code's is ~12-13k tokens with this tokenizer).
FLAGS = ["--lanes", "1", "--ctx-size", "32768", "--alias", "test-llama-tools,*"]
MAX_TOKENS = 8
CACHED_FRACTION = 0.85


def replay(server, fixture):
    """POSTs the fixture's body (output cap lowered) with its headers; returns (status,
    response headers (lower-case names), SSE events or the error body)."""
    api = wire.CLIENTS[fixture["name"].split("/")[0]]
    body = wire.with_max_tokens(api, fixture["body"], MAX_TOKENS)
    headers = dict(wire.send_headers(fixture), **{"Content-Type": "application/json"})
    status, resp_headers, data = server.request(fixture["method"], fixture["path"], body,
                                                headers=headers, timeout=300)
    resp_headers = {k.lower(): v for k, v in resp_headers.items()}
    if status != 200:
        return status, resp_headers, data.decode(errors="replace")
    return status, resp_headers, wire.parse_sse(data)


class ClientFixtureTest:
    client = None

    def test_fixtures_replay(self):
        api = wire.CLIENTS[self.client]
        fixtures = wire.load(self.client)
        self.assertGreaterEqual(len(fixtures), 3, "fixtures missing: run fixtures/capture.py")
        failures, results = [], []
        with h.Server(h.model_path("llama-tools"), *FLAGS) as server:
            for fx in fixtures:
                status, headers, events = replay(server, fx)
                ignored = headers.get("x-skippy-ignored-fields")
                dropped = headers.get("x-skippy-dropped-tools")
                if status != 200:
                    failures.append(f"{fx['name']} {fx['path']}: HTTP {status}: {events}")
                    results.append(None)
                    continue
                problems = wire.stream_problems(api, events)
                if problems:
                    failures.append(f"{fx['name']}: malformed stream: {problems}")
                prompt, cached = wire.usage(api, events)
                print(f"{fx['name']}: 200, prompt {prompt} cached {cached}, stop "
                      f"{wire.stop_reason(api, events)}; ignored fields: {ignored}; dropped "
                      f"tools: {dropped}", flush=True)
                results.append((prompt, cached, headers))
                if prompt is None:
                    failures.append(f"{fx['name']}: no usage in the stream")
                if self.client == "codex":
                    if not dropped or "web_search" not in dropped:
                        failures.append(f"{fx['name']}: x-skippy-dropped-tools is {dropped!r}, "
                                        "it must name web_search")
                server.wait_settled()
        self.assertEqual(failures, [], "\n".join(failures))
        # 01 = session 1's second turn (tool result), 02 = session 2's first request: both
        # restore what the request before them prefilled.
        for i in (1, 2):
            prompt, cached, _ = results[i]
            self.assertGreaterEqual(cached, CACHED_FRACTION * prompt,
                                    f"{fixtures[i]['name']}: {cached} of {prompt} cached")


class ClaudeCodeFixtureTest(ClientFixtureTest, unittest.TestCase):
    client = "claude_code"


class CodexFixtureTest(ClientFixtureTest, unittest.TestCase):
    client = "codex"


if __name__ == "__main__":
    unittest.main(verbosity=2)
