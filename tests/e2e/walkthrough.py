"""Reading ``docs/api-walkthrough.md`` as a test: its ``sh`` blocks in order, and the outputs it documents.

A documented output is a comment in a block: a whole-line comment right after a command (continued by the
comment lines that follow it), or a comment at the end of a command's line that starts like JSON (``{``,
``[``, or an HTTP status and then ``{``). JSON outputs are compared by shape and key values
(``conforms``): every documented key must be there; strings, booleans, nulls and numbers must be equal
(numbers to the 4 significant digits the document rounds to), except the keys in ``VOLATILE`` (rows chosen
by a strategy, noisy answers, timings), whose values are only required to exist. ``...`` in a documented
output stands for "anything" (a value, the rest of a list or object, part of a string). A text output
(e.g. an error's ``detail`` printed by ``jq -r``) must appear in the block's output, its ``...`` parts
skipped. The documented outputs must appear in the order the document gives them.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

#: Values that differ from run to run (a strategy's random or noisy choices, answers, times, hashes).
VOLATILE = frozenset(
    {"index", "y", "acquisition", "beta", "mean", "std", "best", "theta", "at", "hash", "prev_hash"}
    | {"created_at", "completed_at", "timings", "details", "sha256", "token", "posterior_mean", "answers"}
    | {"sample_id"}
)
ANY = "<any value>"  # what ``...`` stands for, after ``lenient_json``
_RELATIVE = 1e-4  # a documented number stands for any value within 1e-4 of it, relatively ...


class DocNumber(float):
    """A number as the document prints it: it stands for the values that round to it (``tolerance``)."""

    decimals: int

    def __new__(cls, text: str) -> DocNumber:
        number = super().__new__(cls, float(text))
        mantissa = text.lower().split("e")[0]
        number.decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
        exponent = int(text.lower().split("e")[1]) if "e" in text.lower() else 0
        number.decimals -= exponent
        return number

    def tolerance(self) -> float:
        """Half a unit in the last printed place (``2.15``: 0.005), and at least ``_RELATIVE``."""
        return max(0.5 * 10.0 ** (-self.decimals), _RELATIVE * abs(float(self)))


@dataclass
class Expected:
    line: int  # in the document (1-based)
    text: str  # the documented output, the comment markers removed, its lines joined
    json: bool  # documented as JSON (else as text)


@dataclass
class Block:
    section: str
    line: int  # of the opening fence
    code: str
    expected: list[Expected] = field(default_factory=list)


def _output_start(text: str) -> bool:
    return bool(re.match(r"(\d{3} )?[\[{]", text))


def _balanced(text: str) -> bool:
    depth = 0
    in_string = False
    escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
    return depth <= 0


def _quote_state(line: str, state: str | None) -> str | None:
    """The shell quote still open after ``line`` (``'``, ``"`` or None), given the one open before it."""
    escaped = False
    for ch in line:
        if escaped:
            escaped = False
        elif state == "'":
            state = None if ch == "'" else state
        elif ch == "\\":
            escaped = True
        elif state == '"':
            state = None if ch == '"' else state
        elif ch in "'\"":
            state = ch
        elif ch == "#":
            break  # a comment: the rest of the line is not the command's
    return state


def _inline_comment(line: str) -> str | None:
    """The comment at the end of a command's line (a ``#`` after whitespace, outside quotes), if any."""
    quote: str | None = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and i > 0 and line[i - 1] in " \t":
            return line[i + 1 :].strip()
    return None


def blocks(markdown: str) -> list[Block]:
    """The ``sh`` blocks of a markdown document with the outputs each documents."""
    out: list[Block] = []
    section = ""
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        if line.strip() != "```sh":
            i += 1
            continue
        start = i + 1
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        block = Block(section, start, "\n".join(body) + "\n")
        current: Expected | None = None
        previous_is_command = False
        quote: str | None = None  # a quote a command left open on an earlier line (a multi-line body)
        for offset, raw in enumerate(body):
            number = start + 1 + offset
            stripped = raw.strip()
            if quote is not None:
                quote = _quote_state(raw, quote)
                previous_is_command = quote is None and not stripped.endswith("\\")
                continue
            if stripped.startswith("#"):
                content = stripped[1:].strip()
                if current is not None and (not current.json or not _balanced(current.text)):
                    current.text += " " + content
                elif previous_is_command:
                    current = Expected(number, content, _output_start(content))
                    block.expected.append(current)
                else:
                    current = None
                previous_is_command = False
                continue
            current = None
            if not stripped:
                continue
            quote = _quote_state(raw, None)
            continues = quote is not None or stripped.endswith("\\")
            comment = _inline_comment(raw)
            if comment is not None and _output_start(comment):
                current = Expected(number, comment, True)
                block.expected.append(current)
            previous_is_command = not continues
        out.append(block)
    return out


def lenient_json(text: str) -> Any:
    """A documented JSON output as a value (``ANY`` where the document wrote ``...``), or None when it does
    not parse even so."""
    anything = json.dumps(ANY)
    text = re.sub(r"^\d{3} ", "", text.strip())
    text = re.sub(r"\[\s*\.\.\.\s*\]", lambda _: anything, text)
    text = re.sub(r"\{\s*\.\.\.\s*\}", lambda _: anything, text)
    text = re.sub(r":\s*\.\.\.(?=\s*[,}\]])", lambda _: ": " + anything, text)
    text = re.sub(r",\s*\.\.\.\s*(?=[,}\]])", "", text)
    text = re.sub(r"(?<=[\[{])\s*\.\.\.\s*,", "", text)
    try:
        return json.loads(text, parse_float=DocNumber)
    except ValueError:
        return None


def _string_matches(actual: str, expected: str) -> bool:
    if "..." not in expected:
        return actual == expected
    position = 0
    for piece in (p.strip() for p in expected.split("...")):
        if not piece:
            continue
        found = actual.find(piece, position)
        if found < 0:
            return False
        position = found + len(piece)
    return True


def conforms(actual: Any, expected: Any, path: str = "") -> list[str]:
    """How ``actual`` differs from the documented ``expected`` (empty: it conforms)."""
    where = path or "the output"
    if expected == ANY:
        return []
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{where}: expected an object, got {json.dumps(actual)[:80]}"]
        problems = []
        for key, value in expected.items():
            if key not in actual:
                problems.append(f"{where}: no key {key!r} (keys: {', '.join(sorted(actual))})")
            elif key not in VOLATILE:
                problems += conforms(actual[key], value, f"{path}.{key}" if path else key)
        return problems
    if isinstance(expected, list):
        if not isinstance(actual, list):
            return [f"{where}: expected a list, got {json.dumps(actual)[:80]}"]
        if len(actual) < len([e for e in expected if e != ANY]):
            return [f"{where}: {len(actual)} items, the document shows {len(expected)}"]
        problems = []
        for j, value in enumerate(expected):
            if value == ANY:
                break
            problems += conforms(actual[j], value, f"{where}[{j}]")
        return problems
    if isinstance(expected, bool) or expected is None:
        return [] if actual is expected else [f"{where}: {json.dumps(actual)} is not {json.dumps(expected)}"]
    if isinstance(expected, (int, float)):
        ok = isinstance(actual, (int, float)) and not isinstance(actual, bool)
        # ... or, printed with decimals, any value that rounds to it (an integer: within 1e-4, relatively)
        tolerance = expected.tolerance() if isinstance(expected, DocNumber) else _RELATIVE * abs(expected)
        if ok and math.isclose(float(actual), float(expected), rel_tol=0.0, abs_tol=tolerance + 1e-12):
            return []
        return [f"{where}: {json.dumps(actual)} is not {json.dumps(expected)}"]
    if isinstance(expected, str):
        if isinstance(actual, str) and _string_matches(actual, expected):
            return []
        return [f"{where}: {json.dumps(actual)[:120]} is not {json.dumps(expected)[:120]}"]
    return [f"{where}: cannot compare with {expected!r}"]


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def outputs(stdout: str) -> list[Any]:
    """What a block printed: its JSON documents and, between them, its lines of text (as ``str``)."""
    decoder = json.JSONDecoder()
    items: list[Any] = []
    position = 0
    while position < len(stdout):
        if stdout[position].isspace():
            position += 1
            continue
        if stdout[position] in "[{":
            try:
                value, end = decoder.raw_decode(stdout, position)
            except ValueError:
                pass
            else:
                items.append(value)
                position = end
                continue
        end = stdout.find("\n", position)
        end = len(stdout) if end < 0 else end
        items.append(stdout[position:end].strip())
        position = end
    return items


def check(block: Block, stdout: str) -> list[str]:
    """The documented outputs of ``block`` that its run's ``stdout`` does not show (empty: all shown), each
    named by its line in the document."""
    items = outputs(stdout)
    problems: list[str] = []
    position = 0
    for expected in block.expected:
        if expected.json:
            value = lenient_json(expected.text)
            best: list[str] | None = None
            for j in range(position, len(items)):
                if isinstance(items[j], str):
                    continue
                if value is None:  # not JSON even leniently: the keys it names must be there
                    wanted = set(re.findall(r'"(\w+)"\s*:', expected.text))
                    found = wanted - _keys(items[j])
                    differences = [f"no key {k!r}" for k in sorted(found)]
                else:
                    differences = conforms(items[j], value)
                if not differences:
                    position, best = j + 1, []
                    break
                if best is None or len(differences) < len(best):
                    best = differences
            if best:
                problems.append(f"line {expected.line}: " + "; ".join(best[:4]))
            elif best is None:
                problems.append(
                    f"line {expected.line}: no JSON output where the document shows {expected.text}"
                )
        else:
            text = " ".join(
                " ".join(x if isinstance(x, str) else json.dumps(x) for x in items[position:]).split()
            )
            wanted = " ".join(expected.text.split())
            if not _string_matches(text, f"...{wanted}..."):
                problems.append(f"line {expected.line}: the output does not show {wanted[:160]!r}")
    return problems
