"""The workloads (their runner, which measures each on alternating servers (ABBA...), is
runner.py).

A workload builds its prompts once (deterministically), then `run_once` is called on a fresh
server for every (round, variant): round 0 skippy, round 0 llama-server, round 1 skippy, ...
Each run returns request records: dicts with the client-side timings and what the server
reported (see servers.Timed), plus a stable `key` that names the same prompt on every server
(used by the output check) and a `group` the summary aggregates over.
"""
import dataclasses
import random
import threading
import time

from . import config, prompts, servers, stats
from .servers import Variant


class Deadline:
    def __init__(self, seconds):
        self.end = time.monotonic() + seconds

    def remaining(self):
        return self.end - time.monotonic()

    def expired(self):
        return self.remaining() <= 0


class Client:
    """Greedy streaming requests against one server; identical bodies for both servers."""

    def __init__(self, port, request_timeout, deadline, native=False, ignore_eos=False,
                 gate=None):
        self.port = port
        self.request_timeout = request_timeout
        self.deadline = deadline
        self.native = native  # llama-server's /completion instead of the OpenAI endpoints
        self.ignore_eos = ignore_eos
        self.gate = gate  # (lockstep.Lockstep, label) in a paced run: every request takes turns

    def _send(self, path, body):
        if self.gate is None:
            return servers.stream_request(self.port, path, body, self._timeout())
        steps, label = self.gate
        return steps.request(
            label, lambda: servers.stream_request(self.port, path, body, self._timeout()))

    def _timeout(self):
        # Never wait far past the run's deadline, but always give a started request a chance.
        return max(5.0, min(self.request_timeout, self.deadline.remaining() + 30.0))

    def _body(self, max_tokens, **prompt):
        body = {"temperature": 0.0, "seed": 1234, "cache_prompt": True}
        if self.ignore_eos:
            body["ignore_eos"] = True
        body["n_predict" if self.native else "max_tokens"] = max_tokens
        body.update(prompt)
        return body

    def completion(self, prompt_ids, max_tokens):
        path = "/completion" if self.native else "/v1/completions"
        body = self._body(max_tokens, prompt=list(prompt_ids))
        return self._send(path, body)

    def chat(self, messages, max_tokens):
        if self.native:  # the harness renders the model's ChatML template (same tokens)
            body = self._body(max_tokens, prompt=prompts.render_chatml(messages))
            return self._send("/completion", body)
        body = self._body(max_tokens, messages=messages)
        return self._send("/v1/chat/completions", body)


def record(timed, **fields):
    out = dataclasses.asdict(timed)
    out.update(fields)
    return out


def skippy_and_llama(lanes):
    return [Variant("skippy", "skippy", lanes), Variant("llama-server", "llama", lanes)]


def summarize_groups(runs, group_key=lambda r: r["group"]):
    """{variant: {group: summary}} over all rounds."""
    out = {}
    for run in runs:
        for r in run["records"]:
            out.setdefault(run["variant"], {}).setdefault(str(group_key(r)), []).append(r)
    return {v: {g: stats.summarize(rs) for g, rs in groups.items()} for v, groups in out.items()}


def add_ratios(summary, num="skippy", den="llama-server",
               fields=("ttft_p50_ms", "ttft_p90_ms", "e2e_p50_ms", "e2e_p90_ms")):
    """{group: {field: num/den}} for the groups both variants have."""
    a, b = summary.get(num, {}), summary.get(den, {})
    return {g: {f: stats.ratio(a[g].get(f), b[g].get(f)) for f in fields}
            for g in a if g in b}


# --------------------------------------------------------------------------------------------


class Workload:
    """ctx_size is the KV cells of one lane: servers are started with lanes x ctx_size."""
    name = ""
    title = ""
    concurrent_decode = False  # requests generate at once (runner.compare_outputs)

    def __init__(self, cfg, ctx_size):
        self.cfg = cfg
        self.ctx_size = ctx_size
        self.material = {}

    def server_ctx(self, variant):
        return variant.lanes * self.ctx_size

    def build(self, texts):
        """Builds text material (texts: prompts.TextFactory). Token-id workloads need none."""

    def variants(self):
        return skippy_and_llama(1)

    # Whether run_once sends one request at a time through client (a paced run can then
    # run the variants side by side, their requests taking turns: measure()).
    paced = False

    def paceable(self):
        return self.paced

    def run_once(self, client, deadline):
        """Returns (records, extra dict)."""
        raise NotImplementedError

    def summarize(self, runs):
        summary = summarize_groups(runs)
        return {"by_group": summary, "ratios": add_ratios(summary),
                "headline": headline(runs)}


