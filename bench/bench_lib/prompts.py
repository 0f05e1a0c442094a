"""Deterministic prompt material. Token-id prompts are exact; text is fitted to a token
count with a tokenizer callable (llama-server's /tokenize: the models share one tokenizer).
Everything derives from explicit seeds, so both servers (and every round) see identical
requests."""
import random

BOS = 1
FIRST_PLAIN_ID = 300  # skip control and byte tokens of the llama-spm vocabulary
VOCAB = 32000

_WORDS = (
    "the of and to in is that for it as with was on be by this are or from at an not have "
    "which but all can has more one will their also other been its new first these time "
    "two may would when only any such after most over into some could than where used many "
    "system model cache prefix token request server latency context agent tool result "
    "function value file path error state memory thread queue batch decode prompt session "
    "record lookup restore entry block layer weight buffer number string list index test "
    "build config option default return output input should must check update create "
    "simple exact shared longer shorter before again every next last first small large"
).split()

_TOOLS = ["read_file", "list_dir", "grep", "run_tests", "search", "edit_file", "http_get"]
_EXTS = ["py", "cpp", "h", "md", "json", "txt"]


def token_prompt(seed, n_tokens, bos=True):
    """BOS + (n_tokens - 1) pseudo-random ordinary token ids."""
    rng = random.Random(f"tok-{seed}")
    ids = [rng.randrange(FIRST_PLAIN_ID, VOCAB) for _ in range(n_tokens - (1 if bos else 0))]
    return ([BOS] if bos else []) + ids


def token_at(seed, index):
    """A distinct-per-index ordinary token id (used to vary the last prompt token)."""
    rng = random.Random(f"last-{seed}-{index}")
    return rng.randrange(FIRST_PLAIN_ID, VOCAB)


def render_chatml(messages, add_generation_prompt=True):
    """The ChatML template `skippy make-model` writes into every benchmark model (the same
    text skippy renders server-side; the output check compares prompt token counts)."""
    text = "".join(f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n"
                   for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def _prose_pieces(rng):
    while True:
        n = rng.randint(6, 18)
        sentence = " ".join(rng.choice(_WORDS) for _ in range(n))
        yield sentence[0].upper() + sentence[1:] + ". "


def _tool_pieces(rng):
    """Tool-call / tool-result style lines: JSON, paths, code-like text."""
    while True:
        kind = rng.randrange(4)
        if kind == 0:
            name = rng.choice(_TOOLS)
            path = "/".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))
            yield (f'{{"tool": "{name}", "path": "src/{path}.{rng.choice(_EXTS)}", '
                   f'"line": {rng.randint(1, 900)}, "ok": {"true" if rng.random() < 0.8 else "false"}}}\n')
        elif kind == 1:
            ident = "_".join(rng.choice(_WORDS) for _ in range(2))
            yield f"def {ident}(x, y={rng.randint(0, 99)}):\n    return x.{rng.choice(_WORDS)}(y)\n"
        elif kind == 2:
            yield (f"{rng.choice(_WORDS)}.{rng.choice(_EXTS)}:{rng.randint(1, 500)}: "
                   + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 9))) + "\n")
        else:
            yield (f"  - {rng.choice(_WORDS)}: {rng.randint(0, 10**6)} "
                   f"({rng.random():.3f} {rng.choice(_WORDS)})\n")


def _call_pieces(rng):
    """An agent's tool call."""
    while True:
        args = ", ".join(f'"{rng.choice(_WORDS)}": "{rng.choice(_WORDS)}"'
                         for _ in range(rng.randint(1, 3)))
        yield f'<tool_call>{{"name": "{rng.choice(_TOOLS)}", "arguments": {{{args}}}}}</tool_call>\n'


_STYLES = {"prose": _prose_pieces, "tool": _tool_pieces, "call": _call_pieces}


class TextFactory:
    """Builds text whose standalone tokenization has (close to) a target token count."""

    def __init__(self, count_tokens):
        self.count_tokens = count_tokens  # callable: str -> int

    def text(self, seed, n_tokens, style="prose"):
        rng = random.Random(f"{style}-{seed}")
        gen = _STYLES[style](rng)
        pieces = []
        # Enough pieces to overshoot the target, then binary-search the longest fitting prefix.
        while True:
            pieces.extend(next(gen) for _ in range(max(4, n_tokens // 8)))
            if self.count_tokens("".join(pieces)) >= n_tokens:
                break
        lo, hi = 1, len(pieces)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.count_tokens("".join(pieces[:mid])) <= n_tokens:
                lo = mid
            else:
                hi = mid - 1
        text = "".join(pieces[:lo]).rstrip()
        # Pad with single words up to the target (a piece can be ~40 tokens long).
        words = random.Random(f"pad-{style}-{seed}")
        for _ in range(64):
            if self.count_tokens(text) >= n_tokens:
                break
            candidate = text + " " + words.choice(_WORDS)
            if self.count_tokens(candidate) > n_tokens:
                break
            text = candidate
        return text
