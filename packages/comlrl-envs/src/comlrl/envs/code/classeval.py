"""Cooperative ClassEval (``classeval``): two agents write different methods of one class.

ClassEval (Du et al. 2023, "ClassEval: A Manually-Crafted Benchmark to Evaluate LLMs on
Class-level Code Generation", FudanSELab; **data license CC BY-NC 4.0: non-commercial
use only**) gives 100 Python classes, each with a skeleton (imports, class docstring,
constructor, method signatures and docstrings), a reference solution and ``unittest``
test classes (one per method plus one for the whole class).

The methods of ``methods_info`` are dealt in order: agent 1 writes the first
``ceil(n/2)``, agent 2 the rest. Both see the whole skeleton (so each knows what the other
provides) and are told which methods are theirs. The combined program is::

    <import_statement> + <agents' imports>
    class <Name>:
        <skeleton's class docstring, class attributes and __init__ (kept as given)>
        <agent 1's methods> <agent 2's methods>

Prompts are :class:`comlrl.core.ChatPrompt` s (a system message with the agent's share, the
skeleton and the request for only those methods in one fenced block) whose ``raw`` text,
for base models, ends with ``class <Name>:``. Each agent's completion may be indented
method definitions (continuing that ``class`` line), a full ``class`` block, or top-level
``def``s taking ``self`` (fenced or not, with prose around them). Only methods with a non-trivial body are kept; an agent's definitions of
the teammate's methods or of ``__init__`` are dropped; other extra methods (private
helpers) are kept.

Tests: the ``unittest`` classes are turned into a HumanEval-format ``check(candidate)``
(the class under test is the candidate) with one test unit per ``test_*`` method, each run
as its own ``unittest`` suite (so ``setUp``/``tearDown``/``setUpClass`` apply); a unit
passes when that test method succeeds. The sandbox imports only the standard library, so
the classes whose tests need ``numpy``, ``PIL``, ``docx``, ``nltk``, ``gensim``,
``pandas``, ``openpyxl``, ``PyPDF2``, ``bs4`` or ``netifaces`` cannot pass there (see
:data:`NON_STDLIB_MODULES`).
"""

from __future__ import annotations

import ast
import json
import math
import textwrap
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from comlrl.core import Feedback, JointAction, Prompt, RewardBatch, Task
from comlrl.envs.code.chat_prompts import continue_conversation, method_messages
from comlrl.envs.code.extract import has_nontrivial_body, parse_code, parse_prefix
from comlrl.envs.code.feedback import agent_feedback_text, feedback_comment_block
from comlrl.envs.code.hacks import hack_signals
from comlrl.envs.code.humaneval import default_split_ranges
from comlrl.envs.sandbox import CheckJob, SandboxLimits, SandboxPool, Verdict, split_test

__all__ = [
    "ClassEvalTask",
    "load_classeval",
    "classeval_check_source",
    "NON_STDLIB_MODULES",
    "SAME_PROCESS_UNTRUSTED",
]

NON_STDLIB_MODULES = frozenset(
    {"numpy", "PIL", "docx", "nltk", "gensim", "pandas", "openpyxl", "PyPDF2", "bs4", "netifaces"}
)
"""Third-party modules some ClassEval classes import; the sandbox cannot import them."""

_REQUIRED = ("task_id", "skeleton", "test", "class_name", "methods_info")

SAME_PROCESS_UNTRUSTED = frozenset(
    {"builtins", "trace_hook", "gc", "frame_access", "module_patch", "class_assignment"}
    | {"native", "signal"}
)
"""Hack signals (:func:`~comlrl.envs.code.hacks.hack_signals`) that void a ClassEval
verdict: its tests run in the program's own process, where a program reaching frames,
``gc``, trace hooks or patching modules could forge the outcome. No reference solution
carries any of them."""