def headline(runs, keep=lambda r: True):
    """{variant: summary} over the records that make a workload's headline number."""
    by_variant = {}
    for run in runs:
        by_variant.setdefault(run["variant"], []).extend(r for r in run["records"] if keep(r))
    return {v: stats.summarize(rs) for v, rs in by_variant.items()}


class FamilyTable(Workload):
    """Shared prefix of P tokens + 1 new token, 1 generated token. The first request per
    prefix is cold; the next `reps` change only the last token (warm hits)."""
    paced = True
    name = "family"
    title = "Family table: warm prefix hit, 1 new token, 1 generated token"

    def __init__(self, cfg, ctx_size):
        super().__init__(cfg, ctx_size)
        self.prefixes = {p: prompts.token_prompt(f"family-{p}", p)
                         for p in cfg["prefixes"] if p + 8 < ctx_size}

    def run_once(self, client, deadline):
        records = []
        for p, prefix in self.prefixes.items():
            for i in range(self.cfg["reps"] + 1):
                if deadline.expired():
                    return records, {"truncated": True}
                phase = "cold" if i == 0 else "warm"
                r = client.completion(prefix + [prompts.token_at(p, i)], 1)
                records.append(record(r, key=f"P{p}-{i}", group=f"{p}/{phase}", prefix=p,
                                      phase=phase))
        return records, {}

    def summarize(self, runs):
        summary = summarize_groups(runs)
        return {"by_group": summary, "ratios": add_ratios(summary),
                "prefixes": list(self.prefixes)}


class MultiTurnChat(Workload):
    """`conversations` chats of `turns` turns each, interleaved (turn 1 of every chat, then
    turn 2, ...), all sharing one system prompt. The assistant turn sent back is scripted
    (identical prompts on every server) or, with replies=generated, the server's reply."""
    paced = True
    name = "chat"
    title = "Multi-turn chat: interleaved conversations sharing a system prompt"

    def build(self, texts):
        c = self.cfg
        rng = random.Random("chat")
        self.material = {
            "system": texts.text("chat-system", c["system_tokens"]),
            "users": {(i, t): texts.text(f"chat-user-{i}-{t}", rng.randint(*c["user_tokens"]))
                      for i in range(c["conversations"]) for t in range(c["turns"])},
            "replies": {(i, t): texts.text(f"chat-reply-{i}-{t}", 2 * c["max_tokens"])
                        for i in range(c["conversations"]) for t in range(c["turns"])},
        }

    def variants(self):
        return skippy_and_llama(self.cfg["lanes"])

    def run_once(self, client, deadline):
        c, m = self.cfg, self.material
        histories = [[{"role": "system", "content": m["system"]}]
                     for _ in range(c["conversations"])]
        records = []
        for t in range(c["turns"]):
            for i in range(c["conversations"]):
                if deadline.expired():
                    return records, {"truncated": True}
                messages = histories[i] + [{"role": "user", "content": m["users"][(i, t)]}]
                r = client.chat(messages, c["max_tokens"])
                records.append(record(r, key=f"c{i}-t{t + 1}", group=t + 1, conv=i, turn=t + 1))
                reply = r.text if c["replies"] == "generated" else m["replies"][(i, t)]
                histories[i] = messages + [{"role": "assistant", "content": reply}]
        return records, {}


