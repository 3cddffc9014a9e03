"""Does steering do what the features say? A measured effect on the demo model.

The demo SAEs are trained on millm-tiny's own activations and record what each
feature fires on (features.json, served at /api/saes/{id}/features). For a few
topics this benchmark finds, through that API alone, the layer-0 feature whose
strongest tokens best cover the topic's words, saves a profile that steers on
it, and generates from the same neutral prompts with the same seeds,
unsteered and steered at three dials (λ = 0.5, 1, 2). It counts the topic's
words in the generated text and prints, per topic and dial, the count and the
steered / unsteered ratio (both counts plus one, so a topic the unsteered
model never mentions still gives a finite ratio).

The bar (issue 21): a ratio above 1.5 for at least one feature at λ = 1, and
the effect growing with the dial.

Layer 0 is used because its residual stream still says which token was read,
so a feature there means a word; layer 1's residual already holds the guess of
the next token, and steering there pushes whatever usually follows the word.

Usage: python bench/steering_effect.py [--seeds 10] [--tokens 40]
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import re
import sys
import tempfile
import urllib.parse

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import openai  # noqa: E402

from tests import harness  # noqa: E402
from tests.http_helpers import call  # noqa: E402

SAE = "sae_millm-tiny-res-l0"
LAYER = 0
STRENGTH = 3.0
DIALS = (0.5, 1.0, 2.0)
TOPICS = {
    "weather": ("weather", "rain", "raining", "rains", "sunny", "umbrella", "cloudy", "wind"),
    "cats": ("cat", "cats", "sleep", "sleeps"),
    "trains": ("train", "trains", "station", "rails"),
    "numbers": ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"),
}
PROMPTS = ("Tell me a story.", "Hello!", "What do you do in the morning?",
           "Describe the town.")


def pick_feature(port: int, words: tuple[str, ...]) -> dict:
    """The feature whose strongest tokens hold the most of these words."""
    scores: dict[int, tuple[int, dict]] = {}
    for word in words:
        query = urllib.parse.urlencode({"query": word, "limit": 256})
        reply = call(port, "GET", f"/api/saes/{SAE}/features?{query}")
        assert reply.status_code == 200, reply.text
        for feature in reply.json()["features"]:
            hits = sum(t["count"] for t in feature["top_tokens"]
                       if t["token"].strip().lower() in words)
            best = scores.get(feature["index"], (0, feature))[0]
            scores[feature["index"]] = (max(best, hits), feature)
    if not scores:
        raise SystemExit(f"no feature of {SAE} fires on any of {words}")
    return max(scores.values(), key=lambda s: (s[0], -s[1]["index"]))[1]


def count(texts: list[str], words: tuple[str, ...]) -> int:
    pattern = re.compile(r"\b(" + "|".join(words) + r")\b", re.IGNORECASE)
    return sum(len(pattern.findall(t)) for t in texts)


async def generate(client: openai.AsyncOpenAI, seeds: int, tokens: int,
                   profile: str | None = None, dial: float | None = None) -> list[str]:
    extra = {}
    if profile is not None:
        extra = {"profile": profile, "steering_intensity": dial}

    async def one(prompt: str, seed: int) -> str:
        reply = await client.chat.completions.create(
            model="millm-tiny", messages=[{"role": "user", "content": prompt}],
            max_tokens=tokens, temperature=1.0, seed=seed, extra_body=extra)
        return reply.choices[0].message.content or ""

    return list(await asyncio.gather(*(one(p, s) for p in PROMPTS for s in range(seeds))))


async def measure(port: int, seeds: int, tokens: int) -> dict:
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                                max_retries=0, timeout=120)
    results = {"unsteered": await generate(client, seeds, tokens)}
    for topic, words in TOPICS.items():
        feature = pick_feature(port, words)
        reply = call(port, "POST", "/api/profiles", {"name": f"topic-{topic}", "entries": [
            {"layer": LAYER, "feature": feature["index"], "strength": STRENGTH,
             "sae_id": SAE}]})
        assert reply.status_code == 200, reply.text
        results[topic] = {"feature": feature}
        for dial in DIALS:
            results[topic][dial] = await generate(client, seeds, tokens, f"topic-{topic}", dial)
    await client.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="per prompt")
    parser.add_argument("--tokens", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stack = harness.OwnStack(pathlib.Path(tmp), MILLM_LOG_LEVEL="WARNING")
        try:
            reply = call(stack.http_port, "POST", f"/api/saes/{SAE}/attach")
            assert reply.status_code == 200, reply.text
            results = asyncio.run(measure(stack.http_port, args.seeds, args.tokens))
        finally:
            stack.stop()

    runs = len(PROMPTS) * args.seeds
    print(f"steering effect: {SAE} (layer {LAYER}), strength {STRENGTH} × λ, "
          f"{runs} generations per condition ({len(PROMPTS)} prompts × {args.seeds} seeds), "
          f"{args.tokens} tokens, temperature 1, same seeds steered and unsteered")
    print(f"{'topic':<9} {'feature':>7}  {'fires on':<34} {'unsteered':>9} "
          + " ".join(f"{'λ=' + str(d):>13}" for d in DIALS))
    best, growing = 0.0, []
    for topic, words in TOPICS.items():
        row = results[topic]
        feature = row["feature"]
        fires = ", ".join(t["token"].strip() for t in feature["top_tokens"][:4])
        base = count(results["unsteered"], words)
        cells, counts = [], []
        for dial in DIALS:
            n = count(row[dial], words)
            counts.append(n)
            ratio = (n + 1) / (base + 1)
            if dial == 1.0:
                best = max(best, ratio)
            cells.append(f"{n:>5} ({ratio:>4.1f}x)")
        print(f"{topic:<9} {feature['index']:>7}  {fires[:34]:<34} {base:>9} "
              + " ".join(f"{c:>13}" for c in cells))
        if all(a <= b for a, b in zip(counts, counts[1:], strict=False)):
            growing.append(topic)
    print(f"best steered / unsteered topic-word ratio at λ=1: {best:.1f}  (bar: > 1.5)")
    print(f"topics whose count grows with the dial (λ = {', '.join(map(str, DIALS))}): "
          f"{len(growing)} of {len(TOPICS)} ({', '.join(growing) or 'none'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
