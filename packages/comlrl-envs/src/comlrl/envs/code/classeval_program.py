"""Cooperative ClassEval's texts: the raw prompt each agent continues, each agent's
methods taken out of its completion, and the combined class.

The combined program is::

    <import_statement> + <agents' imports>
    class <Name>:
        <skeleton's class docstring, class attributes and __init__ (kept as given)>
        <agent 1's methods> <agent 2's methods>

Only methods with a non-trivial body are kept; an agent's definitions of the teammate's
methods or of ``__init__`` are dropped; other extra methods (private helpers) are kept.
Used by :class:`~comlrl.envs.code.classeval.ClassEvalTask`.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from comlrl.core import Feedback
from comlrl.envs.code.extract import has_nontrivial_body, parse_code, parse_prefix
from comlrl.envs.code.feedback import feedback_comment_block

__all__ = ["build_program", "extract_methods", "raw_prompt"]

_INSTRUCTIONS = """\
# Two programmers implement one Python class together.
# Your part: the method(s) {mine} of class `{cls}`.
# Your teammate writes {theirs}; you may call them.
# Write only your methods, in full, as methods of the class (indented by 4 spaces).
"""


def raw_prompt(example: Mapping[str, Any], agent: int, history: Sequence[Feedback] = ()) -> str:
    """Agent ``agent``'s ``raw`` prompt text (base models).

    Instructions naming the agent's methods and the teammate's, (after turn 0) the latest
    feedback as ``#`` comments, the full skeleton, and ``class <Name>:`` so that the
    completion continues with methods.
    """
    cls = example["class_name"]
    mine, theirs = example["agent_methods"][agent], example["agent_methods"][1 - agent]
    text = _INSTRUCTIONS.format(
        mine=", ".join(f"`{m}`" for m in mine) or "(none)",
        theirs=", ".join(f"`{m}`" for m in theirs) or "nothing",
        cls=cls,
    )
    return (
        text
        + feedback_comment_block(history, agent)
        + "\n# The class skeleton:\n"
        + example["skeleton"].strip()
        + f"\n\n\n# Your methods:\nclass {cls}:\n"
    )


def extract_methods(
    completion: str,
    example: Mapping[str, Any],
    agent: int,
    decorators: Mapping[str, list[ast.expr]] | None = None,
) -> tuple[list[str], list[str], list[str]]:
    """Agent ``agent``'s code: ``(imports, method_sources, own_methods_defined)``.

    Accepts indented methods continuing the raw prompt's ``class <Name>:`` line, or
    (chat answers) fenced blocks, a whole ``class`` or top-level ``def``s taking
    ``self``, with prose around them (see :func:`~comlrl.envs.code.extract.parse_code`).

    ``method_sources`` are unindented method definitions (non-trivial bodies only; the
    teammate's methods and ``__init__`` dropped); ``own_methods_defined`` names the
    agent's assigned methods among them. A method written without decorators gets
    the skeleton's (``decorators``: name -> decorator nodes, e.g. ``@staticmethod``).
    """
    first = next((ln for ln in completion.split("\n") if ln.strip()), "")
    module: ast.Module | None
    if "```" not in completion and first[:1].isspace():  # continues `class <Name>:`
        parsed = parse_prefix("class _Part:\n" + completion)
        module = parsed[1] if parsed is not None else None
    else:  # fenced blocks (each dedented), or prose before the first def/class dropped
        module = parse_code(completion)
    if module is None:
        return [], [], []
    theirs = set(example["agent_methods"][1 - agent]) | {"__init__"}
    imports: list[str] = []
    funcs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in module.body:
        if isinstance(node, ast.Import) or (
            isinstance(node, ast.ImportFrom) and node.module != "__future__"
        ):
            imports.append(ast.unparse(node))
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    funcs[item.name] = item
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            funcs[node.name] = node
    kept = {name: f for name, f in funcs.items() if name not in theirs and has_nontrivial_body(f)}
    for name, f in kept.items():
        if not f.decorator_list and decorators and decorators.get(name):
            f.decorator_list = list(decorators[name])
    mine = [m for m in example["agent_methods"][agent] if m in kept]
    return imports, [ast.unparse(f) for f in kept.values()], mine


def build_program(
    completions: Sequence[str], example: Mapping[str, Any]
) -> tuple[str, list[list[str]]]:
    """The combined program and, per agent, its assigned methods it defined."""
    cls = example["class_name"]
    stubs = {m["method_name"] for m in example["methods_info"]}
    preamble, head = _split_skeleton(
        example["skeleton"], cls, stubs, example.get("class_constructor", "")
    )
    decorators = _stub_decorators([example["skeleton"], example.get("solution_code", "")], cls)
    imports = list(example.get("import_statement") or [])
    methods: list[str] = []
    defined: list[list[str]] = []
    for a in range(2):
        imp, srcs, mine = extract_methods(completions[a], example, a, decorators)
        imports += [i for i in imp if i not in imports]
        methods += srcs
        defined.append(mine)
    body = "\n\n".join(textwrap.indent(m, "    ") for m in methods)
    program = "\n".join(imports) + "\n\n" + (preamble + "\n\n" if preamble else "")
    program += head + ("\n\n" + body if body else "") + "\n"
    return program, defined


def _split_skeleton(
    skeleton: str, class_name: str, stub_names: set[str], constructor: str = ""
) -> tuple[str, str]:
    """``(module_preamble, class_head)``: top-level code other than the class, and the class
    line with its docstring, attributes and constructor (the method stubs removed).

    Three of ClassEval's skeletons do not parse (an unterminated docstring, typographic
    quotes); then the row's ``class_constructor`` is used instead.
    """
    module = _parse_class_source(skeleton, class_name) or _parse_class_source(
        constructor, class_name
    )
    if module is None:
        return "", f"class {class_name}:\n    pass"
    pre, head = [], f"class {class_name}:\n    pass"
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            keep = [
                item
                for item in node.body
                if not (
                    isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and item.name in stub_names
                )
            ]
            node.body = keep or [ast.Pass()]
            head = ast.unparse(node)
        else:
            pre.append(ast.unparse(node))
    return "\n".join(pre), head


def _parse_class_source(source: str, class_name: str) -> ast.Module | None:
    """``source`` parsed, if it parses and defines ``class_name`` at top level."""
    try:
        module = ast.parse(source)
    except SyntaxError:
        return None
    if any(isinstance(n, ast.ClassDef) and n.name == class_name for n in module.body):
        return module
    return None


def _stub_decorators(sources: Sequence[str], class_name: str) -> dict[str, list[ast.expr]]:
    """Decorators of the methods of ``class_name`` in the first of ``sources`` that parses
    and defines it (the skeleton, else the reference: a few skeletons do not parse)."""
    module = next(
        (m for m in (_parse_class_source(s, class_name) for s in sources) if m is not None),
        None,
    )
    if module is None:
        return {}
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return {
                item.name: item.decorator_list
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.decorator_list
            }
    return {}
