"""Turn free-form model completions into Python source that can be combined and run.

Base (completion) models continue a code prompt; chat models answer in prose with fenced
blocks. Both are handled here:

- :func:`strip_code_fences` / :func:`code_blocks`: the Python inside Markdown fences
  (```` ```python ````, ```` ```py ````, bare ```` ``` ````; other languages skipped;
  an unclosed fence runs to the end); without fences, the text from its first line that
  starts a definition, import or decorator (prose before it dropped).
- :func:`parse_code`: each block parsed on its own, a truncated or prose tail trimmed
  (:func:`parse_prefix`), the statements joined.
- :func:`keep_definitions`: imports, functions, classes and plain assignments only;
  prints, example calls, ``if __name__ == "__main__":`` blocks, asserts, ``test_*``
  functions, ``unittest`` test classes and assignments that call the completion's own
  functions are dropped, as are names the agent must not define (its teammate's).

All functions here only *parse* text (``ast``); nothing is executed in this process.
"""

from __future__ import annotations

import ast
import re
import textwrap

__all__ = [
    "strip_code_fences",
    "code_blocks",
    "parse_code",
    "parse_prefix",
    "keep_definitions",
    "defined_functions",
    "has_nontrivial_body",
    "complete_function",
]

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_KEEP = (
    ast.Import,
    ast.ImportFrom,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Assign,
    ast.AnnAssign,
)


def strip_code_fences(text: str) -> str:
    """Return the code inside Markdown fences, or ``text`` unchanged when it has none.

    Several fenced blocks are joined with blank lines; blocks tagged with a language other
    than Python (``text``, ``bash``, ``output``, ...) are skipped. An opening fence with no
    closing fence (a truncated completion) runs to the end of the text.
    """
    if "```" not in text:
        return text
    blocks = []
    for match in _FENCE.finditer(text):
        lang = match.group(1).lower()
        if lang in ("", "python", "py", "python3"):
            blocks.append(match.group(2))
    if not blocks:
        return text.replace("```", "")
    return "\n\n".join(block.rstrip() for block in blocks)


_CODE_START = re.compile(
    r"^(?:(?:async[ \t]+)?def[ \t]|class[ \t]|import[ \t]|from[ \t]+[\w.]+[ \t]+import[ \t]|@\w)",
    re.MULTILINE,
)


def code_blocks(text: str) -> list[str]:
    """The pieces of Python in a completion, each dedented.

    The fenced Python blocks when ``text`` has any (see :func:`strip_code_fences` for the
    languages kept); else the text from its first line that starts (unindented) with
    ``def``, ``async def``, ``class``, ``import``, ``from ... import`` or a decorator, so a
    sentence before the code is dropped; else ``[text]``.
    """
    if "```" in text:
        blocks = [
            textwrap.dedent(match.group(2))
            for match in _FENCE.finditer(text)
            if match.group(1).lower() in ("", "python", "py", "python3")
        ]
        if blocks:
            return blocks
        text = text.replace("```", "")
    start = _CODE_START.search(text)
    return [text[start.start() :] if start else text]


def parse_code(text: str) -> ast.Module | None:
    """Parse the Python of a completion (:func:`code_blocks`), block by block.

    Each block keeps its longest parseable prefix (:func:`parse_prefix`: a truncated tail
    or prose after the code is trimmed), so one broken block does not cost the others.
    Unfenced text whose first definition-like line is prose is tried from the next one.
    Returns one module with the statements of every block that parsed, in order, or
    ``None`` when none did.
    """
    body: list[ast.stmt] = []
    for block in code_blocks(text):
        parsed = parse_prefix(block)
        if parsed is None and "```" not in text:
            # the first code-looking line was prose ("import this into ..."): try the next
            for match in list(_CODE_START.finditer(block))[1:]:
                parsed = parse_prefix(block[match.start() :])
                if parsed is not None:
                    break
        if parsed is not None:
            body.extend(parsed[1].body)
    if not body:
        return None
    return ast.Module(body=body, type_ignores=[])


def parse_prefix(code: str) -> tuple[str, ast.Module] | None:
    """Parse ``code``; if it does not parse, drop trailing lines until it does.

    Completions cut at the token limit usually end mid-statement; the longest parseable
    prefix keeps the complete definitions. Returns ``(source, module)`` of that prefix,
    or ``None`` when no non-empty prefix parses.
    """
    lines = code.rstrip().split("\n")
    while lines:
        source = "\n".join(lines)
        try:
            return source, ast.parse(source)
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            lines.pop()
    return None


def keep_definitions(
    module: ast.Module, drop_functions: set[str] | frozenset[str] = frozenset()
) -> str:
    """Source of ``module``'s imports, functions, classes and assignments only.

    Top-level prints, example calls, asserts, ``if __name__ == "__main__":`` blocks, stray
    expressions and ``from __future__`` imports are dropped, as are tests (functions named
    ``test*``, classes deriving from a ``TestCase``), assignments whose value calls a
    function the module itself defines (``result = aux(3)``: an example run at import
    time), and top-level definitions and assignments that bind a name in
    ``drop_functions``.
    """
    own = {
        node.name
        for node in module.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }
    kept = []
    for node in module.body:
        if not isinstance(node, _KEEP):
            continue
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue  # only legal at the top of a file; never needed here
        if drop_functions and _binds(node) & set(drop_functions):
            continue
        if _is_test(node) or _calls_own(node, own):
            continue
        kept.append(ast.unparse(node))
    return "\n\n".join(kept)


def _is_test(node: ast.stmt) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return node.name.startswith("test")
    if isinstance(node, ast.ClassDef):
        return any(ast.unparse(base).split(".")[-1] == "TestCase" for base in node.bases)
    return False


def _calls_own(node: ast.stmt, own: set[str]) -> bool:
    if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
        return False
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in own
        for n in ast.walk(node.value)
    )


def _binds(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    targets = (
        node.targets
        if isinstance(node, ast.Assign)
        else ([node.target] if isinstance(node, ast.AnnAssign) else [])
    )
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def defined_functions(module: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Top-level functions of ``module`` by name (the last definition wins)."""
    return {
        node.name: node
        for node in module.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def has_nontrivial_body(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """True when ``func``'s body has a statement other than a docstring, ``pass`` or ``...``."""
    for stmt in func.body:
        if isinstance(stmt, ast.Pass):
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # docstring, bare string or Ellipsis
        return True
    return False


def complete_function(prompt: str, completion: str) -> str:
    """Join a prompt ending in a signature + docstring with a completion of its body.

    An unindented body (as chat models often write it) is indented by four spaces. If the
    joined text does not parse, it is cut at the completion's first non-indented line (the
    end of the function) and, failing that, trimmed from the end (see :func:`parse_prefix`).
    """
    body = completion
    lines = [ln for ln in body.split("\n") if ln.strip()]
    if lines and not lines[0][:1].isspace():
        body = textwrap.indent(body, "    ")
    joined = prompt.rstrip("\n") + "\n" + body.lstrip("\n")
    try:
        ast.parse(joined)
        return joined
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        pass
    cut = []
    for line in body.lstrip("\n").split("\n"):
        if line.strip() and not line[:1].isspace():
            break
        cut.append(line)
    return prompt.rstrip("\n") + "\n" + "\n".join(cut)
