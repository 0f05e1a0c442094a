"""The larger-than-RAM workload: many conversations whose cached state totals about
`ram_ratio` (10) times skippy's RAM budget (`--cache-max-bytes`), revisited in a shuffled,
zipf-like order, so that most revisits find their history evicted from RAM.

Variants: skippy with its disk tier (default), skippy RAM only (`--cache-disk off`), both
with the same small RAM budget, llama-server with its defaults (its `--cache-ram` host
cache, 8 GiB by default, holds the whole working set) and llama-server-equal: llama-server
with `--cache-ram` set to skippy's RAM budget in MiB, rounded up (equal memory: both
budgets bound the host copies of cached states; llama-server's counts whole slot states
with their checkpoints, skippy's the deduplicated blocks plus 1/8 for queued captures). The
budget comes from a calibration
(once per model, not measured): an unmeasured skippy serves two visits of one conversation;
its /metrics give the bytes a conversation adds per visit and its events log the size of
the lane captures (skippy keeps 1/8 of --cache-max-bytes for queued captures, so the budget
is never below 8x the largest capture, or nothing would be recorded at all).
"""
import os
import random
import shutil
import tempfile
import time

from . import prompts, servers, stats
from .servers import Variant
from .workloads import Client, Deadline, Workload, add_ratios, headline, record, summarize_groups

CAPTURE_SHARE = 8       # skippy: queued captures may use 1/8 of --cache-max-bytes
CAPTURE_MARGIN = 1.1    # head room over the largest capture the calibration predicts


def visit_plan(cfg):
    """[(conversation, visit index)]: every conversation once in order (cold), then
    `revisits` visits drawn by a zipf-like popularity over a shuffled ranking, never the
    same conversation twice in a row, at most `max_visits` per conversation."""
    n = cfg["conversations"]
    rng = random.Random("larger-than-ram")
    ranking = list(range(n))
    rng.shuffle(ranking)
    weights = [1.0 / (k + 1) ** cfg["zipf_s"] for k in range(n)]
    visits = [1] * n
    plan = [(c, 0) for c in range(n)]
    last, attempts = n - 1, 0
    while len(plan) < n + cfg["revisits"] and attempts < 100 * (cfg["revisits"] + 1):
        attempts += 1
        c = ranking[rng.choices(range(n), weights)[0]]
        if c == last or visits[c] >= cfg["max_visits"]:
            continue
        plan.append((c, visits[c]))
        visits[c] += 1
        last = c
    return plan


def hit_stats(records):
    """Token-weighted hit rate and the share of requests served per tier."""
    ok = [r for r in records if r.get("ok")]
    prompt = sum(r.get("prompt_tokens") or 0 for r in ok)
    cached = sum(r.get("cached_tokens") or 0 for r in ok)
    tiers = {}
    for r in ok:
        if r.get("cache_tier") is not None:
            tiers[r["cache_tier"]] = tiers.get(r["cache_tier"], 0) + 1
    n = len(ok)
    share = (lambda *names: sum(tiers.get(t, 0) for t in names) / n) if n and tiers else None
    return {"n": n, "prompt_tokens": prompt, "cached_tokens": cached,
            "token_hit_rate": cached / prompt if prompt else None,
            "tiers": tiers,
            "disk_share": share("disk") if share else None,
            "ram_share": share("lane", "ram") if share else None,
            "miss_share": share("none") if share else None}


