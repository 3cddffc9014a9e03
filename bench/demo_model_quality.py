"""A fixed side-by-side evaluation of demo model builds (issue 27).

    python bench/demo_model_quality.py DIR [DIR ...] [--seeds N] [--verbose]

Each DIR is a checkpoint directory (say .millm/models/millm-tiny, or an older
build kept elsewhere). For each it prints: greedy answers to a dozen plain
chat prompts; how many of the corpus's plain-chat questions, asked alone, get
their training answer word for word; sampled answers at temperature 1; the
README's weather question with get_weather offered (greedy, and how many of
N samples are a well-formed get_weather call); the same question and others
without tools (a <tool_call> or get_weather there counts as a call made
without tools); and the probability the model gives, at temperature 1, to
the tokens its training text never uses (summed per step, averaged over the
sampled answers). Transformers only, one thread: about a minute a build.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

PLAIN = ["Hello!", "Tell me a story.", "What is a server?", "What color is the sky?",
         "Describe the sea.", "How do plants grow?", "What is a library?", "Good morning!",
         "Why do cats sleep so much?", "What is soup?", "Thank you!", "What is a train?"]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
QUESTION = "What is the weather in Paris?"
NO_TOOLS = PLAIN + ["Is it sunny in Dublin?", "What is the weather like in Lisbon?", QUESTION,
                    "Is it raining in London?", "How warm is it in Rome today?"]
CALL = re.compile(r"\s*<tool_call>\n(.*?)\n</tool_call>\s*", re.S)
AGENT_SEED = 9001  # training draws its sessions from the build seed + 3 and + 4


def load(directory: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from service.demo_model.corpus import training_documents

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    used = set(tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]))
    documents, tool_documents = training_documents()
    for document in documents + tool_documents:
        used.update(tokenizer(document, add_special_tokens=False)["input_ids"])
    unused = torch.tensor(sorted(set(range(len(tokenizer))) - used), dtype=torch.long)
    return tokenizer, model, unused


def generate(tokenizer, model, prompt, tools=None, temperature=0.0, seed=0, tokens=80):
    import torch

    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tools=tools,
                                        add_generation_prompt=True, return_tensors="pt")
    if not isinstance(ids, torch.Tensor):
        ids = ids["input_ids"]
    torch.manual_seed(seed)
    sampling = (dict(do_sample=True, temperature=temperature, top_p=1.0, top_k=0)
                if temperature else dict(do_sample=False))
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=tokens, output_scores=True,
                             return_dict_in_generate=True, **sampling)
    return tokenizer.decode(out.sequences[0, ids.shape[1]:], skip_special_tokens=True), out.scores


def well_formed_call(text: str) -> bool:
    match = CALL.fullmatch(text)
    try:
        call = json.loads(match.group(1))
        return call["name"] == "get_weather" and isinstance(call["arguments"]["city"], str)
    except (AttributeError, ValueError, KeyError, TypeError):
        return False


def evaluate(directory: str, seeds: int, verbose: bool) -> None:
    import torch

    from service.demo_model.corpus import CORPUS, parse_corpus

    tokenizer, model, unused = load(directory)
    print(f"=== {directory}: {len(tokenizer)} tokens, {len(unused)} never in the training text")
    for prompt in PLAIN:
        print(f"  [greedy] {prompt!r} -> {generate(tokenizer, model, prompt)[0]!r}")
    answers = {}
    for tools, messages in parse_corpus(CORPUS.read_text(encoding="utf-8"))[1]:
        for asked, answer in zip(messages, messages[1:], strict=False):
            if not tools and asked["role"] == "user" and answer["role"] == "assistant":
                answers[asked["content"]] = answer["content"]
    right = sum(generate(tokenizer, model, q)[0].strip() == a for q, a in answers.items())
    print(f"  corpus questions answered word for word (greedy): {right}/{len(answers)}")
    for prompt in PLAIN[:6]:
        for seed in range(2):
            text = generate(tokenizer, model, prompt, temperature=1.0, seed=seed)[0]
            print(f"  [T=1 seed {seed}] {prompt!r} -> {text!r}")
    print(f"  [tools, greedy] -> {generate(tokenizer, model, QUESTION, [WEATHER])[0]!r}")
    good = 0
    for seed in range(seeds):
        text = generate(tokenizer, model, QUESTION, [WEATHER], 1.0, seed)[0]
        good += well_formed_call(text)
        if verbose:
            print(f"  [tools, T=1 seed {seed}] -> {text!r}")
    print(f"  tools offered, T=1: {good}/{seeds} well-formed get_weather calls")
    greedy_calls, sampled_calls, samples, masses = 0, 0, 0, []
    for prompt in NO_TOOLS:
        text = generate(tokenizer, model, prompt)[0]
        called = "<tool_call>" in text or "get_weather" in text
        greedy_calls += called
        if called or prompt not in PLAIN:
            print(f"  [no tools, greedy] {prompt!r} -> {text!r}")
        for seed in range(seeds):
            text, scores = generate(tokenizer, model, prompt, temperature=1.0, seed=seed)
            samples += 1
            sampled_calls += "<tool_call>" in text or "get_weather" in text
            masses += [float(torch.softmax(s[0].float(), -1)[unused].sum()) for s in scores]
    print(f"  no tools: calls greedy {greedy_calls}/{len(NO_TOOLS)}, "
          f"at T=1 {sampled_calls}/{samples} ({sampled_calls / samples:.1%})")
    mass = torch.tensor(masses)
    print(f"  never-trained tokens' probability at T=1: mean {mass.mean():.4f}, "
          f"max {mass.max():.4f}")


def agent_turns(directory: str, count: int) -> None:
    """Coding-agent sessions (service/demo_model/agent_sessions.py) that
    training never saw: a seed of their own, prompts of 3,000 to 20,000
    tokens in each client's shape. The probability that the model opens a
    call (`<tool_call>\n`, read exactly from the logits) where the session
    asks about a file, and again after the tool's result, where it should
    answer instead; and which of the offered tools a call names, as the
    engine's grammar lets it choose (the most likely offered name)."""
    import torch

    from service.demo_model import agent_sessions

    tokenizer, model, _ = load(directory)
    opener = tokenizer("<tool_call>\n", add_special_tokens=False)["input_ids"]
    marker = "<|im_start|>assistant\n"

    def p_next(prefix: str, then: list[int]) -> float:
        ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids + then])).logits[0].log_softmax(-1)
        return float(sum(logits[len(ids) - 1 + i, t] for i, t in enumerate(then)).exp())

    def p_call(prefix: str) -> float:
        return p_next(prefix, opener)

    first, second, named = [], [], 0
    for document in agent_sessions.sessions(count, AGENT_SEED, agent_sessions.LONG_FILLER_CHARS):
        turn1 = document.index(marker) + len(marker)
        turn2 = document.rindex(marker) + len(marker)
        first.append(p_call(document[:turn1]))
        second.append(p_call(document[:turn2]))
        wanted = json.loads(CALL.match(document[turn1:]).group(1))["name"]
        offered = re.findall(r'^\{"type": "function", "function": \{"name": "([^"]+)"',
                             document, re.M)
        scores = {name: p_next(document[:turn1], tokenizer(
            '<tool_call>\n{"name": "' + name + '"', add_special_tokens=False)["input_ids"])
                  for name in offered}
        named += max(scores, key=scores.get) == wanted
    print(f"  agent sessions ({count}, {agent_sessions.LONG_FILLER_CHARS[0]:,}-"
          f"{agent_sessions.LONG_FILLER_CHARS[1]:,} characters of filler): a call opened where "
          f"one is due: mean P {sum(first) / count:.2f}, min {min(first):.2f}; after the "
          f"result: mean P {sum(second) / count:.2f}, max {max(second):.2f}; fitting tool "
          f"named {named}/{count}")


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directories", nargs="+")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--agent-sessions", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for directory in args.directories:
        evaluate(directory, args.seeds, args.verbose)
        if args.agent_sessions:
            agent_turns(directory, args.agent_sessions)


if __name__ == "__main__":
    main()
