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
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from comlrl.core import Feedback, JointAction, Prompt, RewardBatch
from comlrl.envs.code._suite import (
    SandboxedSuite,
    clipped_reward,
    compile_error,
    default_split_ranges,
    read_rows,
    turn_feedback,
)
from comlrl.envs.code.chat_prompts import continue_conversation, method_messages
from comlrl.envs.code.classeval_program import build_program, extract_methods, raw_prompt
from comlrl.envs.code.classeval_tests import classeval_check_source, unittest_methods
from comlrl.envs.code.feedback import agent_feedback_text, mask_expected
from comlrl.envs.code.hacks import hack_signals
from comlrl.envs.sandbox import CheckJob, Verdict, split_test

__all__ = [
    "ClassEvalTask",
    "load_classeval",
    "NON_STDLIB_MODULES",
]

NON_STDLIB_MODULES = frozenset(
    {"numpy", "PIL", "docx", "nltk", "gensim", "pandas", "openpyxl", "PyPDF2", "bs4", "netifaces"}
)
"""Third-party modules some ClassEval classes import; the sandbox cannot import them."""

_REQUIRED = ("task_id", "skeleton", "test", "class_name", "methods_info")


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
    return read_rows(file, _REQUIRED, "ClassEval", (".json", ".jsonl"))


class ClassEvalTask(SandboxedSuite):
    """Two-agent ClassEval: each agent writes its share of one class's methods.

    Reward of one joint action, in ``[0, 1]``:

    =====  ===============================================================================
    0.05   x fraction of agent 1's methods it defined with a non-trivial body
    0.05   x fraction of agent 2's methods it defined with a non-trivial body
    0.10   the combined class loaded in the sandbox without error
    0.80   x fraction of test units (``test_*`` methods) passed
    =====  ===============================================================================

    ClassEval's ``unittest`` classes run in the sandbox's test process, the class under
    test in the candidate's process (see :mod:`comlrl.envs.code.classeval_tests`): the
    tests drive the program's objects through handles and decide every comparison
    themselves; a unit passes only when its test reported success. The verdict alone
    decides the credit: the static hack signals of the program (``info["hack_signals"]``)
    are for monitoring and metrics, never a gate (how a program spells an import changes
    nothing).

    Methods left out or stubbed are absent from the class, so their tests fail: an empty
    answer earns 0, stubs earn 0, a program that exits early, crashes or times out earns
    no test credit (the sandbox's honest channel, :mod:`comlrl.envs.sandbox.harness`). A
    joint action in which neither agent defined any of its methods is not run
    (verdict ``"not_run"``, reward 0).

    Splits (disjoint, by row index): the last fifth of the rows is ``test``
    (``ClassEval_80``-``ClassEval_99``), the rest ``train`` (``ClassEval_0``-``_79``);
    ``train_range``/``test_range`` override.

    Multi-turn: :meth:`feedback` gives each agent the verdict, the first failing test
    methods (``feedback="tester"``: the name and source with the expected values of its
    assertions replaced by ``...``, the program's last call and what came back, its own
    errors; ``"verbatim"``: the source as written and the error), its own previous methods
    and the teammate's method signatures (its ``info`` carries the joint action's ``completions``); ``done`` when
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
        memory_mb: memory limit of one program's run, all its processes together (MiB;
            see :class:`comlrl.envs.sandbox.SandboxLimits`).
        train_range, test_range: optional ``(start, stop)`` row slices for the splits.
        executor: sandbox executor kind (``"fork"`` or ``"exec"``).
        max_turns: the most turns an episode may take.
        feedback: ``"tester"`` (default: the failing test method with its expected values
            hidden, the program's own output and errors) or ``"verbatim"`` (the failing
            test method quoted whole; warns), see :mod:`comlrl.envs.code.feedback`.

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
        feedback: str = "tester",
    ) -> None:
        if path is None:
            raise ValueError(
                "classeval needs its data file: pass path= to a local ClassEval_data.json "
                "(FudanSELab/ClassEval; CC BY-NC 4.0), e.g. task.kwargs.path=... on the CLI"
            )
        super().__init__(
            path,
            limit=limit,
            timeout_s=timeout_s,
            assert_timeout_s=assert_timeout_s,
            max_workers=max_workers,
            memory_mb=memory_mb,
            train_range=train_range,
            test_range=test_range,
            executor=executor,
            max_turns=max_turns,
            feedback=feedback,
        )

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
            CheckJob(r["reference_program"], r["check_test"], r["entry_point"])
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
            raw = raw_prompt(example, a, history)
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
        """Agent ``agent``'s code: ``(imports, method_sources, own_methods_defined)``
        (:func:`~comlrl.envs.code.classeval_program.extract_methods`)."""
        return extract_methods(completion, example, agent, decorators)

    def build_program(
        self, completions: Sequence[str], example: Mapping[str, Any]
    ) -> tuple[str, list[list[str]]]:
        """The combined program and, per agent, its assigned methods it defined
        (:func:`~comlrl.envs.code.classeval_program.build_program`)."""
        return build_program(completions, example)

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
            error = compile_error(program)
            if error is not None:
                verdicts[i] = Verdict(
                    "syntax_error", 0, total, error=f"combined program does not compile: {error}"
                )
                continue
            jobs.append(CheckJob(program, ex["check_test"], ex["entry_point"]))
            index.append(i)
        ran = self._run_jobs(verdicts, jobs, index)
        rewards, infos = [], []
        for i, ex in enumerate(examples):
            verdict = ran[i]
            parts = {
                f"agent{a + 1}_methods": 0.05
                * (len(defined_all[i][a]) / max(1, len(ex["agent_methods"][a])))
                for a in range(2)
            }
            parts["program_loaded"] = 0.1 if verdict.program_loaded else 0.0
            parts["tests"] = 0.8 * verdict.fraction
            rewards.append(clipped_reward(parts))
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
        methods = unittest_methods(example["test"])

        def describe(n: int) -> str | None:
            if not 0 < n <= len(methods):
                return None
            if self.feedback_mode == "verbatim":
                return methods[n - 1][2]
            return f"{methods[n - 1][1]} (expected values hidden): " + mask_expected(
                methods[n - 1][2], (example["class_name"],)
            )

        codes = [
            "\n\n".join(self.extract_methods(joint_action.completions[a], example, a)[1])
            for a in range(2)
        ]
        texts = tuple(
            agent_feedback_text(
                info, turn, codes[a], codes[1 - a], describe, mode=self.feedback_mode
            )
            for a in range(2)
        )
        return turn_feedback(texts, joint_action, info, turn)
