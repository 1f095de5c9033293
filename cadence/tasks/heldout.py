"""The held-out eval set: prompts the run never trains on, the same for the run and `cadence eval`.

- digits, arithmetic: `eval.prompts` prompts of the task's own generator seeded as "period -1"
  (`task.prompts(-1, n)`, seeded `<task>/<seed>/-1`), a seed stream training (periods 0, 1, ...) never
  uses. The prompts are disjoint in seed, not necessarily in text: the digits task has only 100
  distinct two-digit prompts, so some texts also occur in training.
- file, reasoning_gym: the last `eval.prompts` records; the dispatcher's task is built with them held
  out (`make_task(..., held_out=held_out(cfg))`), so training walks only the others.
- `eval.path`: the first `eval.prompts` records of that file (all with 0), read like the file task's.

Invariant: eval prompt ids are -1, -2, ... (never a training id, which is >= 0), so an eval sample's seed
`sample_seed(seed, version, id, i)` is never a training sample's; the set depends only on the config.
"""

from __future__ import annotations

from cadence.config import EvalConfig, TaskConfig
from cadence.tasks.base import Prompt, Task
from cadence.tasks.dataset import read_records, templated


def held_out(task: TaskConfig, evaluation: EvalConfig) -> int:
    """How many records of a file or reasoning_gym task training must leave to the eval set."""
    if task.name in ("file", "reasoning_gym") and not evaluation.path:
        return evaluation.prompts
    return 0


def eval_file_records(task_cfg: TaskConfig, evaluation: EvalConfig) -> list[tuple[str, str]]:
    """(prompt, answer) of the first `eval.prompts` records of `eval.path` (all with 0), each prompt set
    in the task's template."""
    rows = read_records(evaluation.path, task_cfg.prompt_field, task_cfg.answer_field)
    return templated(task_cfg.prompt_template, rows[: evaluation.prompts or len(rows)])


def eval_prompts(task_cfg: TaskConfig, evaluation: EvalConfig, task: Task) -> list[Prompt]:
    """The eval set of a run whose training task is `task` (see the module docstring)."""
    if evaluation.path:
        texts = eval_file_records(task_cfg, evaluation)
    elif task_cfg.name in ("file", "reasoning_gym"):
        records: list[tuple[str, str]] = getattr(task, "records")  # noqa: B009
        texts = records[len(records) - evaluation.prompts :] if evaluation.prompts else []
    else:
        texts = [(p.text, p.answer) for p in task.prompts(-1, evaluation.prompts)]
    return [Prompt(-(i + 1), text, answer) for i, (text, answer) in enumerate(texts)]
