"""deploy/: HAProxy in front of skippy replicas, started and stopped by deploy/replicas.

- Routing: requests with the same prompt_cache_key, or the same session header (X-Session-Id,
  Claude Code's X-Claude-Code-Session-Id, Codex's session-id), land on the same replica;
  different keys spread over the replicas; a request with no key still routes.
- The point of it: on a multi-session workload the token-weighted hit rate of turns >= 2
  through the key-hashing balancer beats round-robin (no shared tier in either, so only
  the replicas' local caches can hit).
- With the shared Redis tier (deploy/replicas' default), round-robin hits too: turns that
  land on another replica are served from what another replica wrote.
- `down` stops every process it started.
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import skippy_harness as h

HERE = os.path.dirname(os.path.abspath(__file__))
REPLICAS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "deploy", "replicas")
N = 3
SESSIONS = 4  # coprime with N: round-robin moves a session to another replica every turn
TURNS = 3


def free_base_port(n):
    """A port p with p..p+n free on 127.0.0.1."""
    import socket
    for _ in range(50):
        base = random.randint(20000, 60000)
        ok = True
        for p in range(base, base + n + 1):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port range")


class Deployment:
    def __init__(self, routing, redis, model):
        self.run = tempfile.mkdtemp(prefix="skippy-deploy-")
        self.port = free_base_port(N)
        args = [sys.executable, REPLICAS, "up", "--run-dir", self.run, "--replicas", str(N),
                "--port", str(self.port), "--model", model, "--threads", h.THREADS,
                "--routing", routing, "--start-timeout", "120"]
        if not redis:
            args.append("--no-redis")
        else:
            # ctest runs other tests beside this one on 2 cores: a command may take longer
            # than the 100 ms default without Redis being down.
            args += ["--", "--cache-redis-timeout-ms", "2000"]
        env = dict(os.environ, SKIPPY_BIN=h.SKIPPY)
        r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise AssertionError(f"replicas up failed: {r.stdout}{r.stderr}")
        self.state = json.load(open(os.path.join(self.run, "state.json")))
        self.base = f"http://127.0.0.1:{self.port}"

    def chat(self, body, headers=None):
        req = urllib.request.Request(self.base + "/v1/chat/completions",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})})
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.headers.get("X-Served-By"), json.loads(resp.read())

    def metrics(self, port):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            out = {}
            for line in r.read().decode().splitlines():
                if line and not line.startswith("#"):
                    name, _, value = line.rpartition(" ")
                    out[name] = float(value)
            return out

    def settle(self, timeout=60):
        """Every replica idle, its records in and its Redis writes sent: what a turn on
        another replica can find is there (records and writes are asynchronous)."""
        names = ("skippy_lanes_busy", "skippy_turn_ends_deferred", "skippy_cache_lanes_pending",
                 "skippy_cache_record_queue_pending", "skippy_cache_redis_write_queue_depth")
        deadline = time.time() + timeout
        for r in self.state["replicas"]:
            while True:
                m = self.metrics(r["port"])
                if all(m.get(n, 0) == 0 for n in names):
                    break
                if time.time() > deadline:
                    raise AssertionError(f"replica {r['name']} did not settle: {m}")
                time.sleep(0.05)

    def down(self):
        r = subprocess.run([sys.executable, REPLICAS, "down", "--run-dir", self.run],
                           capture_output=True, text=True, timeout=120)
        pids = [p["pid"] for p in self.state["replicas"]] + [self.state["haproxy"]["pid"]]
        if "redis" in self.state:
            pids.append(self.state["redis"]["pid"])
        for pid in pids:
            try:
                os.kill(pid, 0)
                raise AssertionError(f"pid {pid} still alive after `replicas down`")
            except ProcessLookupError:
                pass
        assert r.returncode == 0, r.stdout + r.stderr
        shutil.rmtree(self.run, ignore_errors=True)


def session_messages(s, turn, replies):
    """Session s's conversation up to `turn` (0-based): a distinct ~300-token system prompt
    (no prefix shared across sessions), user turns and the replies the server gave."""
    words = " ".join(f"s{s}w{i}" for i in range(120))
    msgs = [{"role": "system", "content": f"Session {s} notes: {words}"}]
    for t in range(turn + 1):
        msgs.append({"role": "user", "content": f"Turn {t} of session {s}: " +
                     " ".join(f"q{s}_{t}_{i}" for i in range(40))})
        if t < turn:
            msgs.append({"role": "assistant", "content": replies[(s, t)]})
    return msgs


def run_sessions(dep, key_of, settle=False):
    """SESSIONS conversations, TURNS turns each, interleaved turn by turn (with `settle`,
    every replica's records and Redis writes done before each request). Returns
    (cached tokens, prompt tokens) summed over turns >= 2, and who served each request."""
    replies, cached, prompt, served = {}, 0, 0, {}
    for t in range(TURNS):
        for s in range(SESSIONS):
            if settle:
                dep.settle()
            body = {"messages": session_messages(s, t, replies), "max_tokens": 8,
                    "temperature": 0}
            body.update(key_of(s))
            who, out = dep.chat(body)
            replies[(s, t)] = out["choices"][0]["message"]["content"] or "ok"
            served.setdefault(s, []).append(who)
            if t > 0:
                u = out["usage"]
                cached += u.get("prompt_tokens_details", {}).get("cached_tokens", 0)
                prompt += u["prompt_tokens"]
    return cached, prompt, served


def test_routing(model):
    dep = Deployment("key", redis=False, model=model)
    try:
        # Same prompt_cache_key -> same replica; many keys spread out.
        msgs = [{"role": "user", "content": "hello"}]
        for key in ("alpha", "beta"):
            who = {dep.chat({"messages": msgs, "max_tokens": 1, "prompt_cache_key": key})[0]
                   for _ in range(4)}
            assert len(who) == 1, (key, who)
        spread = {dep.chat({"messages": msgs, "max_tokens": 1,
                            "prompt_cache_key": f"k{i}"})[0] for i in range(16)}
        assert len(spread) >= 2, spread
        # Session headers, each client's own.
        for header in ("X-Session-Id", "X-Claude-Code-Session-Id", "session-id"):
            who = {dep.chat({"messages": msgs, "max_tokens": 1}, {header: "sess-42"})[0]
                   for _ in range(3)}
            assert len(who) == 1, (header, who)
        # No key: least connections, still answered.
        who, out = dep.chat({"messages": msgs, "max_tokens": 1})
        assert who and out["choices"]
    finally:
        dep.down()
    print("routing: ok")


def hit_rate(routing, redis, model):
    dep = Deployment(routing, redis=redis, model=model)
    try:
        cached, prompt, served = run_sessions(
            dep, lambda s: {"prompt_cache_key": f"session-{s}"}, settle=redis)
    finally:
        dep.down()
    moved = sum(len(set(v)) > 1 for v in served.values())
    print(f"{routing:10} redis={redis!s:5} hit rate turns>=2: {cached}/{prompt} = "
          f"{cached / prompt:.3f}; sessions that changed replica: {moved}/{SESSIONS}")
    return cached / prompt, moved


def main():
    if not shutil.which("haproxy"):
        print("SKIP: haproxy not installed (scripts/setup installs it)")
        return
    model = h.model_path("llama")
    test_routing(model)
    keyed, keyed_moved = hit_rate("key", False, model)
    rr, rr_moved = hit_rate("roundrobin", False, model)
    assert keyed_moved == 0, "key routing moved a session to another replica"
    assert rr_moved == SESSIONS, "round-robin kept a session on one replica"
    assert keyed > rr, (keyed, rr)
    assert keyed > 0.5, keyed
    # The shared tier: round-robin moves every session, yet turns hit what another wrote.
    shared, _ = hit_rate("roundrobin", True, model)
    assert shared > 0.5, ("the shared tier did not serve the moved turns", shared, rr)
    print("deploy: ok")


if __name__ == "__main__":
    main()