class MultiSession(Workload):
    """More conversations than lanes: `conversations` chats of `turns` turns on `lanes` lanes
    (--parallel), all sharing one system prompt, interleaved round-robin (conversation c's
    turn t+1 is sent after every conversation's turn t), sent by `clients` concurrent
    clients in that order. A lane can hold only a few conversations, so from turn 2 on the
    history must come back from the server's cache (skippy's prefix cache, llama-server's
    host-RAM prompt cache) or be prefilled again. Headline: median TTFT over turns >= 2."""
    paced = True
    name = "multisession"
    title = "Multi-session: more conversations than lanes, round-robin"

    def build(self, texts):
        c = self.cfg
        rng = random.Random("multisession")
        self.material = {
            "system": texts.text("ms-system", c["system_tokens"]),
            "users": {(i, t): texts.text(f"ms-user-{i}-{t}", rng.randint(*c["user_tokens"]))
                      for i in range(c["conversations"]) for t in range(c["turns"])},
            "replies": {(i, t): texts.text(f"ms-reply-{i}-{t}", 2 * c["max_tokens"])
                        for i in range(c["conversations"]) for t in range(c["turns"])},
        }

    def paceable(self):  # one client: one request at a time
        return max(1, self.cfg.get("clients", self.cfg["lanes"])) == 1

    def variants(self):
        return skippy_and_llama(self.cfg["lanes"])

    def run_once(self, client, deadline):
        c, m = self.cfg, self.material
        n_conv = c["conversations"]
        histories = [[{"role": "system", "content": m["system"]}] for _ in range(n_conv)]
        order = [(i, t) for t in range(c["turns"]) for i in range(n_conv)]
        done = {key: threading.Event() for key in order}
        lock = threading.Lock()
        state = {"next": 0, "truncated": False}
        records = []

        def worker():
            while True:
                with lock:
                    if state["next"] >= len(order):
                        return
                    i, t = order[state["next"]]
                    state["next"] += 1
                if t > 0:  # the previous turn of this conversation (long done, normally)
                    done[(i, t - 1)].wait(max(1.0, deadline.remaining() + 30.0))
                if deadline.expired():
                    state["truncated"] = True
                    return
                with lock:
                    messages = histories[i] + [{"role": "user", "content": m["users"][(i, t)]}]
                r = client.chat(messages, c["max_tokens"])
                reply = r.text if c["replies"] == "generated" else m["replies"][(i, t)]
                with lock:
                    histories[i] = messages + [{"role": "assistant", "content": reply}]
                    records.append(record(r, key=f"c{i}-t{t + 1}", group=t + 1, conv=i,
                                          turn=t + 1))
                done[(i, t)].set()

        threads = [threading.Thread(target=worker, daemon=True)
                   for _ in range(max(1, c.get("clients", c["lanes"])))]
        start = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join(max(1.0, deadline.remaining() + client.request_timeout))
        extra = {"wall_s": time.perf_counter() - start,
                 "truncated": state["truncated"] or any(th.is_alive() for th in threads)
                 or len(records) < len(order)}
        records.sort(key=lambda r: (r["turn"], r["conv"]))
        return records, extra

    def summarize(self, runs):
        summary = summarize_groups(runs)
        return {"by_group": summary, "ratios": add_ratios(summary),
                "headline": headline(runs, lambda r: r["turn"] >= 2),
                "headline_note": "turns >= 2"}


