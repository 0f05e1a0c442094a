"""End-to-end correctness of the exact prefix cache through the real server, for generated
dense, hybrid and recurrent models (one payload kind, kv-pages): greedy outputs with the
cache on are identical token for token to the cache off, and each turn of a chat prefills
only what is new."""
import concurrent.futures
import time
import unittest

import skippy_harness as h

SYSTEM = ("You are the assistant of a shop that sells bicycles, spare parts and tools. "
          "Answer questions about opening hours, prices, repairs and deliveries. Be polite, "
          "keep answers short, never invent prices, and always offer to book a repair slot. "
          "The shop opens at nine and closes at six, Monday to Saturday. ") * 2
USER_TURNS = ["Hello, are you open today?", "How much is a new chain?",
              "Can you fix a flat tire by tomorrow?", "Do you deliver to the next town?",
              "What tools do I need to change brake pads?", "Thanks, book me for Friday."]
CACHE_FLAGS = ["--cache-min-tokens", "16", "--lanes", "2", "--ctx-size", "8192"]


def conversation(server, turns, system=SYSTEM, max_tokens=8, key=None, think_s=0.0):
    """Runs a multi-turn chat; returns per-turn (completion ids, usage, reply text).
    `think_s`: the client's pause before each next message."""
    messages = [{"role": "system", "content": system}]
    out = []
    for i, user in enumerate(turns):
        if i and think_s:
            time.sleep(think_s)
            deadline = time.time() + 30  # a slow machine: until the end of the turn ran
            while (server.metrics().get("skippy_turn_ends_deferred", 0) > 0
                   or server.metrics().get("skippy_lanes_busy", 0) > 0) and time.time() < deadline:
                time.sleep(0.05)
        messages.append({"role": "user", "content": user})
        body = h.chat(messages, max_tokens=max_tokens)
        if key:
            body["cache_salt"] = key  # the tenant (prompt_cache_key is only a routing hint)
        status, resp = server.post_json("/v1/chat/completions", body)
        assert status == 200, resp
        reply = resp["choices"][0]["message"]["content"]
        out.append((resp["skippy"]["completion_token_ids"], resp["usage"], reply))
        messages.append({"role": "assistant", "content": reply})
    return out


class PrefixCacheKindTest:
    """Mixin: the same checks for each model kind."""
    kind = None
    payload = None
    flash = False  # whether the server runs flash attention (plan.h's body and tail)

    @classmethod
    def setUpClass(cls):
        cls.model = h.model_path(cls.kind)
        with h.Server(cls.model, "--cache-mode", "off", *CACHE_FLAGS) as off:
            cls.reference = conversation(off, USER_TURNS[:4])
            cls.shared_reference = [conversation(off, [f"Question {i}: what is open?"])[0]
                                    for i in range(3)]
        cls.server = h.Server(cls.model, *CACHE_FLAGS)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_01_startup_reports_payload(self):
        log = "".join(self.server.log_lines)
        self.assertIn(f"payload={self.payload}", log)

    def test_02_multi_turn_identical_and_cached(self):
        cached = conversation(self.server, USER_TURNS[:4])
        for turn, (ref, got) in enumerate(zip(self.reference, cached)):
            self.assertEqual(got[0], ref[0], f"turn {turn} tokens differ with the cache on")
            self.assertEqual(got[1]["prompt_tokens"], ref[1]["prompt_tokens"])
        for turn in range(1, 4):
            self.assertGreater(cached[turn][1]["prompt_tokens_details"]["cached_tokens"], 0,
                               f"turn {turn} restored nothing")
        # Replaying the same conversation restores even more and stays identical.
        again = conversation(self.server, USER_TURNS[:4])
        self.assertEqual([t[0] for t in again], [t[0] for t in self.reference])
        self.assertGreater(again[0][1]["prompt_tokens_details"]["cached_tokens"], 0)

    def test_03_sessions_share_the_system_prompt(self):
        results = [conversation(self.server, [f"Question {i}: what is open?"])[0]
                   for i in range(3)]
        for i, (got, ref) in enumerate(zip(results, self.shared_reference)):
            self.assertEqual(got[0], ref[0])
        system_tokens = len(SYSTEM.split())  # a loose lower bound of its token count
        for got in results[1:]:
            self.assertGreater(got[1]["prompt_tokens_details"]["cached_tokens"], system_tokens)

    def test_04_concurrent_sessions_identical(self):
        def run(i):
            return conversation(self.server, [f"Concurrent {i}", "And then?"], max_tokens=6)

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            parallel = list(pool.map(run, range(3)))
        with h.Server(self.model, "--cache-mode", "off", *CACHE_FLAGS) as off:
            sequential = [conversation(off, [f"Concurrent {i}", "And then?"], max_tokens=6)
                          for i in range(3)]
        self.assertEqual([[t[0] for t in c] for c in parallel],
                         [[t[0] for t in c] for c in sequential])

    def test_05_metrics_count_hits(self):
        m = self.server.metrics()
        self.assertGreater(m.get("skippy_cache_hits_total", 0), 0)
        self.assertGreater(m["skippy_cache_cached_tokens_total"], 0)
        self.assertEqual(m.get("skippy_cache_errors_total", 0), 0)
        # Once idle nothing is held: no lane busy (a lane stays busy for a moment after
        # its reply to prefill the end of the turn), no entry leased by a restore. (The
        # cache gauges are skipped while the record worker holds the cache lock.)
        deadline = time.time() + 10
        while ("skippy_cache_leased_entries" not in m or m["skippy_lanes_busy"] > 0) and \
                time.time() < deadline:
            time.sleep(0.1)
            m = self.server.metrics()
        self.assertEqual(m["skippy_lanes_busy"], 0)
        self.assertEqual(m["skippy_cache_leased_entries"], 0)
        self.assertEqual(m["skippy_cache_hidden_entries"], 0)

    def test_06_namespaces_are_isolated(self):
        first = conversation(self.server, ["Tenant question"], key="tenant-a")[0]
        other = conversation(self.server, ["Tenant question"], key="tenant-b")[0]
        self.assertEqual(other[1]["prompt_tokens_details"]["cached_tokens"], 0,
                         "tenant-b got a hit on a prefix only tenant-a had sent")
        self.assertEqual(first[0], other[0])
        again = conversation(self.server, ["Tenant question"], key="tenant-a")[0]
        self.assertGreater(again[1]["prompt_tokens_details"]["cached_tokens"], 0)


