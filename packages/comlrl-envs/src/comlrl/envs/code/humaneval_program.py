"""Cooperative HumanEval's texts: the raw prompt each agent continues, the code taken
back out of its completion, and the combined program.

Agent 1 writes the helper (``aux``), agent 2 the entry point. Extraction
(:mod:`comlrl.envs.code.extract`) keeps only imports, functions, classes and plain
assignments, and enforces the roles syntactically: agent 1's definitions of the entry
point and agent 2's definitions of the helper are dropped (agent 1's helper always wins).
The combined program is::

    <prompt preamble: imports and given helper functions> + agent 1 code + agent 2 code
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from typing import Any

from comlrl.core import Feedback
from comlrl.envs.code.extract import (
    complete_function,
    defined_functions,
    has_nontrivial_body,
    keep_definitions,
    parse_code,
    parse_prefix,
    strip_code_fences,
)
from comlrl.envs.code.feedback import feedback_comment_block
from comlrl.envs.code.humaneval_data import split_prompt

__all__ = ["build_program", "extract_helper", "extract_main", "raw_prompts"]

_HELPER_INSTRUCTIONS = """\
# Two programmers solve one problem together.
# Your part: write a helper function `{helper}` that makes the function below easier to
# implement. Your teammate writes `{entry}` and can call `{helper}`.
# Write only `{helper}` (with a full body and any imports it needs); do not write `{entry}`.
"""

_MAIN_INSTRUCTIONS = """\
# Two programmers solve one problem together.
# Your teammate wrote a helper function `{helper}(...)` that you can call; it is defined
# in the same module. Complete the body of `{entry}` below.
"""


def raw_prompts(
    example: Mapping[str, Any], helper_name: str, history: Sequence[Feedback] = ()
) -> tuple[str, str]:
    """The two agents' ``raw`` prompt texts (base models): ``(helper_text, main_text)``.

    Agent 1's text shows the problem (preamble and the entry point's stub) and ends with
    ``def <helper_name>(``, so its completion continues the helper; agent 2's ends with
    the problem's own prompt, so its completion is the entry point's body. After turn 0
    the latest feedback of ``history`` stands as ``#`` comments right after the
    instructions (:func:`~comlrl.envs.code.feedback.feedback_comment_block`).
    """
    entry = example["entry_point"]
    preamble, stub = split_prompt(example["prompt"], entry)
    fmt = {"helper": helper_name, "entry": entry}
    helper_raw = (
        _HELPER_INSTRUCTIONS.format(**fmt)
        + feedback_comment_block(history, 0)
        + ("\n" + preamble + "\n" if preamble else "")
        + "\n"
        + stub.rstrip()
        + "\n    ...  # written by your teammate\n\n\n"
        + f"def {helper_name}("
    )
    main_raw = (
        _MAIN_INSTRUCTIONS.format(**fmt)
        + feedback_comment_block(history, 1)
        + "\n"
        + example["prompt"].lstrip("\n")
    )
    return helper_raw, main_raw


def extract_helper(completion: str, entry_point: str, helper_name: str) -> str:
    """Agent 1's code: imports and definitions, without any ``entry_point``.

    A completion that writes ``def <helper_name>(`` anywhere (a chat answer: fenced blocks
    or prose around a whole function) is parsed with
    :func:`~comlrl.envs.code.extract.parse_code`; otherwise it is taken as the
    continuation of the raw prompt's ``def <helper_name>(``. Tests, prints, example calls
    and any definition of the entry point are dropped (the teammate writes it). Returns
    ``""`` when nothing parses.
    """
    text = strip_code_fences(completion)
    if _defines(text, helper_name):
        module = parse_code(completion)
    else:
        parsed = parse_prefix(f"def {helper_name}(" + text)
        module = parsed[1] if parsed is not None else None
    if module is None:
        return ""
    return keep_definitions(module, {entry_point})


def extract_main(completion: str, example: Mapping[str, Any], helper_name: str) -> str:
    """Agent 2's code: the entry point (prompt + body, or a full ``def``), no helper.

    A completion that writes ``def <entry_point>(`` anywhere is parsed with
    :func:`~comlrl.envs.code.extract.parse_code` (fences, prose, truncated tail); any
    other is the body that continues the problem's prompt
    (:func:`~comlrl.envs.code.extract.complete_function`). Agent 2's own definition of
    the helper, if any, is dropped: agent 1's always wins (so the cooperation bonus only
    counts calls of the teammate's helper). Returns ``""`` when nothing parses.
    """
    entry = example["entry_point"]
    text = strip_code_fences(completion)
    if _defines(text, entry):
        module = parse_code(completion)
    else:
        parsed = parse_prefix(complete_function(example["prompt"], text))
        module = parsed[1] if parsed is not None else None
    if module is None:
        return ""
    return keep_definitions(module, {helper_name})


def build_program(
    helper_completion: str, main_completion: str, example: Mapping[str, Any], helper_name: str
) -> tuple[str, dict[str, bool]]:
    """The combined program of one joint action, and the reward's structural flags.

    Returns:
        ``(program, flags)``: ``flags`` has ``helper_defined`` and ``main_defined``,
        whether each agent's code defines its function with a non-trivial body (a
        statement other than a docstring, ``pass`` or ``...``).
    """
    entry = example["entry_point"]
    preamble, _ = split_prompt(example["prompt"], entry)
    helper = extract_helper(helper_completion, entry, helper_name)
    main = extract_main(main_completion, example, helper_name)
    flags = {
        "helper_defined": _defines_nontrivial(helper, helper_name),
        "main_defined": _defines_nontrivial(main, entry),
    }
    program = "\n\n\n".join(part for part in (preamble, helper, main) if part) + "\n"
    return program, flags


def _defines(text: str, name: str) -> bool:
    return (
        re.search(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(", text, re.MULTILINE)
        is not None
    )


def _defines_nontrivial(code: str, name: str) -> bool:
    if not code:
        return False
    try:
        module = ast.parse(code)
    except SyntaxError:
        return False
    func = defined_functions(module).get(name)
    return func is not None and has_nontrivial_body(func)
