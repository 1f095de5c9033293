"""The maker of scored groups: a batch of prompts in, one `GroupSamples` a prompt out, generated with
the weights the engine holds, seeded by (seed, period, prompt id, sample), as single-turn completions
scored by the run's reward functions or, with an environment, as whole episodes it scores.

```
 make(prompts, period, samples, evaluation)
   seeds: sample_seed(seed, period, prompt id, i), i < samples
   temperature: the eval one for an eval batch, else the engine's own
   single turn ─► single_turn.complete: one generate_many, each group scored and handed to `ready`
                  as soon as its samples end; `stopped()`: the rest dropped mid-decode; batches
                  offered to `joining` join the call as it decodes (rollout/joining.py)
   episodes    ─► play.Episodes.run: every episode of the batch turn by turn, scored by its
                  environment (agent.episodes.AgentEpisodes.run: every agent of the batch against the
                  endpoint, scored by its return value); the groups handed to `ready` together at the
                  end (none once stopped)
```

Invariant: the same prompts, period, sample count and weights give the same groups whoever makes
them, a rollout worker or `cadence eval`; the engine computes only inside the caller's `hold()`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

from cadence.model.engine import sample_seed
from cadence.model.rollout_engine import JoiningEngine, RolloutEngine, TurnEngine
from cadence.model.tokenizer import TextTokenizer
from cadence.monitor.span import Overlapping
from cadence.rollout.joining import Joining
from cadence.rollout.play import Hold, PlaysEpisodes
from cadence.rollout.results import GroupSamples
from cadence.rollout.single_turn import Ready, Scorer, complete
from cadence.rollout.streaming import engine_generate
from cadence.tasks.base import Prompt


class GroupMaker:
    """Makes a batch's groups on `engine`: `tokenizer` for prompts and texts, `scorer` for single-turn
    completions, `episodes` to play each sample as an episode instead (needs a `TurnEngine`), `seed`
    the run's, `eval_temperature` an eval batch's (0: greedy)."""

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: TextTokenizer,
        scorer: Scorer,
        seed: int,
        eval_temperature: float = 0.0,
        episodes: PlaysEpisodes | None = None,
    ) -> None:
        if episodes is not None and not isinstance(engine, TurnEngine):
            raise TypeError(f"{type(engine).__name__} runs no episodes (environment.name): not a TurnEngine")
        self.engine = engine
        self.tokenizer = tokenizer
        self.scorer = scorer
        self.seed = seed
        self.eval_temperature = eval_temperature
        self.episodes = episodes

    @property
    def joins(self) -> bool:
        """Whether a batch's call takes more groups while it decodes (`make`'s `joining`): single-turn
        groups on an engine that can."""
        return self.episodes is None and isinstance(self.engine, JoiningEngine)

    def seeds(self, period: int, prompt_id: int, samples: int) -> list[int]:
        """The seeds of a group's samples (`sample_seed`)."""
        return [sample_seed(self.seed, period, prompt_id, i) for i in range(samples)]

    async def make(
        self,
        prompts: Sequence[Prompt],
        period: int,
        samples: int,
        evaluation: bool = False,
        hold: Hold = nullcontext,
        waits: Overlapping | None = None,
        ready: Ready | None = None,
        stopped: Callable[[], bool] | None = None,
        joining: Joining[Any] | None = None,
    ) -> list[GroupSamples | None]:
        """The groups of `prompts`, `samples` samples each, made together; with episodes, every
        environment call timed in `waits` when given. `ready(i, group, following)`: each group as soon as it
        is made, and how many are made right behind it; `stopped()`: the batch is no longer wanted (its period closed). None for a group stopped.
        `joining` (when `joins`): batches offered to it while the call decodes join it, their groups
        after the batch's own (same period and sample count: their seeds are the offerer's)."""
        temperature = self.eval_temperature if evaluation else None
        seeded = [(prompt, self.seeds(period, prompt.prompt_id, samples)) for prompt in prompts]
        if self.episodes is None:
            return await complete(
                self.engine, self.tokenizer, self.scorer, seeded, temperature, hold, ready, stopped, joining
            )
        assert isinstance(self.engine, TurnEngine)
        generate = engine_generate(self.engine, temperature, hold)
        groups = [(p, seeds, self.tokenizer.encode_prompt(p.text)) for p, seeds in seeded]
        made = await self.episodes.run(generate, groups, self.tokenizer.eos_id, waits, period)
        if stopped is not None and stopped():
            return [None] * len(made)
        if ready is not None:
            for i, group in enumerate(made):
                await ready(i, group, len(made) - 1 - i)
        return list(made)
