"""instructor against miLLM, one path per run (.venv-eco-legacy: instructor
needs openai<3).

Paths: tools (instructor.from_openai's default, Mode.TOOLS: the model's
schema as one forced tool) and json_schema (Mode.JSON_SCHEMA: the schema as
response_format), each with response_model=Weather. Nothing is changed from
instructor's defaults but the base URL, the model, a seed and max_tokens.
"""

from __future__ import annotations

import instructor
import openai
from shared import MAX_TOKENS, PROMPT, SEED, Weather, cli, emit, model_report

base_url, model, path = cli()
modes = {"tools": None, "json_schema": instructor.Mode.JSON_SCHEMA}
if path not in modes:
    raise SystemExit(f"unknown path {path}")
raw = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
client = (instructor.from_openai(raw) if modes[path] is None
          else instructor.from_openai(raw, mode=modes[path]))
weather, completion = client.chat.completions.create_with_completion(
    model=model, response_model=Weather, messages=[{"role": "user", "content": PROMPT}],
    max_tokens=MAX_TOKENS, seed=SEED)
emit(mode=str(client.mode), output=model_report(weather),
     finish_reason=completion.choices[0].finish_reason)