_RUNNER = '''
_COMLRL_DUNDERS = (
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__", "__len__",
    "__contains__", "__iter__", "__hash__", "__add__", "__radd__", "__sub__", "__rsub__",
    "__abs__", "__round__", "__float__", "__int__", "__index__",
)
_COMLRL_RESTORE = globals().get("__comlrl_restore__", lambda: None)
_COMLRL_MRO = type.__dict__["__mro__"]
_COMLRL_VARS = type.__dict__["__dict__"]
_COMLRL_C_KINDS = ("wrapper_descriptor", "method_descriptor", "builtin_function_or_method")


def _comlrl_program_answers(value, depth=0):
    """Whether comparing or truth-testing value would run code that is not the stdlib's."""
    if depth > 50:
        return True
    cls = type(value)
    for klass in _COMLRL_MRO.__get__(cls, type):
        attrs = _COMLRL_VARS.__get__(klass, type)
        for name in _COMLRL_DUNDERS:
            if name not in attrs or attrs[name] is None:
                continue
            fn = attrs[name]
            kind = type(fn)
            if kind.__name__ in _COMLRL_C_KINDS and kind.__module__ == "builtins":
                continue
            if kind is type(_comlrl_program_answers) and not fn.__code__.co_filename.startswith("<"):
                continue
            return True
    if cls in (list, tuple, set, frozenset):
        return any(_comlrl_program_answers(v, depth + 1) for v in value)
    if cls is dict:
        return any(
            _comlrl_program_answers(k, depth + 1) or _comlrl_program_answers(v, depth + 1)
            for k, v in value.items()
        )
    return False


def _comlrl_guarded(assertion):
    def guarded(*args, **kwargs):
        _COMLRL_RESTORE()
        for value in (*args, *kwargs.values()):
            if _comlrl_program_answers(value):
                raise AssertionError(
                    f"{type(value).__name__}: the test would compare a value whose comparison "
                    "the program defines"
                )
        return assertion(*args, **kwargs)

    return guarded


def _comlrl_run_test(candidate, case, method):
    """Run one unittest test method; raise AssertionError with its failure, else True.

    Run with CheckJob(same_process=True): __comlrl_restore__ (from the sandbox) puts
    unittest back as it was before the program loaded. Skips count as failures. Every
    assert* method of the test case refuses values whose comparison, truth value
    or arithmetic the program's own code would answer (a returned object whose __eq__
    is always True gets no credit).
    """
    test = case(method)
    for name in dir(test):
        if name.startswith("assert") and callable(getattr(test, name)):
            setattr(test, name, _comlrl_guarded(getattr(test, name)))
    result = unittest.TestResult()
    unittest.TestSuite([test]).run(result)
    _COMLRL_RESTORE()
    for _, trace in result.errors + result.failures:
        lines = [ln for ln in trace.strip().splitlines() if ln.strip()]
        raise AssertionError(lines[-1][:300] if lines else "test failed")
    if result.skipped or result.expectedFailures or result.unexpectedSuccesses:
        raise AssertionError(f"test {method} was skipped or marked as an expected failure")
    if result.testsRun != 1:
        raise AssertionError(f"test {method} did not run")
    return True
'''