class LargerThanRam(Workload):
    name = "larger_than_ram"
    title = "Larger than RAM: a working set of conversations ~10x skippy's RAM budget"

    def __init__(self, cfg, ctx_size):
        super().__init__(cfg, ctx_size)
        n = cfg["conversations"]
        rng = random.Random("larger-than-ram-sizes")
        self.plan = visit_plan(cfg)
        self.prefixes = [prompts.token_prompt(f"ltr-{c}", cfg["prefix_tokens"])
                         for c in range(n)]
        # (c, v) -> the tokens visit v appends (the previous reply and a new user message)
        self.turns = {(c, v): prompts.token_prompt(f"ltr-{c}-{v}",
                                                   rng.randint(*cfg["turn_tokens"]), bos=False)
                      for c in range(n) for v in range(max(2, cfg["max_visits"]))}
        self.ram_bytes = None
        self.calibration = {}

    def prompt(self, c, v):
        out = list(self.prefixes[c])
        for k in range(v + 1):
            out += self.turns[(c, k)]
        return out

    def llama_cache_ram_mib(self):
        """skippy's RAM budget in MiB, rounded up: llama-server-equal's --cache-ram."""
        return -(-self.ram_bytes // (1 << 20)) if self.ram_bytes else None

    def variants(self):
        budget = ("--cache-max-bytes", str(self.ram_bytes)) if self.ram_bytes else ()
        out = [Variant("skippy", "skippy", 1, extra=budget),
               Variant("skippy-ram", "skippy", 1, extra=budget + ("--cache-disk", "off")),
               Variant("llama-server", "llama", 1)]
        if self.ram_bytes:  # no calibrated budget (calibration failed): nothing to equal
            out.append(Variant("llama-server-equal", "llama", 1,
                               extra=("--cache-ram", str(self.llama_cache_ram_mib()))))
        return out

    # ----------------------------------------------------------------------------------
    # calibration (runner.measure calls it once per model, before the first round)

    def calibrate(self, model):
        cfg = self.cfg
        folder = tempfile.mkdtemp(prefix="skippy-bench-ltr-calib-")
        events = os.path.join(folder, "events.jsonl")
        variant = Variant("calibrate", "skippy", 1,
                          extra=("--cache-disk", "off", "--cache-events-log", events))
        self.ram_bytes, self.calibration = None, {}
        server = None
        try:
            server = servers.start_server(model.bins, model.settings, variant, model.path,
                                          self.ctx_size)
            client = Client(server.port, model.request_timeout, Deadline(cfg["deadline_s"]))
            points = []  # (prompt tokens, physical bytes after, largest capture so far)
            for v in (0, 1):
                p = self.prompt(0, v)
                r = client.completion(p, cfg["max_tokens"])
                if not r.ok:
                    raise servers.ServerError(f"calibration request failed: {r.error}")
                phys = _settled_physical_bytes(server.port)
                points.append((len(p), phys, _largest_capture(events)))
        except (servers.ServerError, OSError) as e:
            self.calibration = {"error": str(e)}
            model.progress(f"  {self.name}: calibration failed ({e}); skippy's default budget")
            return
        finally:
            if server:
                server.stop()
            shutil.rmtree(folder, ignore_errors=True)
        (l0, phys0, cap0), (l1, phys1, cap1) = points
        per_visit = max(0, phys1 - phys0)
        visits = {}
        for c, v in self.plan:
            visits[c] = max(visits.get(c, 0), v + 1)
        working_set = sum(phys0 + per_visit * (k - 1) for k in visits.values())
        longest = max(len(self.prompt(c, v)) for c, v in self.plan)
        slope = (cap1 - cap0) / (l1 - l0) if l1 > l0 else 0.0
        capture = cap1 + slope * (longest - l1)
        floor = CAPTURE_SHARE * CAPTURE_MARGIN * capture
        budget = max(working_set / cfg["ram_ratio"], floor)
        self.ram_bytes = int(-(-budget // (1 << 16)) * (1 << 16))  # 64 KiB units, rounded up
        self.calibration = {"first_visit_bytes": phys0, "bytes_per_visit": per_visit,
                            "largest_capture_bytes": int(capture),
                            "working_set_estimate_bytes": int(working_set),
                            "ram_bytes": self.ram_bytes,
                            "ram_bytes_floor": int(floor),
                            "ratio_estimate": working_set / self.ram_bytes}
        model.progress(f"  {self.name}: RAM budget {self.ram_bytes / 2**20:.0f} MiB, working "
                       f"set ~{working_set / 2**20:.0f} MiB "
                       f"({working_set / self.ram_bytes:.1f}x), {len(self.plan)} requests")

    # ----------------------------------------------------------------------------------

    def run_once(self, client, deadline):
        records = []
        for c, v in self.plan:
            if deadline.expired():
                return records, {"truncated": True}
            r = client.completion(self.prompt(c, v), self.cfg["max_tokens"])
            group = "first" if v == 0 else "revisit"
            records.append(record(r, key=f"c{c}-v{v}", group=group, conv=c, visit=v))
        return records, {}

    def summarize(self, runs):
        summary = summarize_groups(runs)
        revisit = lambda r: r["group"] == "revisit"  # noqa: E731
        by_variant = {}
        for run in runs:
            by_variant.setdefault(run["variant"], []).extend(
                r for r in run["records"] if revisit(r))
        disk_bytes = [run["metrics"].get("skippy_cache_disk_bytes") for run in runs
                      if run["variant"] == "skippy" and run.get("metrics")]
        disk_bytes = max([b for b in disk_bytes if b] or [0]) or None
        return {"by_group": summary, "ratios": add_ratios(summary),
                "ratios_vs_ram": add_ratios(summary, "skippy", "skippy-ram"),
                "ratios_vs_llama_equal": add_ratios(summary, "skippy", "llama-server-equal"),
                "llama_cache_ram_mib": self.llama_cache_ram_mib(),
                "headline": headline(runs, revisit), "headline_note": "revisits",
                "hit_rates": {v: hit_stats(rs) for v, rs in by_variant.items()},
                "ram_bytes": self.ram_bytes, "calibration": self.calibration,
                # everything skippy recorded reaches the disk tier: the real working set
                "working_set_bytes": disk_bytes,
                "working_set_ratio": stats.ratio(disk_bytes, self.ram_bytes)}


def _metrics(port):
    return servers.scrape_metrics(port)


def _settled_physical_bytes(port, timeout=30.0):
    """skippy records a turn when its lane is reused or after ~50 ms idle: waits until the
    record queue is empty and the physical bytes stop changing."""
    end = time.monotonic() + timeout
    last = None
    time.sleep(0.2)
    while time.monotonic() < end:
        m = _metrics(port)
        phys = m.get("skippy_cache_physical_bytes")
        if (m.get("skippy_cache_record_queue_pending", 1) == 0 and phys is not None
                and phys == last and phys > 0):
            return int(phys)
        last = phys
        time.sleep(0.2)
    raise servers.ServerError("calibration: skippy did not record the conversation in time")


def _largest_capture(events_path):
    best = max((int(e.get("bytes") or 0) for e in servers.read_events(events_path, "record")
                if e.get("decision") == "queued"), default=0)
    if best <= 0:
        raise servers.ServerError("calibration: no capture in skippy's events log")
    return best
