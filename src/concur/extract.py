"""Read a model's response: its reasoning, its answer, and the program it wrote (docs/data.md, "Reading a response").

Reasoning models and their servers deliver the reasoning in several shapes, and every one is read here:

* a separate field (vLLM's `reasoning_content`, an OpenAI-style `reasoning`): `field`;
* `<think>…</think>` in the text (or `<thinking>`, `<reasoning>`, `<|begin_of_thought|>` pairs): `tags`;
* only `</think>`, from chat templates that open the block themselves (QwQ, DeepSeek-R1): `close_tag`;
* `<think>` never closed: the response was cut inside its reasoning: `open_tag`;
* no tags at all (raw completions): the split is inferred at the start of the final answer: `inferred`;
* nothing before the final answer: `none`.

The program is picked by what it is, not where it stands: the last complete fenced block that defines `ModelNew`,
in the answer first, else in the reasoning (a model that wrote its final program before `</think>` and only prose
after it). Only when no block defines `ModelNew` does the last Python block of the answer stand in.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# reasoning delimiters in use: QwQ, DeepSeek-R1, Qwen3 (<think>); models trained on <thinking> or <reasoning>;
# Sky-T1 / OpenThoughts-style data (<|begin_of_thought|>)
THINK_TAGS = (
    (THINK_OPEN, THINK_CLOSE),
    ("<thinking>", "</thinking>"),
    ("<reasoning>", "</reasoning>"),
    ("<|begin_of_thought|>", "<|end_of_thought|>"),
)
# A fence opens with ``` plus an optional language tag and closes with ``` on a line of its own.
_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)
_FENCE_LINE = re.compile(r"^[ \t]*```([^\n]*)$", re.MULTILINE)  # any fence line; group 1: what follows the ```
_PYTHON_TAGS = {"", "python", "py", "python3"}
_MODEL_NEW = re.compile(r"^[ \t]*class[ \t]+ModelNew\b", re.MULTILINE)
# A line that announces the final answer in an untagged completion ("**Final Answer**", "### Final code",
# "Here is the complete optimized code:", "Putting it all together:"); the answer starts at the last such line
# between the previous fenced block and the final program.
_ANSWER_MARK = re.compile(
    r"^[ \t#*>-]*(?:final (?:answer|code|solution|implementation|version|program)\b"
    r"|here(?:'s| is) (?:the |my )?(?:complete |final |full |optimized |updated )*(?:code|solution|implementation)\b"
    r"|putting it all together\b|the final (?:code|answer|solution))",
    re.IGNORECASE | re.MULTILINE,
)


@dataclass(frozen=True)
class Block:
    start: int  # where the fence line starts in the text it was found in
    end: int  # just past the closing fence
    tag: str
    body: str


@dataclass(frozen=True)
class Extracted:
    reasoning: str
    answer: str
    code: str
    reasoning_source: str  # contracts.REASONING_SOURCES
    code_source: str  # contracts.CODE_SOURCES
    unclosed: bool  # the text ends inside its reasoning or inside a code fence: it was cut off


def fenced_blocks(text: str) -> list[Block]:
    return [Block(m.start(), m.end(), m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]


def ends_inside_fence(text: str) -> bool:
    """The last block was opened with a language tag (```python, ```cpp) and never closed. A bare ``` left over
    after the last block (a stray closing fence, prose after it) is not taken for a cut."""
    infos = _FENCE_LINE.findall(text)
    return len(infos) % 2 == 1 and bool(infos[-1].strip())


def defines_model_new(body: str) -> bool:
    return bool(_MODEL_NEW.search(body))


def _parses(body: str) -> bool:
    try:
        ast.parse(body)
    except (SyntaxError, ValueError):
        return False
    return True


def program_candidates(text: str) -> list[Block]:
    """Every span from a fence line that may open Python (tagged python, bare, or followed by prose, as a stray
    fence before a paragraph is) to the next bare fence line. Unlike `fenced_blocks` the spans may overlap, so a
    stray or unpaired fence earlier in the text cannot swallow the program that follows it."""
    lines = list(_FENCE_LINE.finditer(text))
    spans = []
    for i, line in enumerate(lines):
        info = line.group(1).strip()
        tag = info.lower() if re.fullmatch(r"[\w+.-]*", info) else ""
        if tag not in _PYTHON_TAGS:
            continue
        close = next((c for c in lines[i + 1 :] if not c.group(1).strip()), None)
        if close is not None:
            spans.append(Block(line.start(), close.end(), tag, text[line.end() + 1 : close.start()]))
    return spans


def program_block(text: str) -> Block | None:
    """The last span defining `ModelNew` that parses as Python, else the last one defining it at all."""
    programs = [b for b in program_candidates(text) if defines_model_new(b.body)]
    complete = [b for b in programs if _parses(b.body)]
    return (complete or programs or [None])[-1]


def last_python_block(text: str) -> str:
    """The last fenced block tagged python (or untagged); empty when there is none."""
    blocks = [b.body for b in fenced_blocks(text) if b.tag in _PYTHON_TAGS]
    return blocks[-1].strip() + "\n" if blocks else ""


def _code(block: Block | None) -> str:
    return block.body.strip() + "\n" if block else ""


def pick_program(reasoning: str, answer: str) -> tuple[str, str]:
    """(code, code_source): the answer's program, else the reasoning's, else the answer's last Python block."""
    block = program_block(answer)
    if block:
        return _code(block), "answer"
    block = program_block(reasoning)
    if block:
        return _code(block), "reasoning"
    fallback = last_python_block(answer)
    if fallback:
        return fallback, "answer"
    stripped = answer.strip()
    if defines_model_new(stripped) and _parses(stripped):  # a program written without a fence
        return stripped + "\n", "answer"
    return "", ""


def split_tagged(response: str) -> tuple[str, str, str] | None:
    """(reasoning, answer, source) from think tags (any pair of THINK_TAGS: the one whose closing tag comes last,
    else whose opening tag comes first); None when the text has none."""
    closes = [(response.rfind(close), open_, close) for open_, close in THINK_TAGS if close in response]
    if closes:
        at, open_, close = max(closes)
        head = response[:at]
        source = "tags" if open_ in head else "close_tag"
        reasoning = head.replace(open_, "").replace(close, "")
        return reasoning.strip(), response[at + len(close) :].strip(), source
    opens = [(response.find(open_), open_) for open_, _ in THINK_TAGS if open_ in response]
    if opens:
        at, open_ = min(opens)
        return response[at + len(open_) :].strip(), response[:at].strip(), "open_tag"
    return None


def split_untagged(response: str, cut: bool) -> tuple[str, str, str]:
    """(reasoning, answer, source) of a completion without tags. The answer starts at the last line announcing it
    between the previous fenced block and the final program, else at the final program's fence; everything before
    is reasoning. A response that was cut off, or that has no program, never reached its answer: all reasoning."""
    text = response.strip()
    block = None if cut else program_block(text)
    if block is None:
        return text, "", "inferred" if text else "none"
    previous_end = max((b.end for b in fenced_blocks(text) if b.end <= block.start), default=0)
    marks = list(_ANSWER_MARK.finditer(text, previous_end, block.start))
    start = marks[-1].start() if marks else block.start
    reasoning, answer = text[:start].strip(), text[start:].strip()
    return reasoning, answer, "inferred" if reasoning else "none"


def extract(response: str, reasoning: str | None = None, cut: bool = False) -> Extracted:
    """Split `response` (and a backend's separate `reasoning` field) into reasoning, answer and program.

    `cut`: the backend reported the response as cut at its token cap (finish_reason `length`)."""
    tagged = split_tagged(response)
    if reasoning and reasoning.strip():
        extra, answer = (tagged[0], tagged[1]) if tagged else ("", response.strip())
        thought, source = "\n\n".join(p for p in (reasoning.strip(), extra) if p), "field"
        unclosed = ends_inside_fence(answer)
    elif tagged:
        thought, answer, source = tagged
        unclosed = source == "open_tag" or ends_inside_fence(answer)
    else:
        unclosed = ends_inside_fence(response)
        thought, answer, source = split_untagged(response, cut or unclosed)
    code, code_source = pick_program(thought, answer)
    return Extracted(thought, answer, code, source, code_source, unclosed)
