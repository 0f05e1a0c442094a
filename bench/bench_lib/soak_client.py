"""The soak's clients: a weighted mix of requests against one skippy server, each classified
by outcome. Python stdlib only (http.client for ordinary requests, raw sockets for cancels
and malformed HTTP).

Outcomes: "ok" (2xx, complete), "4xx:CODE" (a bad input answered as it should be), "429",
"503", "cancelled" (we closed the connection on purpose). Everything else is a failure:
"5xx:CODE", "conn_error", "timeout", "stream_error", "bad_body" (a 2xx that is not what the
endpoint promises), "accepted_bad_input" (a bad input answered 2xx: silently ignored),
"unexpected_4xx:CODE" (a valid request refused), "bad_error_body" (a 4xx without a JSON error
body).
"""
import http.client
import json
import random
import socket
import threading
import time

from . import stats

HOST = "127.0.0.1"
OK_OUTCOMES = ("ok", "429", "503", "cancelled")


def is_failure(outcome):
    return not (outcome in OK_OUTCOMES or outcome.startswith("4xx:"))


# --------------------------------------------------------------------------------------------
# Prompt text

_WORDS = (
    "the of and to in is that for it as with was on be by this are or from at an not have "
    "which but all can has more one will their also other been its new first these time two "
    "may would when only any such after most over into some could than where used many "
    "system model cache prefix token request server latency context agent tool result value "
    "file path error state memory thread queue batch decode prompt session record lookup "
    "restore entry block layer weight buffer number string list index test build config "
    "option default return output input should must check update create simple exact shared "
    "longer shorter before again every next last small large river mountain city weather"
).split()


def prose(rng, words):
    out = []
    while len(out) < words:
        n = rng.randint(6, 16)
        sentence = [rng.choice(_WORDS) for _ in range(n)]
        sentence[0] = sentence[0].capitalize()
        out.extend(sentence[:-1] + [sentence[-1] + "."])
    return " ".join(out[:words])


# Shared system prompts (every client uses the same three, so they are hit across clients
# and tenants keep them apart): roughly 250, 700 and 1400 tokens.
SYSTEM_PROMPTS = [prose(random.Random(f"soak-system-{i}"), n)
                  for i, n in enumerate((220, 620, 1250))]
TENANTS = [None, "tenant-a", "tenant-b", "tenant-c"]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]}},
            "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the documents.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "maxLength": 24}},
            "required": ["query"], "additionalProperties": False}}},
]
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "count": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]},
             "maxItems": 3}},
    "required": ["name", "count"], "additionalProperties": False}


# --------------------------------------------------------------------------------------------
# HTTP


class Result:
    __slots__ = ("status", "body", "events", "ttft_ms", "e2e_ms", "error", "done", "headers",
                 "text", "usage")

    def __init__(self):
        self.status = None
        self.body = None      # parsed JSON (non-streamed), or raw bytes if not JSON
        self.events = 0       # SSE data lines
        self.ttft_ms = None   # first SSE data line
        self.e2e_ms = None
        self.error = None     # "conn_error: ...", "timeout", "stream_error: ..."
        self.done = False     # a streamed response reached its terminal event
        self.headers = {}
        self.text = ""        # streamed chat / completions text
        self.usage = None     # streamed usage


STREAM_END_EVENTS = ("message_stop", "response.completed", "response.incomplete")
STREAM_ERROR_EVENTS = ("error", "response.failed")


def http_request(conn_box, port, path, body, timeout, stream=False, headers=None,
                 method="POST"):
    """One request. `conn_box` is a one-element list holding the client's keep-alive
    connection (reused for non-streamed requests; a request that fails on a reused
    connection before any answer is retried once on a fresh one, as HTTP clients do)."""
    res = Result()
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json"}
    hdrs.update(headers or {})
    start = time.perf_counter()
    for attempt in (0, 1):
        reused = conn_box[0] is not None and not stream
        if stream or conn_box[0] is None:
            conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
        else:
            conn = conn_box[0]
        try:
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
        except (ConnectionError, http.client.RemoteDisconnected, BrokenPipeError) as e:
            conn.close()
            conn_box[0] = None
            if reused and attempt == 0:
                continue
            res.error = f"conn_error: {type(e).__name__}: {e}"
            return res
        except socket.timeout:
            conn.close()
            conn_box[0] = None
            res.error = "timeout"
            return res
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            conn_box[0] = None
            res.error = f"conn_error: {type(e).__name__}: {e}"
            return res
        break
    res.status = resp.status
    res.headers = {k.lower(): v for k, v in resp.getheaders()}
    try:
        if stream and resp.status == 200:
            _read_stream(resp, res, start, timeout)
        else:
            raw = resp.read()
            try:
                res.body = json.loads(raw) if raw else None
            except ValueError:
                res.body = raw
    except socket.timeout:
        res.error = "timeout"
    except (OSError, http.client.HTTPException, ValueError) as e:
        res.error = f"conn_error: {type(e).__name__}: {e}"
    res.e2e_ms = (time.perf_counter() - start) * 1000.0
    if stream or res.error or resp.will_close:
        conn.close()
        conn_box[0] = None
    else:
        conn_box[0] = conn
    return res


