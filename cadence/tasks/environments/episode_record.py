"""One episode's record as it runs (`Episode`, changed only through its verbs) and what it hands back
(`EpisodeResult`).

Invariant: `tokens`, `mask` and `logprobs` are equally long and hold everything after the prompt in
the order the model read or wrote it: a model turn's ids with mask 1 and their sampled log-probs, an
environment message's ids with mask 0 and log-prob 0.0 (not sampled: no log-prob). An ended episode
takes no more tokens; `end` keeps the first reason given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cadence.tasks.base import Prompt, Score
from cadence.tasks.environments.base import Ending, Environment, Reply, Transcript, Turn
from cadence.tasks.environments.episode_loop import EpisodeLoop
from cadence.tasks.environments.generation import Generated


@dataclass(frozen=True)
class EpisodeResult:
    prompt_id: int
    seed: int
    prompt_tokens: list[int]  # the first message in the chat template: the first turn's context
    tokens: list[int]  # everything after the prompt, model turns and environment messages in order
    mask: list[int]  # 1: sampled by the model; 0: the environment's (context, never trained on)
    logprobs: list[float]  # one a token: the sampled log-prob where mask is 1, 0.0 where it is 0
    turns: list[Turn]  # the first message, then model turns and environment messages alternating
    turn_rewards: list[float | None]  # each answered model turn's own reward (None: none given)
    score: Score
    ended: Ending
    finished: bool  # the last model turn ended on its eos
    tool_calls: int
    tool_errors: int
    timeouts: int  # environment calls cut at their timeout
    env_seconds: float  # time spent in the environment's calls
    env_tokens: int  # tokens the environment's messages took (the mask's zeros)

    @property
    def model_turns(self) -> int:
        return sum(turn.author == "model" for turn in self.turns)


@dataclass
class Episode:
    prompt: Prompt
    seed: int
    deadline: float  # the clock's time past which the episode ends
    env: Environment | None = None  # None: its factory failed
    loop: EpisodeLoop | None = None  # where its environment's calls run (None: the caller's loop)
    prompt_tokens: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    turn_rewards: list[float | None] = field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    timeouts: int = 0
    env_seconds: float = 0.0
    finished: bool = False
    ended: Ending | None = None

    @property
    def live(self) -> bool:
        return self.ended is None

    @property
    def name(self) -> str:
        return self.env.name if self.env is not None else "environment"

    @property
    def model_turns(self) -> int:
        return sum(turn.author == "model" for turn in self.turns)

    def context(self) -> list[int]:
        """What the model reads next: the prompt's ids and every id after it."""
        return self.prompt_tokens + self.tokens

    def begin(self, message: str, ids: list[int]) -> None:
        self.prompt_tokens = list(ids)
        self.turns.append(Turn("environment", message, len(ids)))

    def add_model_turn(self, generated: Generated, text: str) -> None:
        self.tokens += generated.tokens
        self.mask += [1] * len(generated.tokens)
        self.logprobs += generated.logprobs
        self.finished = generated.finished
        self.turns.append(Turn("model", text, len(generated.tokens)))

    def record_reply(self, reply: Reply) -> None:
        self.turn_rewards.append(reply.reward)
        self.tool_calls += reply.tool_calls
        self.tool_errors += reply.tool_errors

    def add_message(self, message: str, ids: list[int]) -> None:
        self.tokens += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.turns.append(Turn("environment", message, len(ids)))

    def note(self, text: str) -> None:
        """Say in the transcript what the model did not read (a message past the token budget)."""
        self.turns.append(Turn("environment", text, 0))

    def end(self, reason: Ending) -> None:
        if self.ended is None:
            self.ended = reason

    def transcript(self) -> Transcript:
        return Transcript(tuple(self.turns), self.ended or "done")

    def result(self, score: Score) -> EpisodeResult:
        return EpisodeResult(
            prompt_id=self.prompt.prompt_id,
            seed=self.seed,
            prompt_tokens=self.prompt_tokens,
            tokens=self.tokens,
            mask=self.mask,
            logprobs=self.logprobs,
            turns=self.turns,
            turn_rewards=self.turn_rewards,
            score=score,
            ended=self.ended or "done",
            finished=self.finished,
            tool_calls=self.tool_calls,
            tool_errors=self.tool_errors,
            timeouts=self.timeouts,
            env_seconds=self.env_seconds,
            env_tokens=self.mask.count(0),
        )
