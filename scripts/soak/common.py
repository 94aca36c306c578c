"""Shared by every module of the soak: the repo's paths, the model table and prices it serves,
the limits the driver keeps to, the prompts, and small helpers (log, durations)."""

import argparse
import os
import re
import sys
from decimal import Decimal

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOLLM2 = os.path.join(ROOT, "weights", "SmolLM2-135M-Instruct.Q4_1.gguf")
TEST_DOCS = os.environ.get("HEARTH_TEST_DOCS", os.path.join(ROOT, ".cache", "test-docs"))
SERVICES = ("auth", "completion", "markdown", "imagine")

# The model table the soak serves: both text ids on SmolLM2 (one shared engine, as in the shipped
# table), and the tiny image model. Gemma is left out: on a 2-core box a second engine would
# take the CPU the rest of the traffic needs. Prices as in models.toml.
TEXT_PRICES = {"alpha-3.3": (Decimal("0.60"), Decimal("2.40")), "beta-4-mini": (Decimal("0.15"), Decimal("0.60"))}
MODELS_TOML = """\
[defaults]
threads = 0

[text."alpha-3.3"]
weights = "{w}"
temperature_max = 5.0
max_output_tokens = 2048
max_input_tokens = 128000
input_price_per_million = "0.60"
output_price_per_million = "2.40"

[text."beta-4-mini"]
weights = "{w}"
temperature_max = 2.0
max_output_tokens = 16384
max_input_tokens = 128000
input_price_per_million = "0.15"
output_price_per_million = "0.60"

[image."xl-lightning"]
weights = "no-real-weights-here"
tiny_weights = "tiny-sdxl"
price_per_image = "0.040"
"""

INITIAL_BALANCE = Decimal("1000")  # far above what even a day of soak spends: a 402 would mean a bug
# Output tokens a cut request may ask for; it bounds what a cut can cost (the money check).
CUT_MAX_TOKENS = 64
# Prompt tokens a soak prompt stays under, chat template included (the money check's bound).
PROMPT_TOKENS_BOUND = 512
# Requests of one user the driver lets run at once, under the server's per-user caps (4
# completions, 2 images) so that a 429 means the server freed a slot late, not that we flooded.
USER_COMPLETIONS = 3
USER_IMAGES = 1
REQUEST_TIMEOUT = 120.0

PROMPTS = [
    "Name three colours.",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash map is in one sentence.",
    "Give me two tips for sleeping well.",
    "Count from one to ten.",
    "What is 17 times 3?",
    "Describe a cat to someone who has never seen one.",
    "Tell me a short story about a lighthouse.",
    "List four fruits that are red.",
]


def log(msg):
    print(f"soak: {msg}", file=sys.stderr, flush=True)


def parse_duration(text):
    """`90s`, `30m`, `2h`, `1h30m` or a plain number of seconds."""
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a duration such as 90s, 30m, 2h or 1h30m")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


def fmt_elapsed(secs):
    secs = int(round(secs))
    return f"{secs // 3600}:{secs // 60 % 60:02d}:{secs % 60:02d}" if secs >= 3600 else f"{secs // 60}:{secs % 60:02d}"