def _read_stream(resp, res, start, timeout):
    deadline = start + timeout
    event = None
    while True:
        if time.perf_counter() > deadline:
            res.error = "timeout"
            return
        line = resp.readline()
        if not line:
            if not res.done:
                res.error = "stream_error: ended without its terminal event"
            return
        line = line.strip()
        if line.startswith(b"event:"):
            event = line[6:].strip().decode(errors="replace")
            if event in STREAM_END_EVENTS:
                res.done = True
            continue
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        res.events += 1
        if res.ttft_ms is None:
            res.ttft_ms = (time.perf_counter() - start) * 1000.0
        if payload == b"[DONE]":
            res.done = True
            continue
        chunk = json.loads(payload)
        if event in STREAM_ERROR_EVENTS or (isinstance(chunk, dict) and "error" in chunk
                                            and event is None):
            res.error = "stream_error: " + json.dumps(chunk)[:300]
            return
        if isinstance(chunk, dict):
            for choice in chunk.get("choices") or []:
                piece = choice.get("text")
                if piece is None:
                    piece = (choice.get("delta") or {}).get("content")
                res.text += piece or ""
            if chunk.get("usage"):
                res.usage = chunk["usage"]
        if res.done and event in STREAM_END_EVENTS:
            return


def raw_exchange(port, data, close_after_s=None, first_data=False, timeout=30.0):
    """Sends raw bytes. close_after_s: close the socket after that many seconds if nothing
    came back (a cancel before the first byte). first_data: read until the first SSE data
    line, then close (a cancel mid-stream). Returns (status or None, head bytes, cancelled)."""
    sock = socket.create_connection((HOST, port), timeout=timeout)
    buf = b""
    try:
        sock.sendall(data)
        sock.settimeout(close_after_s if close_after_s is not None else timeout)
        while True:
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                return None, buf, close_after_s is not None
            if not chunk:
                break
            buf += chunk
            if first_data:
                head, sep, rest = buf.partition(b"\r\n\r\n")
                if sep and not head.startswith(b"HTTP/1.1 200"):
                    if len(rest) >= _content_length(head):
                        break
                elif sep and b"data:" in rest:
                    return 200, buf, True
            elif b"\r\n\r\n" in buf and len(buf.partition(b"\r\n\r\n")[2]) >= \
                    _content_length(buf.partition(b"\r\n\r\n")[0]):
                break
    except (ConnectionError, BrokenPipeError):
        pass  # the server may close as soon as it has answered (e.g. 413 mid-body)
    finally:
        sock.close()
    status = None
    if buf.startswith(b"HTTP/1."):
        try:
            status = int(buf.split(b" ", 2)[1])
        except (IndexError, ValueError):
            pass
    return status, buf, False


def _content_length(head):
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            try:
                return int(value.strip())
            except ValueError:
                return 0
    return 0


def post_bytes(path, body, content_type=b"application/json"):
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: " +
            content_type + b"\r\nContent-Length: " + str(len(body)).encode() +
            b"\r\nConnection: close\r\n\r\n" + body)


# --------------------------------------------------------------------------------------------
# Recording


class Recorder:
    """Outcome counts per request kind, latencies, and failure samples; thread-safe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}       # kind -> outcome -> n
        self.latency = {}      # kind -> [e2e ms of ok requests]
        self.ttft = {}         # kind -> [first SSE data ms of ok streamed requests]
        self.totals = {"ok": 0, "rejected": 0, "bad_input": 0, "cancelled": 0, "failed": 0}
        self.failures = []     # the first failures, with details
        self.cached_tokens = 0
        self.prompt_tokens = 0

    def add(self, kind, outcome, res=None, detail=None):
        with self.lock:
            by = self.counts.setdefault(kind, {})
            by[outcome] = by.get(outcome, 0) + 1
            if outcome == "ok":
                self.totals["ok"] += 1
                if res is not None and res.e2e_ms is not None:
                    self.latency.setdefault(kind, []).append(res.e2e_ms)
                if res is not None and res.ttft_ms is not None:
                    self.ttft.setdefault(kind, []).append(res.ttft_ms)
            elif outcome in ("429", "503"):
                self.totals["rejected"] += 1
            elif outcome.startswith("4xx:"):
                self.totals["bad_input"] += 1
            elif outcome == "cancelled":
                self.totals["cancelled"] += 1
            else:
                self.totals["failed"] += 1
                if len(self.failures) < 50:
                    self.failures.append({"t": time.time(), "kind": kind, "outcome": outcome,
                                          "detail": (detail or "")[:600]})

    def add_usage(self, usage):
        if not isinstance(usage, dict):
            return
        details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
        with self.lock:
            self.prompt_tokens += usage.get("prompt_tokens") or usage.get("input_tokens") or 0
            self.cached_tokens += (details.get("cached_tokens") or
                                   usage.get("cache_read_input_tokens") or 0)

    def snapshot(self):
        with self.lock:
            return dict(self.totals)

    def summary(self):
        with self.lock:
            kinds = {}
            for kind, by in sorted(self.counts.items()):
                lat = self.latency.get(kind, [])
                ttft = self.ttft.get(kind, [])
                kinds[kind] = {
                    "outcomes": dict(sorted(by.items())), "requests": sum(by.values()),
                    "e2e_ms": {f"p{q}": stats.percentile(lat, q) for q in (50, 90, 99)},
                    "ttft_ms": {f"p{q}": stats.percentile(ttft, q) for q in (50, 90, 99)}}
            outcomes = {}
            for by in self.counts.values():
                for outcome, n in by.items():
                    outcomes[outcome] = outcomes.get(outcome, 0) + n
            return {"totals": dict(self.totals), "outcomes": dict(sorted(outcomes.items())),
                    "kinds": kinds, "failures": list(self.failures),
                    "usage": {"prompt_tokens": self.prompt_tokens,
                              "cached_tokens": self.cached_tokens}}
