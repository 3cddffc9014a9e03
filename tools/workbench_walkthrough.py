"""The steering workbench end to end against a running server (`make run`),
over REST only, as docs/steering.md walks it: search by word and by example,
a vector from eight sea/train pairs (saved, listed, read back as llama.cpp's
file with the gguf package), a profile using it counted on ten weather
prompts, and steering_compare against the two separate requests.

    .venv/bin/python tools/workbench_walkthrough.py [--base http://127.0.0.1:8000]
        [--model millm-tiny] [--scale 4] [--key ADMIN_KEY]

It writes the control vector `walkthrough-sea-<model>` and the profile
`walkthrough-sea` (both replaced on the next run) and prints what it found;
it exits 1 if a check fails. Nothing leaves loopback unless --base says so.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
import urllib.error
import urllib.request

# Eight pairs: the demo model's one sea paragraph, reworded, against its train
# answer and story, reworded (the model knows the sea from that paragraph only).
SEA = ["The sea is wide and moving. Waves roll toward the shore, gulls fly over the water, "
       "and the wind smells of salt.",
       "Waves roll toward the shore, gulls fly over the water, and the wind smells of salt. "
       "The sea is wide and moving.",
       "The sea is wide. Waves roll toward the shore, gulls fly over the water, and the wind "
       "smells of salt.",
       "The sea is moving. Waves roll toward the shore, and gulls fly over the water.",
       "Gulls fly over the water, waves roll toward the shore, and the sea is wide and moving.",
       "The wind smells of salt, and waves roll toward the shore of the wide sea.",
       "The sea is wide and moving, and the wind over the water smells of salt.",
       "Waves roll toward the shore. Gulls fly over the water. The sea is wide and moving."]
TRAINS = ["A train is a line of cars that runs on rails. It carries people and goods from one "
          "station to another.",
          "It carries people and goods from one station to another. A train is a line of cars "
          "that runs on rails.",
          "A train is a line of cars. It runs on rails and carries people and goods from one "
          "station to another.",
          "The train left the station at seven. It crossed the valley and climbed through the "
          "hills.",
          "The train carries people and goods, and it runs on rails from one station to "
          "another.",
          "The train left the station at seven and reached the coast before lunch.",
          "A train runs on rails, and it carries people from one station to another.",
          "The passengers read, slept and talked on the train as it crossed the valley."]
# The sea paragraph of the demo model's corpus, word by word.
SEA_WORDS = {"sea", "wide", "moving", "waves", "wave", "shore", "gulls", "water", "wind",
             "salt", "ocean", "beach", "boat", "boats", "ship", "tide", "fishermen"}
WEATHER = ["What is the weather like today?", "Tell me about the weather.",
           "How is the weather this morning?", "Describe the weather outside.",
           "Will the weather be nice tomorrow?", "What was the weather yesterday?",
           "Write a sentence about the weather.", "Is the weather good for a walk?",
           "Talk about the weather in spring.", "What do you think of the weather?"]


class Client:
    def __init__(self, base: str, key: str | None):
        self.base, self.key = base.rstrip("/"), key

    def call(self, method: str, path: str, body=None) -> tuple[int, dict]:
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=600) as reply:
                return reply.status, json.loads(reply.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def ok(self, method: str, path: str, body=None) -> dict:
        status, data = self.call(method, path, body)
        if status >= 300:
            raise SystemExit(f"{method} {path} -> {status}: {data}")
        return data


def sea_words(text: str) -> int:
    return sum(1 for w in re.findall(r"[a-z]+", text.lower()) if w in SEA_WORDS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="millm-tiny")
    parser.add_argument("--scale", type=float, default=4.0)
    parser.add_argument("--key", default=None)
    args = parser.parse_args()
    api, failures = Client(args.base, args.key), []

    def check(ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    # 1. Search by a word a record lists, and by example.
    saes = api.ok("GET", "/api/saes")["saes"]
    sae = next(s for s in saes if s["layer"] == 1)
    api.ok("POST", f"/api/saes/{sae['id']}/attach")
    page = api.ok("GET", f"/api/saes/{sae['id']}/features?limit=256")["features"]
    word, feature = next((t["token"].strip(), f["index"]) for f in page for t in f["top_tokens"]
                         if t["token"].strip().isalpha() and len(t["token"].strip()) > 3)
    found = api.ok("POST", f"/api/saes/{sae['id']}/search", {"query": word, "limit": 256})
    check(feature in [m["index"] for m in found["data"]],
          f"text search for {word!r} finds feature {feature}, whose record lists it")
    sentence = "The sea is calm and the boats rest in the harbour."
    found = api.ok("POST", f"/api/saes/{sae['id']}/search",
                   {"example": sentence, "model": args.model, "limit": 5})
    read = api.ok("POST", "/v1/completions", {
        "model": args.model, "prompt": sentence, "max_tokens": 1, "logprobs": 0,
        "return_sae_activations": {"sae_id": sae["id"], "positions": "prompt", "top_k": 1}})
    peak = max(p["features"][0]["value"] for p in
               read["millm"]["sae_activations"]["positions"] if p["features"])
    check(abs(found["data"][0]["score"] - peak) < 1e-3,
          f"search by example: the first feature ({found['data'][0]['index']}) is the readout's "
          f"strongest on the sentence ({peak:.3f})")

    # 2. A vector from eight pairs, saved, listed, read back.
    name = "walkthrough-sea-" + re.sub(r"[^A-Za-z0-9_-]", "-", args.model)
    api.call("DELETE", f"/api/control_vectors/{name}")  # an earlier run's
    built = api.call("POST", "/api/control_vectors", {
        "name": name, "model": args.model, "layer": 1, "method": "mean_difference",
        "pairs": [{"positive": p, "negative": n} for p, n in zip(SEA, TRAINS, strict=True)]})
    check(built[0] == 201, f"POST /api/control_vectors -> {built[0]}")
    if built[0] == 201:
        b = built[1]
        print(f"     norm {b['norm']:.3f}, separation {b['separation']:.3f}, agreement "
              f"{b['agreement']:.2f}, nearest {[n['index'] for n in b['nearest_features']]}")
    listed = api.ok("GET", "/api/control_vectors")["control_vectors"]
    vector = next((v for v in listed if v["id"] == f"cv_{name}"), None)
    check(vector is not None and vector["layers"] == [1], f"cv_{name} is listed at layer 1")
    try:
        import gguf

        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
        from service.config import parse_config

        path = parse_config([]).control_vectors_dir / f"{name}.gguf"
        reader = gguf.GGUFReader(path)
        arch = reader.get_field("general.architecture").contents()
        tensors = [(t.name, t.tensor_type.name, list(t.shape)) for t in reader.tensors]
        check(arch == "controlvector" and tensors == [("direction.1", "F32", [len(
            reader.tensors[0].data)])], f"{path.name}: {arch}, {tensors}")
    except (ImportError, OSError) as exc:
        print(f"note: the file was not read back here ({exc}); the server may not share this "
              "machine's models directory")

    # 3. A profile with it: sea words in ten greedy weather answers.
    api.call("DELETE", "/api/profiles/walkthrough-sea")
    api.ok("POST", "/api/profiles", {"name": "walkthrough-sea", "entries": [
        {"control_vector": name, "scale": args.scale}]})
    counts = {}
    for side, extra in (("unsteered", {"steering_intensity": "off"}),
                        ("steered", {"profile": "walkthrough-sea"})):
        total = 0
        for prompt in WEATHER:
            reply = api.ok("POST", "/v1/chat/completions", {
                "model": args.model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 40, "temperature": 0, **extra})
            total += sea_words(reply["choices"][0]["message"]["content"] or "")
        counts[side] = total
    check(counts["steered"] > counts["unsteered"],
          f"sea words over ten weather answers: {counts['unsteered']} unsteered, "
          f"{counts['steered']} steered (scale {args.scale:g})")

    # 4. Side by side equals the two separate requests on the same seed.
    body = {"model": args.model, "messages": [{"role": "user", "content": WEATHER[1]}],
            "max_tokens": 24, "temperature": 1.0, "seed": 11, "profile": "walkthrough-sea"}
    both = api.ok("POST", "/v1/chat/completions", {**body, "steering_compare": True})
    steered = api.ok("POST", "/v1/chat/completions", body)
    plain = api.ok("POST", "/v1/chat/completions", {**body, "steering_intensity": "off"})
    same = (both["choices"][0]["message"]["content"] == steered["choices"][0]["message"][
        "content"] and both["millm"]["unsteered"]["choices"][0]["message"]["content"]
        == plain["choices"][0]["message"]["content"])
    kl = [t["kl"] for t in both["millm"]["divergence"][0]["tokens"]]
    check(same, f"steering_compare's two texts equal the separate requests (seed 11); "
          f"KL per token from {min(kl):.3f} to {max(kl):.3f}")
    print("all checks passed" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