class PrefillOnlyTheNewMessage:
    def test_07_six_turns_prefill_only_the_new_message(self):
        # A person reads the reply before answering: meanwhile the server prefills the end
        # of the turn, so the next turn restores the history with the reply in it.
        self.six_turns("Turn", think_s=0.3, reply_restored=True)

    def test_08_back_to_back_turns_restore_the_previous_prompt(self):
        # An agent answers at once: the end of the turn has not run yet (it waits for an
        # idle moment), so the history up to the previous prompt is restored and the reply
        # is prefilled with the new message.
        self.six_turns("Step", think_s=0.0, reply_restored=False)

    def six_turns(self, label, think_s, reply_restored):
        turns = [f"{label} {i}: {USER_TURNS[i]}" for i in range(6)]
        result = conversation(self.server, turns, max_tokens=6, think_s=think_s)
        print(f"\n{self.kind} 6-turn conversation, {think_s} s between turns "
              "(prompt / cached / suffix tokens):")
        previous_prompt = 0
        previous_reply = 0
        for turn, (_, usage, _) in enumerate(result):
            prompt = usage["prompt_tokens"]
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            suffix = prompt - cached
            added = prompt - previous_prompt
            print(f"  turn {turn + 1}: prompt={prompt} cached={cached} suffix={suffix} "
                  f"(added since last turn: {added}, of which reply: {previous_reply})")
            if turn >= 1:
                self.assertGreater(cached, 0)
                # Only the new user message and template tokens (and the previous reply
                # unless it was restored): 2 tokens of slack for re-tokenization.
                new = added - (previous_reply if reply_restored else 0) + 2
                if not self.flash:
                    self.assertLessEqual(suffix, new)
                    self.assertGreaterEqual(cached, previous_prompt - 2)
                elif reply_restored:
                    # At least one body chunk of 64 tokens is prefilled (plan.h).
                    self.assertLessEqual(suffix, max(new, 64))
                    self.assertGreaterEqual(cached, min(previous_prompt, prompt - 64) - 2)
                else:
                    # Before the end of the turn ran, the previous prompt's tail and a body
                    # chunk before it are prefilled again.
                    self.assertLessEqual(suffix, new + h.FLASH_RESTORE_SLACK)
                    self.assertGreaterEqual(cached, previous_prompt - h.FLASH_RESTORE_SLACK)
            previous_prompt = prompt
            previous_reply = usage["completion_tokens"]


class DenseTest(PrefixCacheKindTest, PrefillOnlyTheNewMessage, unittest.TestCase):
    kind = "llama"
    payload = "kv-pages"
    flash = True  # the default for models with attention


class HybridTest(PrefixCacheKindTest, PrefillOnlyTheNewMessage, unittest.TestCase):
    kind = "qwen35"
    payload = "kv-pages"
    flash = True


class RecurrentMamba2Test(PrefixCacheKindTest, PrefillOnlyTheNewMessage, unittest.TestCase):
    kind = "mamba2"
    payload = "kv-pages"


class EvictionUnderSmallBudgetTest(unittest.TestCase):
    def check(self, kind, budget_flags):
        model = h.model_path(kind)
        convs = [[f"Customer {i} asks about item {i}.", "And the price?"] for i in range(5)]
        with h.Server(model, "--cache-mode", "off", *CACHE_FLAGS) as off:
            reference = [[t[0] for t in conversation(off, c, max_tokens=6)] for c in convs]
        with h.Server(model, *CACHE_FLAGS, *budget_flags) as on:
            for _ in range(2):
                got = [[t[0] for t in conversation(on, c, max_tokens=6)] for c in convs]
                self.assertEqual(got, reference)
            m = on.metrics()
            self.assertGreater(m["skippy_cache_evictions_total"], 0)
            self.assertEqual(m.get("skippy_cache_errors_total", 0), 0)

    def test_dense_exact_eviction(self):
        self.check("llama", ["--cache-max-entries", "3"])

    def test_hybrid_exact_eviction(self):
        self.check("qwen35", ["--cache-max-entries", "3"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
