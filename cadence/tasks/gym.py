"""The reasoning-gym task: problems from a reasoning-gym generator, checked by the generator itself.

`task.gym_size` problems of `task.gym_dataset` are generated once, seeded by the run seed, and walked
like the file task's records (`cadence.tasks.dataset.walk`). A response is correct when the dataset's
own `score_answer` gives its final answer (the extracted one, else the whole response stripped) 1.0.
Invariant: reward = format_weight * (finished and an answer was stated)
+ (1 - format_weight) * correct, in 0..1.
"""

from __future__ import annotations

from typing import Any

from cadence.config import TaskConfig
from cadence.tasks.answers import extract_answer, is_correct
from cadence.tasks.base import Prompt, Score
from cadence.tasks.dataset import check_held_out, record_prompts, records_alphabet, stated_reward, templated


def generate(name: str, size: int, seed: int, options: dict[str, Any] | None = None) -> Any:
    """The reasoning-gym dataset `name` of `size` problems, seeded, with the generator's own `options`;
    a clear ValueError if unavailable or an option is unknown."""
    if size < 1:
        raise ValueError(f"a reasoning-gym dataset needs a size >= 1, got {size}")
    try:
        import reasoning_gym
    except ImportError:
        raise ValueError("the reasoning_gym task needs reasoning-gym (pip install 'cadence[data]')") from None
    try:
        return reasoning_gym.create_dataset(name, size=size, seed=seed, **(options or {}))
    except (ValueError, TypeError, AssertionError) as exc:
        raise ValueError(f"reasoning-gym dataset {name!r}: {exc}") from None


def problems(cfg: TaskConfig, seed: int) -> tuple[Any, list[dict[str, Any]]]:
    """The generator of `task.gym_dataset` and its `task.gym_size` problems, seeded by the run seed;
    a ValueError naming the key if it cannot make them."""
    if cfg.gym_size < 1:
        raise ValueError(f"task.gym_size must be >= 1, got {cfg.gym_size}")
    try:
        dataset = generate(cfg.gym_dataset, cfg.gym_size, seed)
    except ValueError as exc:
        raise ValueError(f"task.gym_dataset = {cfg.gym_dataset!r}: {exc}") from None
    return dataset, [dataset[i] for i in range(len(dataset))]


def problem_records(cfg: TaskConfig, entries: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(prompt, answer) of each generated problem, the prompt set in `task.prompt_template`."""
    return templated(cfg.prompt_template, [(str(e["question"]), str(e["answer"])) for e in entries])


class ReasoningGymTask:
    """`held_out`: the last that many problems are the eval set's; training walks the others only."""

    def __init__(self, cfg: TaskConfig, seed: int, held_out: int = 0) -> None:
        self.cfg = cfg
        self.seed = seed
        self.dataset, self.entries = problems(cfg, seed)
        self.records = problem_records(cfg, self.entries)
        # score() receives the prompt text and the answer: they find the entry the generator scores against
        self.by_prompt = {record: entry for record, entry in zip(self.records, self.entries, strict=True)}
        self.alphabet = records_alphabet(self.records)
        self.held_out = check_held_out(held_out, len(self.records))

    def prompts(self, period: int, count: int) -> list[Prompt]:
        return record_prompts(self.records, self.held_out, self.seed, period, count)

    def score(self, prompt: str, response: str, answer: str, finished: bool) -> Score:
        entry = self.by_prompt.get((prompt, answer))
        if entry is None:  # not one of ours: fall back to the math checker
            correct = is_correct(response, answer)
        else:
            given = extract_answer(response)
            try:
                value = self.dataset.score_answer(
                    answer=response.strip() if given is None else given, entry=entry
                )
            except Exception:  # a generator's checker that fails on a malformed answer: not correct
                value = 0.0
            correct = value is not None and float(value) >= 1.0
        reward = stated_reward(self.cfg.format_weight, finished, response, correct)
        return Score(reward=reward, correct=float(correct))
