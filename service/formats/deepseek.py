"""DeepSeek's families: R1 (and its distills) and V3.1. Both group calls
between `<｜tool▁calls▁begin｜>` and `<｜tool▁calls▁end｜>` and think in
`<think>`...`</think>` (R1's template opens the block in the generation
prompt). R1 names the call's type and fences its arguments:

    <｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜>

V3.1 writes `<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>`."""

from service.formats.base import THINK, CallSyntax, Family

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"

R1_CALLS = CallSyntax("deepseek_r1", call_open=f"{CALL_BEGIN}function{SEP}",
                      name_close="\n```json\n", call_close=f"\n```{CALL_END}", separator="\n",
                      group_open=CALLS_BEGIN, group_close=CALLS_END)
V31_CALLS = CallSyntax("deepseek_v3_1", call_open=CALL_BEGIN, name_close=SEP,
                       call_close=CALL_END, separator="", group_open=CALLS_BEGIN,
                       group_close=CALLS_END)


def _deepseek(template: str) -> bool:
    return CALLS_BEGIN in template or "<｜Assistant｜>" in template


def detect_r1(template: str, special_tokens: tuple[str, ...]) -> bool:
    return _deepseek(template) and ("```json" in template or CALLS_BEGIN not in template)


def detect_v31(template: str, special_tokens: tuple[str, ...]) -> bool:
    return _deepseek(template)


R1 = Family("deepseek_r1", R1_CALLS, THINK, detect_r1,
            "DeepSeek markers (`<｜Assistant｜>`, `<｜tool▁calls▁begin｜>`) with fenced "
            "```json arguments, or no tool markup")
V3_1 = Family("deepseek_v3_1", V31_CALLS, THINK, detect_v31,
              "DeepSeek markers with bare JSON arguments after `<｜tool▁sep｜>`")
