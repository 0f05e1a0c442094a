"""The cache dashboard (GET /dashboard) in a real headless browser (Debian's chromium): the
page loads offline (it talks only to the server), shows non-zero numbers after a few
requests, and logs no console error (the page also writes its own errors, and
window.onerror, into #errors, which must stay empty).

SKIPPY_WRITE_SCREENSHOT=1 also writes docs/dashboard.png (the README's screenshot)."""
import html
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import skippy_harness as h

SYSTEM = ("You are the assistant of a shop that sells bicycles, spare parts and tools. "
          "Answer questions about opening hours, prices, repairs and deliveries. ") * 4
QUESTIONS = ["Are you open today?", "How much is a new chain?", "Can you fix a flat tire?",
             "Do you deliver to the next town?", "Which brake pads fit my bike?"]
REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def chromium():
    for name in (os.environ.get("SKIPPY_CHROMIUM", ""), "chromium", "chromium-browser",
                 "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def run_chromium(url, *extra, budget_ms=4000):
    profile = tempfile.mkdtemp(prefix="skippy-chromium-")
    try:
        args = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-extensions",
                f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
                f"--virtual-time-budget={budget_ms}", *extra, url]
        return subprocess.run(args, capture_output=True, text=True, errors="replace",
                              timeout=180)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def text_of(dom, element_id):
    m = re.search(r'id="%s"[^>]*>(.*?)</' % re.escape(element_id), dom, re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", m.group(1))).strip() if m else None


@unittest.skipUnless(chromium() or not os.environ.get("SKIPPY_ALLOW_NO_BROWSER"),
                     "no chromium (scripts/setup installs it)")
class DashboardInBrowser(unittest.TestCase):
    def test_page_shows_live_numbers_without_errors(self):
        self.assertIsNotNone(chromium(), "chromium is missing: run scripts/setup")
        with h.Server(h.model_path("llama"), "--lanes", "2") as s:
            messages = [{"role": "system", "content": SYSTEM}]
            for q in QUESTIONS:
                messages.append({"role": "user", "content": q})
                status, resp = s.post_json("/v1/chat/completions",
                                           h.chat(messages, max_tokens=6))
                self.assertEqual(status, 200, resp)
                messages.append({"role": "assistant",
                                 "content": resp["choices"][0]["message"]["content"]})
                s.wait_settled()
            s.post_json("/v1/chat/completions", h.chat([{"role": "user", "content": "Hi."}]))
            s.wait_idle()

            result = run_chromium(s.base + "/dashboard", "--dump-dom")
            self.assertEqual(result.returncode, 0, result.stderr[-2000:])
            dom = result.stdout
            self.assertIn('data-ready="1"', dom, "the page never rendered the stats")
            self.assertEqual(text_of(dom, "errors"), "", "the page reported errors")
            console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line]
            bad = [line for line in console
                   if re.search(r"Uncaught|Error|Refused|Failed to load|violates", line)]
            self.assertEqual(bad, [], "console errors")
            # Non-zero numbers, as the server counts them.
            hit_rate = text_of(dom, "hit-rate-tokens")
            self.assertRegex(hit_rate, r"^\d+\.\d %$")
            self.assertGreater(float(hit_rate.split()[0]), 0)
            self.assertEqual(text_of(dom, "requests-total"), str(len(QUESTIONS) + 1))
            self.assertNotEqual(text_of(dom, "tokens-saved"), "0")
            self.assertNotIn(text_of(dom, "ttft-hit"), ("–", None))
            self.assertNotIn(text_of(dom, "ttft-miss"), ("–", None))
            self.assertIn("exact_hit", dom)
            self.assertIn("below_min_tokens", dom)  # the last request's miss reason
            tbody = dom.split('id="requests"')[1].split("</tbody>")[0]
            self.assertEqual(tbody.count("<tr>"), len(QUESTIONS) + 1)
            self.assertIn("RAM", dom)

            if os.environ.get("SKIPPY_WRITE_SCREENSHOT") == "1":
                out = os.path.join(REPO, "docs", "dashboard.png")
                shot = run_chromium(s.base + "/dashboard", "--window-size=1400,900",
                                    "--hide-scrollbars", f"--screenshot={out}")
                self.assertEqual(shot.returncode, 0, shot.stderr[-2000:])
                self.assertGreater(os.path.getsize(out), 10000)

    def test_page_asks_for_the_key_when_keys_are_set(self):
        with h.Server(h.model_path("llama"), "--api-key", "sk-dash") as s:
            result = run_chromium(s.base + "/dashboard", "--dump-dom", budget_ms=2000)
            self.assertEqual(result.returncode, 0, result.stderr[-2000:])
            self.assertRegex(result.stdout, r'id="auth" class="shown"')
            self.assertEqual(text_of(result.stdout, "errors"), "")


if __name__ == "__main__":
    unittest.main(verbosity=2)