def load_classeval(path: str | Path) -> list[dict[str, Any]]:
    """Read ClassEval rows from a ``.json`` list (``ClassEval_data.json``) or ``.jsonl``.

    Raises:
        FileNotFoundError: when ``path`` does not exist.
        ValueError: for an unknown extension or a row missing a required field.
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(
            f"ClassEval file not found: {file}; pass path= to a local ClassEval_data.json "
            "(https://github.com/FudanSELab/ClassEval, data CC BY-NC 4.0)"
        )
    name = file.name.lower()
    if name.endswith(".jsonl"):
        with open(file, encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    elif name.endswith(".json"):
        data = json.loads(file.read_text(encoding="utf-8"))
        rows = list(data.values()) if isinstance(data, dict) else list(data)
    else:
        raise ValueError(f"unsupported ClassEval file {file}: use .json or .jsonl")
    for i, row in enumerate(rows):
        missing = [k for k in _REQUIRED if not isinstance(row, dict) or k not in row]
        if missing:
            raise ValueError(f"{file}: row {i} lacks field(s) {missing}; need {list(_REQUIRED)}")
    return rows


def _test_methods(test: str) -> list[tuple[str, str, str]]:
    """``(class_name, method_name, method_source)`` of every ``test_*`` method, in order."""
    out = []
    for node in ast.parse(test).body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name.startswith("test"):
                    out.append((node.name, item.name, ast.unparse(item)))
    return out


def classeval_check_source(test: str, imports: Sequence[str] = ()) -> str:
    """A ClassEval ``unittest`` source as a HumanEval-format test with one unit per method.

    Args:
        test: the row's ``test`` field (``unittest.TestCase`` classes).
        imports: the row's ``import_statement`` lines (the tests may use them).

    Raises:
        ValueError: when ``test`` does not parse or has no ``test_*`` methods.
    """
    try:
        module = ast.parse(test)
    except SyntaxError as exc:
        raise ValueError(f"ClassEval test source does not parse: {exc}") from exc
    kept = [
        ast.unparse(node)
        for node in module.body
        if not (isinstance(node, ast.If) and "__main__" in ast.unparse(node.test))
    ]
    methods = _test_methods(test)
    if not methods:
        raise ValueError("ClassEval test source has no test_* methods")
    units = "\n".join(
        f"    assert _comlrl_run_test(candidate, {cls}, {name!r})" for cls, name, _ in methods
    )
    head = "\n".join(["import unittest", *imports])
    return f"{head}\n\n" + "\n\n".join(kept) + f"\n\n{_RUNNER}\n\ndef check(candidate):\n{units}\n"


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


_INSTRUCTIONS = """\
# Two programmers implement one Python class together.
# Your part: the method(s) {mine} of class `{cls}`.
# Your teammate writes {theirs}; you may call them.
# Write only your methods, in full, as methods of the class (indented by 4 spaces).
"""


class ClassEvalTask(Task):
    """Two-agent ClassEval: each agent writes its share of one class's methods.

    Reward of one joint action, in ``[0, 1]``:

    =====  ===============================================================================
    0.05   x fraction of agent 1's methods it defined with a non-trivial body
    0.05   x fraction of agent 2's methods it defined with a non-trivial body
    0.10   the combined class loaded in the sandbox without error
    0.80   x fraction of test units (``test_*`` methods) passed
    =====  ===============================================================================

    ClassEval's tests need the class's live objects, so they run in the program's own
    process (``CheckJob(same_process=True)``; unittest restored before each assertion,
    assertions refuse values whose comparisons the program wrote, skips fail). A program
    that carries any of :data:`SAME_PROCESS_UNTRUSTED` (frames, ``gc``, trace hooks,
    module patching, ...) earns no test credit, since only the static check stands
    between it and the verdict there.

    Methods left out or stubbed are absent from the class, so their tests fail: an empty
    answer earns 0, stubs earn 0, a program that exits early, crashes or times out earns
    no test credit (the sandbox's honest channel, :mod:`comlrl.envs.sandbox.harness`). A
    joint action in which neither agent defined any of its methods is not run
    (verdict ``"not_run"``, reward 0).

    Splits (disjoint, by row index): the last fifth of the rows is ``test``
    (``ClassEval_80``-``ClassEval_99``), the rest ``train`` (``ClassEval_0``-``_79``);
    ``train_range``/``test_range`` override.

    Multi-turn: :meth:`feedback` gives each agent the verdict, the first failing test
    method (its source) and error, its own previous methods and the teammate's method
    signatures (its ``info`` carries the joint action's ``completions``); ``done`` when
    every test passed. Chat prompts continue the conversation with the agent's previous
    completion and that feedback; ``raw`` texts are rebuilt with it as ``#`` comments
    (see :mod:`comlrl.envs.code.chat_prompts`).

    Args:
        path: ``ClassEval_data.json`` or a file in its schema (required; the data is not
            bundled, and its license is CC BY-NC 4.0).
        limit: keep at most this many rows per split.
        timeout_s: wall-clock limit per program (seconds; all units of a class together).
        assert_timeout_s: time budget per test method (seconds).
        max_workers: concurrent sandboxes (``None``: the number of usable CPUs).
        memory_mb: address-space limit per program (MiB).
        train_range, test_range: optional ``(start, stop)`` row slices for the splits.
        executor: sandbox executor kind (``"fork"`` or ``"exec"``).
        max_turns: the most turns an episode may take.

    Raises:
        ValueError: when ``path`` is missing, or for an invalid argument.
    """

    name = "classeval"
    #: Where the examples come from (``comlrl tasks`` prints it).
    data_source = "no copy ships: task.kwargs.path=<ClassEval_data.json>"
    num_agents = 2
    max_turns = 4

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        limit: int | None = None,
        timeout_s: float = 30.0,
        assert_timeout_s: float | None = 5.0,
        max_workers: int | None = None,
        memory_mb: int | None = 1024,
        train_range: tuple[int, int] | None = None,
        test_range: tuple[int, int] | None = None,
        executor: str = "fork",
        max_turns: int = 4,
    ) -> None:
        if path is None:
            raise ValueError(
                "classeval needs its data file: pass path= to a local ClassEval_data.json "
                "(FudanSELab/ClassEval; CC BY-NC 4.0), e.g. task.kwargs.path=... on the CLI"
            )
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0 or None, got {limit}")
        if int(max_turns) < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        for label, rng in (("train_range", train_range), ("test_range", test_range)):
            if rng is not None and (len(rng) != 2 or rng[0] > rng[1]):
                raise ValueError(f"{label} must be (start, stop) with start <= stop, got {rng}")
        self.path = path
        self.limit = limit
        self.max_turns = int(max_turns)
        self.limits = SandboxLimits(
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            executor=executor,  # type: ignore[arg-type]  # validated by SandboxLimits
        )
        self.assert_timeout_s = assert_timeout_s
        self.max_workers = max_workers
        self.ranges = {"train": train_range, "test": test_range}
        self._rows: list[dict[str, Any]] | None = None
        self._pool: SandboxPool | None = None

    # ----------------------------------------------------------------- data
    def load(self, split: str = "train") -> list[dict[str, Any]]:
        """Rows of ``split`` (``"train"`` or ``"test"``), each with the added fields
        ``entry_point`` (the class name), ``check_test`` (HumanEval-format test source),
        ``agent_methods`` (two lists of method names) and ``reference_program``.

        Raises:
            ValueError: for another split name, or a malformed row.
            FileNotFoundError: when the data file is missing.
        """
        if split not in self.ranges:
            raise ValueError(f"unknown split {split!r}; classeval has 'train' and 'test'")
        if self._rows is None:
            self._rows = [self._prepare(r) for r in load_classeval(self.path)]  # type: ignore[arg-type]
        rows = self._rows
        rng = self.ranges[split] or default_split_ranges(len(rows))[split]
        rows = rows[rng[0] : rng[1]]
        if self.limit is not None:
            rows = rows[: self.limit]
        return [dict(r) for r in rows]

    @staticmethod
    def _prepare(row: Mapping[str, Any]) -> dict[str, Any]:
        names = [m["method_name"] for m in row["methods_info"]]
        half = math.ceil(len(names) / 2)
        out = dict(row)
        out["entry_point"] = row["class_name"]
        out["agent_methods"] = [names[:half], names[half:]]
        out["check_test"] = classeval_check_source(row["test"], row.get("import_statement", ()))
        out["reference_program"] = row.get("solution_code", "")
        return out

    def reference_jobs(self, split: str = "test") -> list[CheckJob]:
        """Each class's reference ``solution_code`` of ``split`` as a sandbox job."""
        return [
            CheckJob(r["reference_program"], r["check_test"], r["entry_point"], same_process=True)
            for r in self.load(split)
        ]

    # --------------------------------------------------------------- prompts
    def prompts(self, example: Mapping[str, Any], history: Sequence[Feedback] = ()) -> list[Prompt]:
        """``[agent1_prompt, agent2_prompt]`` as chat prompts.

        Chat form: a system message naming the agent's methods and the teammate's, and
        the class skeleton with the request to write only those methods inside
        ``class <Name>:`` in one fenced block; later turns continue the conversation (the
        agent's previous completion, then the feedback; see
        :mod:`comlrl.envs.code.chat_prompts`). ``raw`` form (base models): instructions
        naming the agent's methods and the teammate's, (later turns) the latest feedback
        as ``#`` comments, the full skeleton, and ``class <Name>:`` so the completion
        continues with methods."""
        cls = example["class_name"]
        out: list[Prompt] = []
        for a in range(2):
            mine, theirs = example["agent_methods"][a], example["agent_methods"][1 - a]
            text = _INSTRUCTIONS.format(
                mine=", ".join(f"`{m}`" for m in mine) or "(none)",
                theirs=", ".join(f"`{m}`" for m in theirs) or "nothing",
                cls=cls,
            )
            raw = (
                text
                + feedback_comment_block(history, a)
                + "\n# The class skeleton:\n"
                + example["skeleton"].strip()
                + f"\n\n\n# Your methods:\nclass {cls}:\n"
            )
            first = method_messages(example["skeleton"], cls, mine, theirs, a, raw)
            out.append(continue_conversation(first, history, a, raw))
        return out

    # ------------------------------------------------------------ extraction
    def extract_methods(
        self,
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
        kept = {
            name: f for name, f in funcs.items() if name not in theirs and has_nontrivial_body(f)
        }
        for name, f in kept.items():
            if not f.decorator_list and decorators and decorators.get(name):
                f.decorator_list = list(decorators[name])
        mine = [m for m in example["agent_methods"][agent] if m in kept]
        return imports, [ast.unparse(f) for f in kept.values()], mine

    def build_program(
        self, completions: Sequence[str], example: Mapping[str, Any]
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
            imp, srcs, mine = self.extract_methods(completions[a], example, a, decorators)
            imports += [i for i in imp if i not in imports]
            methods += srcs
            defined.append(mine)
        body = "\n\n".join(textwrap.indent(m, "    ") for m in methods)
        program = "\n".join(imports) + "\n\n" + (preamble + "\n\n" if preamble else "")
        program += head + ("\n\n" + body if body else "") + "\n"
        return program, defined

    # ---------------------------------------------------------------- reward
    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint actions (all programs in one sandbox pool run).

        Returns:
            ``K`` rewards in ``[0, 1]`` and ``K`` infos: the sandbox verdict (``status``,
            ``passed``, ``total``, ``fraction``, ``error``, ``errors``, ...) plus
            ``task_id``, ``methods_defined`` (per agent), ``reward_parts`` and
            ``hack_signals`` (``list[str]``, see :func:`comlrl.envs.code.hacks.hack_signals`;
            empty when clean).

        Raises:
            ValueError: when the shapes disagree.
        """
        k = self.check_joint_batch(completions, examples)
        verdicts: list[Verdict | None] = [None] * k
        defined_all: list[list[list[str]]] = []
        signals: list[list[str]] = []
        jobs, index = [], []
        for i, ex in enumerate(examples):
            program, defined = self.build_program([completions[0][i], completions[1][i]], ex)
            defined_all.append(defined)
            signals.append(list(hack_signals(program)))
            total = split_test(ex["check_test"]).num_units
            if not any(defined):
                verdicts[i] = Verdict(
                    "not_run", 0, total, error="not run: neither agent defined its methods"
                )
                continue
            error = _compile_error(program)
            if error is not None:
                verdicts[i] = Verdict("syntax_error", 0, total, error=error)
                continue
            jobs.append(CheckJob(program, ex["check_test"], ex["entry_point"], same_process=True))
            index.append(i)
        if jobs:
            if self._pool is None:
                self._pool = SandboxPool(self.max_workers)
            ran = self._pool.check_many(jobs, self.limits, assert_timeout_s=self.assert_timeout_s)
            for i, v in zip(index, ran, strict=True):
                verdicts[i] = v
        rewards, infos = [], []
        for i, ex in enumerate(examples):
            verdict = verdicts[i]
            assert verdict is not None
            parts = {
                f"agent{a + 1}_methods": 0.05
                * (len(defined_all[i][a]) / max(1, len(ex["agent_methods"][a])))
                for a in range(2)
            }
            parts["program_loaded"] = 0.1 if verdict.program_loaded else 0.0
            untrusted = sorted(set(signals[i]) & SAME_PROCESS_UNTRUSTED)
            parts["tests"] = 0.0 if untrusted else 0.8 * verdict.fraction
            rewards.append(round(min(1.0, max(0.0, sum(parts.values()))), 6))
            info = verdict.as_info()
            info.update(
                task_id=ex.get("task_id"),
                methods_defined=defined_all[i],
                reward_parts=parts,
                hack_signals=signals[i],
            )
            infos.append(info)
        return RewardBatch(rewards, infos)

    # --------------------------------------------------------------- feedback
    def feedback(
        self,
        example: Mapping[str, Any],
        joint_action: JointAction,
        info: Mapping[str, Any],
        turn: int,
    ) -> Feedback:
        """Feedback on one scored joint action (see the class docstring); ``done`` when
        every test passed."""
        methods = _test_methods(example["test"])

        def describe(n: int) -> str | None:
            return methods[n - 1][2] if 0 < n <= len(methods) else None

        codes = [
            "\n\n".join(self.extract_methods(joint_action.completions[a], example, a)[1])
            for a in range(2)
        ]
        texts = tuple(
            agent_feedback_text(info, turn, codes[a], codes[1 - a], describe) for a in range(2)
        )
        return Feedback(
            texts,
            done=info.get("status") == "passed",
            info={
                "status": info.get("status"),
                "passed": info.get("passed"),
                "total": info.get("total"),
                "turn": turn,
                "completions": tuple(joint_action.completions),
            },
        )

    def close(self) -> None:
        """Shut the sandbox pool down. Safe to call twice; the task stays usable."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def _compile_error(program: str) -> str | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(program, "<program>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, MemoryError, RecursionError, OverflowError) as exc:
        return f"combined program does not compile: {exc}"
    return None