class AgentLoop(Workload):
    """One growing context: each turn sends the history, then appends the assistant's tool
    call (scripted, or the server's reply with replies=generated) and a 200-500 token tool
    result, until `max_context` tokens."""
    paced = True
    name = "agent"
    title = "Agent loop: one growing context, tool results appended every turn"

    def build(self, texts):
        c = self.cfg
        rng = random.Random("agent")
        sizes = [rng.randint(*c["append_tokens"]) for _ in range(c["max_turns"])]
        self.material = {
            "system": texts.text("agent-system", c["system_tokens"], style="tool"),
            "task": texts.text("agent-task", c["task_tokens"]),
            "results": [texts.text(f"agent-result-{i}", n, style="tool")
                        for i, n in enumerate(sizes)],
            "result_tokens": sizes,
            "calls": [texts.text(f"agent-call-{i}", 2 * c["max_tokens"], style="call")
                      for i in range(c["max_turns"])],
        }

    def variants(self):
        return skippy_and_llama(self.cfg["lanes"])

    def run_once(self, client, deadline):
        c, m = self.cfg, self.material
        cap = min(c["max_context"], self.ctx_size - c["max_tokens"] - 64)
        messages = [{"role": "system", "content": m["system"]},
                    {"role": "user", "content": m["task"]}]
        records = []
        prompt_tokens = 0
        for turn in range(c["max_turns"]):
            if deadline.expired():
                return records, {"truncated": True}
            r = client.chat(messages, c["max_tokens"])
            records.append(record(r, key=f"turn{turn + 1}", group=turn + 1, turn=turn + 1))
            if not r.ok and (c["replies"] == "generated" or not r.output_rejected):
                break
            call = r.text if c["replies"] == "generated" else m["calls"][turn]
            if r.prompt_tokens is not None:
                prompt_tokens = r.prompt_tokens
            upcoming = prompt_tokens + 2 * c["max_tokens"] + m["result_tokens"][turn] + 16
            if upcoming + c["max_tokens"] > cap or turn + 1 >= len(m["results"]):
                break
            # A tool result answers a call of the assistant message before it (both servers
            # reject a tool message without a matching tool_call_id); templates without
            # tools render the content only, as before.
            call_id = f"call_{turn + 1}"
            messages = messages + [
                {"role": "assistant", "content": call,
                 "tool_calls": [{"id": call_id, "type": "function",
                                 "function": {"name": "tool", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": call_id, "content": m["results"][turn]}]
        return records, {}


class AgentEdits(Workload):
    """An agent loop whose client rewrites history, as coding agents do to save context:
    each assistant turn is reasoning text plus a tool call, each tool result is appended;
    before some requests the client replaces the tool result from 3 turns ago with a
    truncated stub ("rewrite_tool"), before others it drops the reasoning text of all but the
    two latest assistant turns ("drop_reasoning"); other requests only append ("append").
    An edit changes the prompt in the middle: only the prefix before it can be reused."""
    paced = True
    name = "agent_edits"
    title = "Agent with history edits: rewritten tool results, dropped reasoning"

    @staticmethod
    def edit_at(turn):
        """The edit made before request `turn` (1-based)."""
        if turn >= 4 and turn % 3 == 1:
            return "rewrite_tool"
        if turn >= 6 and turn % 3 == 0:
            return "drop_reasoning"
        return "append"

    def build(self, texts):
        c = self.cfg
        rng = random.Random("agent_edits")
        n = c["max_turns"]
        sizes = [rng.randint(*c["append_tokens"]) for _ in range(n)]
        thinking = [rng.randint(*c["reasoning_tokens"]) for _ in range(n)]
        self.material = {
            "system": texts.text("ae-system", c["system_tokens"], style="tool"),
            "task": texts.text("ae-task", c["task_tokens"]),
            "results": [texts.text(f"ae-result-{i}", k, style="tool")
                        for i, k in enumerate(sizes)],
            "result_tokens": sizes,
            "stubs": [f"[output of this call truncated by the client: {k} tokens]\n"
                      + texts.text(f"ae-stub-{i}", c["truncated_tokens"], style="tool")
                      for i, k in enumerate(sizes)],
            "reasoning": [texts.text(f"ae-think-{i}", k) for i, k in enumerate(thinking)],
            "reasoning_tokens": thinking,
            "calls": [texts.text(f"ae-call-{i}", 2 * c["max_tokens"], style="call")
                      for i in range(n)],
        }
        # Measured token counts (a fitted text can overshoot a small target by a piece).
        count = texts.count_tokens
        m = self.material
        m["n"] = {"system": count(m["system"]), "task": count(m["task"]),
                  "results": [count(t) for t in m["results"]],
                  "stubs": [count(t) for t in m["stubs"]],
                  "turns": [count(r + "\n" + cl) for r, cl in zip(m["reasoning"], m["calls"])],
                  "calls": [count(t) for t in m["calls"]]}

    def variants(self):
        return skippy_and_llama(self.cfg["lanes"])

    def run_once(self, client, deadline):
        c, m = self.cfg, self.material
        cap = min(c["max_context"], self.ctx_size - c["max_tokens"] - 64)
        messages = [{"role": "system", "content": m["system"]},
                    {"role": "user", "content": m["task"]}]
        turn_msgs = []   # per finished turn: (index of assistant message, index of tool message)
        calls = []       # the call text of each turn's assistant message
        records = []
        # Token estimate per message (fitted sizes + template overhead): the same on every
        # server, so every server stops after the same turn whatever it reports or rejects.
        overhead = 6  # ChatML: <|im_start|>role\n ... <|im_end|>\n
        n = m["n"]
        est = [n["system"] + overhead, n["task"] + overhead]
        for k in range(1, c["max_turns"] + 1):
            if deadline.expired():
                return records, {"truncated": True}
            edit = self.edit_at(k) if k > 1 else "append"
            if edit == "rewrite_tool" and k - 3 >= 1:
                _, tool_idx = turn_msgs[k - 4]
                messages = list(messages)
                messages[tool_idx] = dict(messages[tool_idx], content=m["stubs"][k - 4])
                est[tool_idx] = n["stubs"][k - 4] + overhead
            elif edit == "drop_reasoning":
                messages = list(messages)
                for j, (asst_idx, _) in enumerate(turn_msgs[:-2]):
                    messages[asst_idx] = dict(messages[asst_idx], content=calls[j])
                    est[asst_idx] = n["calls"][j] + overhead
            r = client.chat(messages, c["max_tokens"])
            records.append(record(r, key=f"turn{k}", group=k, turn=k, edit=edit))
            if not r.ok and (c["replies"] == "generated" or not r.output_rejected):
                break
            call = r.text if c["replies"] == "generated" else m["calls"][k - 1]
            added = [n["turns"][k - 1] + overhead, n["results"][k - 1] + overhead]
            # + 16: BOS, the generation prompt, tokens merging across message boundaries
            if sum(est) + sum(added) + 16 + 2 * c["max_tokens"] > cap or k >= len(m["results"]):
                break
            calls.append(call)
            content = m["reasoning"][k - 1] + "\n" + call
            call_id = f"call_{k}"  # a tool result answers a call (see AgentLoop)
            messages = messages + [
                {"role": "assistant", "content": content,
                 "tool_calls": [{"id": call_id, "type": "function",
                                 "function": {"name": "tool", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": call_id, "content": m["results"][k - 1]}]
            est += added
            turn_msgs.append((len(messages) - 2, len(messages) - 1))
        return records, {}

    def summarize(self, runs):
        summary = summarize_groups(runs)
        by_edit = summarize_groups(runs, group_key=lambda r: r.get("edit", "append"))
        return {"by_group": summary, "ratios": add_ratios(summary),
                "by_edit": by_edit, "ratios_by_edit": add_ratios(by_edit),
                "headline": headline(runs)}


class Concurrency(Workload):
    """`clients` concurrent clients, each sending `requests_per_client` requests back to back;
    half share one of two long prefixes (different suffixes), half are unique."""
    name = "concurrency"
    title = "Concurrency: concurrent clients, mixed shared-prefix and unique prompts"
    concurrent_decode = True

    def __init__(self, cfg, ctx_size):
        super().__init__(cfg, ctx_size)
        shared = [prompts.token_prompt(f"conc-prefix-{k}", cfg["shared_prefix_tokens"])
                  for k in range(2)]
        self.requests = []
        for i in range(cfg["clients"]):
            mine = []
            for j in range(cfg["requests_per_client"]):
                rng = random.Random(f"conc-{i}-{j}")
                if (i + j) % 2 == 0:
                    suffix = prompts.token_prompt(f"conc-sfx-{i}-{j}",
                                                  rng.randint(*cfg["suffix_tokens"]), bos=False)
                    mine.append(("shared", shared[(i + 2 * j) % 2] + suffix))
                else:
                    mine.append(("unique", prompts.token_prompt(
                        f"conc-uniq-{i}-{j}", rng.randint(*cfg["unique_tokens"]))))
            self.requests.append(mine)

    def variants(self):
        return skippy_and_llama(self.cfg["lanes"])

    def run_once(self, client, deadline):
        c = self.cfg
        per_client = [[] for _ in range(c["clients"])]
        barrier = threading.Barrier(c["clients"] + 1)

        def worker(i):
            barrier.wait()
            for j, (kind, prompt) in enumerate(self.requests[i]):
                if deadline.expired():
                    return
                r = client.completion(prompt, c["max_tokens"])
                per_client[i].append(record(r, key=f"cl{i}-{j}", group=kind, client=i))

        threads = [threading.Thread(target=worker, args=(i,), daemon=True)
                   for i in range(c["clients"])]
        for t in threads:
            t.start()
        barrier.wait()
        start = time.perf_counter()
        for t in threads:
            t.join(max(1.0, deadline.remaining() + client.request_timeout))
        wall = time.perf_counter() - start
        records = [r for rs in per_client for r in rs]
        ok = [r for r in records if r["ok"]]
        extra = {
            "wall_s": wall,
            "gen_tokens_per_s": sum(r["completion_tokens"] or 0 for r in ok) / wall,
            "prompt_tokens_per_s": sum(r["prompt_tokens"] or 0 for r in ok) / wall,
            "truncated": any(t.is_alive() for t in threads) or
                         len(records) < c["clients"] * c["requests_per_client"],
        }
        return records, extra

    def summarize(self, runs):
        summary = summarize_groups(runs)
        overall = summarize_groups(runs, group_key=lambda r: "all")
        for variant, groups in overall.items():
            tps = [run["extra"].get("gen_tokens_per_s") for run in runs
                   if run["variant"] == variant and run["extra"].get("gen_tokens_per_s")]
            ptps = [run["extra"].get("prompt_tokens_per_s") for run in runs
                    if run["variant"] == variant and run["extra"].get("prompt_tokens_per_s")]
            groups["all"]["throughput_gen_tps"] = stats.median(tps)
            groups["all"]["throughput_prompt_tps"] = stats.median(ptps)
            summary.setdefault(variant, {})["all"] = groups["all"]
        fields = ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p90_ms", "throughput_gen_tps")
        return {"by_group": summary, "ratios": add_ratios(summary, fields=fields),
                "headline": {v: g["all"] for v, g in summary.items() if "all" in g}}


class ColdPath(Workload):
    """Unique prompts only (nothing to hit): what recording costs. skippy with the cache
    (lookup-record) vs skippy --cache-mode off, llama-server as a reference."""
    paced = True
    name = "cold"
    title = "Cold path: unique prompts, cost of lookup + record"

    def __init__(self, cfg, ctx_size):
        super().__init__(cfg, ctx_size)
        n = min(cfg["prompt_tokens"], ctx_size - cfg["max_tokens"] - 8)
        self.prompts = [prompts.token_prompt(f"cold-{k}", n) for k in range(cfg["prompts"])]

    def variants(self):
        return [Variant("skippy", "skippy", 1),
                Variant("skippy-off", "skippy", 1, config.SKIPPY_CACHE_OFF),
                Variant("llama-server", "llama", 1)]

    def run_once(self, client, deadline):
        records = []
        for k, prompt in enumerate(self.prompts):
            if deadline.expired():
                return records, {"truncated": True}
            r = client.completion(prompt, self.cfg["max_tokens"])
            records.append(record(r, key=f"u{k}", group="unique"))
        return records, {}

    def summarize(self, runs):
        summary = summarize_groups(runs)
        return {"by_group": summary,
                "ratios": add_ratios(summary),
                "ratios_record_overhead": add_ratios(summary, "skippy", "skippy-off"),
                "headline": headline(runs)}


class Restart(Workload):
    """A long shared prefix is sent once (cold), the server is stopped and started again,
    then the prefix comes back with a new last token: skippy restores it from its disk tier
    (same --cache-dir across the restart), llama-server has to prefill it again (its prompt
    cache lives in RAM). Headline: the first TTFT after the restart."""
    name = "restart"
    title = "Restart: the first request after a server restart, long shared prefix"
    restarts = True  # _one_run: prepare_once, restart the server (same cache folder), run_once

    def __init__(self, cfg, ctx_size):
        super().__init__(cfg, ctx_size)
        p = cfg["prefix_tokens"]
        self.prefix = prompts.token_prompt(f"restart-{p}", p)

    def prepare_once(self, client, deadline):
        r = client.completion(self.prefix + [prompts.token_at(0, 1)], 1)
        return [record(r, key="restart-before", group="cold", phase="cold")]

    def run_once(self, client, deadline):
        records = []
        for i in range(self.cfg["reps"]):
            r = client.completion(self.prefix + [prompts.token_at(0, 2 + i)], 1)
            group = "restart" if i == 0 else "warm"
            records.append(record(r, key=f"restart-after-{i}", group=group, phase=group))
        return records, {}

    def summarize(self, runs):
        summary = summarize_groups(runs)
        head = {v: g.get("restart") for v, g in summary.items() if g.get("restart")}
        cold = {v: g.get("cold") for v, g in summary.items() if g.get("cold")}
        return {"by_group": summary, "ratios": add_ratios(summary), "headline": head,
                "restart_vs_cold": {v: stats.ratio((head.get(v) or {}).get("ttft_p50_ms"),
                                                   (cold.get(v) or {}).get("ttft_p50_ms"))
                                    for v in head}}


from .larger_than_ram import LargerThanRam  # noqa: E402 (it builds on the classes above)

ALL = {w.name: w for w in (FamilyTable, MultiTurnChat, MultiSession, AgentLoop, AgentEdits,
                           Concurrency, ColdPath, Restart, LargerThanRam)}
