"""Steering modes and conditions end to end against a running server
(`make run`), over REST only, as docs/steering.md describes them: a clamp at
a feature's current value, a clamp at a high value read back at every
position, an ablate read back as zero, an entry that applies after a trigger
text, and a TopK SAE in SAELens's format attached and steering.

    .venv/bin/python tools/modes_walkthrough.py [--base http://127.0.0.1:8000]
        [--model millm-tiny] [--saes-dir .millm/models/saes] [--key ADMIN_KEY]

It writes profiles named `walkthrough-*` (deleted at the end) and, for the
TopK check, an SAE folder `walkthrough-topk` in the server's SAE directory
(removed at the end; the layer-1 SAE is attached again). It prints what it
found and exits 1 if a check fails. Nothing leaves loopback unless --base
says so.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from workbench_walkthrough import Client  # noqa: E402

L1 = "sae_millm-tiny-res-l1"
QUESTION = [{"role": "user", "content": "Tell me about the sea."}]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="millm-tiny")
    parser.add_argument("--saes-dir", default=".millm/models/saes")
    parser.add_argument("--key", default=None)
    args = parser.parse_args()
    api, failures = Client(args.base, args.key), []

    def check(ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    def chat(profile: str | None = None, **extra) -> dict:
        body = {"model": args.model, "messages": QUESTION, "temperature": 0,
                "max_tokens": 32, **extra}
        if profile:
            body["profile"] = profile
        return api.ok("POST", "/v1/chat/completions", body)

    def readout(feature: int, profile: str | None = None) -> list[float]:
        body = chat(profile, return_sae_activations={
            "sae_id": L1, "positions": "all", "features": [feature]})
        return [p["features"][0]["value"] if p["features"] else 0.0
                for p in body["millm"]["sae_activations"]["positions"]]

    def profile(name: str, *entries: dict) -> str:
        api.call("DELETE", f"/api/profiles/{name}")
        api.ok("POST", "/api/profiles", {"name": name, "entries": list(entries)})
        return name

    api.ok("POST", f"/api/saes/{L1}/attach")
    plain = chat()["choices"][0]["message"]["content"]
    body = chat(return_sae_activations={"sae_id": L1, "positions": "all",
                                        "features": list(range(256))})
    positions = body["millm"]["sae_activations"]["positions"]
    fired = {f["index"] for p in positions for f in p["features"] if f["value"] > 0}
    silent = min(set(range(256)) - fired)
    busiest = max(fired, key=lambda i: sum(1 for p in positions for f in p["features"]
                                           if f["index"] == i))
    print(f"{args.model}: {len(positions)} positions; feature {silent} never fires, "
          f"{busiest} fires most")

    name = profile("walkthrough-keep", {"layer": 1, "feature": silent, "mode": "clamp",
                                        "value": 0})
    check(chat(name)["choices"][0]["message"]["content"] == plain,
          f"clamp of feature {silent} at its current value (0): greedy text unchanged")
    name = profile("walkthrough-high", {"layer": 1, "feature": silent, "mode": "clamp",
                                        "value": 6})
    high = readout(silent, name)
    check(all(abs(v - 6) < 6e-3 for v in high),
          f"clamp at 6: the readout reads {min(high):.4f}..{max(high):.4f} at all "
          f"{len(high)} positions")
    name = profile("walkthrough-gone", {"layer": 1, "feature": busiest, "mode": "ablate"})
    before, after = readout(busiest), readout(busiest, name)
    check(max(before) > 0 and max(after) < 1e-3,
          f"ablate of feature {busiest}: readout max {max(before):.3f} -> {max(after):.2e}")

    words = plain.split()
    trigger = " ".join(words[2:4])
    cut = plain.index(trigger) + len(trigger)
    changed = None
    for feature in range(0, 256, 5):
        name = profile("walkthrough-after", {"layer": 1, "feature": feature, "strength": 12,
                                             "when": {"after_text": trigger}})
        text = chat(name)["choices"][0]["message"]["content"]
        if text[:cut] != plain[:cut]:
            check(False, f"after_text {trigger!r}: text before the trigger changed")
            break
        if text != plain:
            changed = (feature, text)
            break
    check(changed is not None, f"after_text {trigger!r}: identical through the trigger, "
          f"different after it (feature {changed and changed[0]}):\n       unsteered: "
          f"{plain!r}\n       steered:   {changed and changed[1]!r}")

    saes = pathlib.Path(args.saes_dir)
    topk = saes / "walkthrough-topk"
    try:
        shutil.copytree(saes / "millm-tiny-res-l1", topk, dirs_exist_ok=True)
        cfg = json.loads((topk / "cfg.json").read_text())
        cfg.update(architecture="topk", k=8, apply_b_dec_to_input=True,
                   normalize_activations="none")
        (topk / "cfg.json").write_text(json.dumps(cfg))
        listed = {s["id"]: s for s in api.ok("GET", "/api/saes")["saes"]}
        check(listed.get("sae_walkthrough-topk", {}).get("architecture") == "topk",
              "a TopK SAE in SAELens's format is listed as topk")
        api.ok("POST", f"/api/saes/{L1}/detach")  # one SAE per layer
        api.ok("POST", "/api/saes/sae_walkthrough-topk/attach")
        name = profile("walkthrough-topk", {"layer": 1, "feature": busiest, "strength": 12,
                                            "sae_id": "sae_walkthrough-topk"})
        steered = chat(name)["choices"][0]["message"]["content"]
        check(steered != plain, f"the TopK SAE attaches and steers: {steered!r}")
    finally:
        api.call("POST", "/api/saes/sae_walkthrough-topk/detach")
        shutil.rmtree(topk, ignore_errors=True)
        api.call("POST", f"/api/saes/{L1}/attach")
        for p in ("keep", "high", "gone", "after", "topk"):
            api.call("DELETE", f"/api/profiles/walkthrough-{p}")
    print(f"{len(failures)} check(s) failed" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
