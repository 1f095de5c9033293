"""What an environment is: one episode's other side, from its first message to its score.

An episode is made for one prompt and one sample seed (`EnvironmentFactory`); `start` gives the first
user message, or the conversation up to it (a system prompt, worked examples, then the user message:
`ChatMessage`s); `step` answers each model turn (its text) with the next message (a tool's result, a
game's feedback, a user's reply), whether the episode is done, and optionally a reward for that turn;
`score` judges the whole episode with the task's `Score` (reward, correctness, reward parts). Every
method is `async`, so an environment may await a tool, a sandbox or a judge.

How the names map onto other frameworks' (see docs/environments.md for an adapter sketch):

| here | verifiers (`MultiTurnEnv`) | SkyRL-gym (`BaseTextEnv`) |
|---|---|---|
| `start()` | the dataset row's prompt with `system_prompt` and `few_shot` (and `setup_state`) | `init(prompt)` (its message list) |
| `step(text)` | `env_response(messages, state)` | `step(action)` |
| `Reply.done` | `is_completed(messages, state)` | `done` of the step output |
| `Reply.reward` | a per-turn reward kept in `state` | `reward` of the step output |
| `score(transcript)` | the rubric's reward functions | the reward of the last step |
| `close()` | (cleanup of `state`) | `close()` |

Invariant: an environment never sees token ids, only text; it is driven by one runner at a time, one
call after another (`start`, then `step` per model turn, then `score`, then `close`), never two at once.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cadence.tasks.base import Prompt, Score

Author = Literal["environment", "model"]

# why an episode ended: the environment said so (done), a bound was reached (max_turns, token_budget,
# episode_timeout; context: the engine's positions are full), or the environment failed (error)
Ending = Literal["done", "max_turns", "token_budget", "episode_timeout", "context", "error"]


@dataclass(frozen=True)
class ChatMessage:
    """One message of the conversation `start` may give: a system prompt, a worked example's turns
    (the assistant's and the tools' are the environment's words, never trained on), and last the
    user's message."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str


# what `start` gives: the first user message, or the conversation that ends with it
Opening = str | Sequence[ChatMessage]


def opening_problem(opening: object) -> str | None:
    """Why `opening` is not what `start` may give; None when it is."""
    if isinstance(opening, str):
        return None
    if not isinstance(opening, Sequence) or not opening:
        return f"start gave a {type(opening).__name__}, not a str or a non-empty sequence of ChatMessage"
    if not all(isinstance(m, ChatMessage) and isinstance(m.content, str) for m in opening):
        return "start gave a sequence that is not all ChatMessage of str content"
    if any(m.role not in ("system", "user", "assistant", "tool") for m in opening):
        return "start gave a ChatMessage whose role is not system, user, assistant or tool"
    if opening[-1].role != "user":
        return f"start's conversation ends on a {opening[-1].role} message, not the user's"
    return None


def opening_text(opening: Opening) -> str:
    """The opening as the transcript shows it: the message itself, or one `role: content` a message."""
    if isinstance(opening, str):
        return opening
    return "\n\n".join(f"{message.role}: {message.content}" for message in opening)


@dataclass(frozen=True)
class Reply:
    """An environment's answer to one model turn. Made with a field of the wrong type, it raises
    `TypeError` naming the field (the runner logs it as the environment's failure)."""

    message: str = ""  # what the model reads next (feedback, a user's reply); unused when done
    done: bool = False  # the episode is over: no further model turn
    reward: float | None = None  # this turn's own reward, recorded beside the episode's score
    tool_calls: int = 0  # tool calls the turn made
    tool_errors: int = 0  # of which the tool answered with an error
    tool_results: tuple[str, ...] = ()  # one message a call, in the chat template's tool role; when
    # given, they are what the model reads (`message` is then left empty)

    def __post_init__(self) -> None:
        if isinstance(self.tool_results, list):
            object.__setattr__(self, "tool_results", tuple(self.tool_results))
        if problem := reply_problem(self):
            raise TypeError(problem)

    @property
    def text(self) -> str:
        """The reply as the transcript shows it."""
        return "\n\n".join(self.tool_results) if self.tool_results else self.message


def reply_problem(reply: Reply) -> str | None:
    """Why a `Reply`'s fields are not of their types (naming the field); None when they are."""
    checks: list[tuple[str, bool, str]] = [
        ("message", isinstance(reply.message, str), "a str"),
        ("done", isinstance(reply.done, bool), "a bool"),
        ("reward", reply.reward is None or _real(reply.reward), "a number or None"),
        ("tool_calls", _count(reply.tool_calls), "an int >= 0"),
        ("tool_errors", _count(reply.tool_errors), "an int >= 0"),
        (
            "tool_results",
            isinstance(reply.tool_results, tuple) and all(isinstance(r, str) for r in reply.tool_results),
            "a tuple of str",
        ),
    ]
    for name, fits, wanted in checks:
        if not fits:
            value = getattr(reply, name)
            return f"Reply.{name} must be {wanted}, got {type(value).__name__} {str(value)[:40]!r}"
    if reply.tool_results and reply.message:
        return "Reply.message must be empty when Reply.tool_results are given"
    return None


def _real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class Turn:
    """One message of an episode: who wrote it, its text, and how many tokens it took."""

    author: Author
    text: str
    tokens: int


@dataclass(frozen=True)
class Transcript:
    """What `score` judges: the episode's messages in order (the first message, then model and
    environment turns alternating) and why it ended."""

    turns: tuple[Turn, ...]
    ended: Ending

    @property
    def responses(self) -> list[str]:
        """The model's turns, in order."""
        return [turn.text for turn in self.turns if turn.author == "model"]

    @property
    def last_response(self) -> str | None:
        """The model's last turn, or None when it made none."""
        responses = self.responses
        return responses[-1] if responses else None


@dataclass(frozen=True)
class Setting:
    """What the runner tells an environment before `start`: how the model writes a tool call (its
    chat template's family: "hermes" or "llama3", `cadence.tasks.tools.calls`) and how long one step
    may take."""

    tool_format: str = "hermes"
    step_timeout_s: float = 10.0


class Environment(abc.ABC):
    """One episode's environment. Subclass it and give `start`, `step` and `score`; `close` frees
    what the episode held (a sandbox, a connection). `name` names it in logs; `setting` is set by the
    runner before `start`."""

    name: str = "environment"
    setting: Setting = Setting()

    def tools(self) -> Sequence[Mapping[str, Any]]:
        """The tools the model may call, as OpenAI-format JSON schemas: the chat template renders them
        into the opening (its own `tools` support, else a Hermes-style system block). None by default."""
        return ()

    @abc.abstractmethod
    async def start(self) -> Opening:
        """The first user message, or the conversation that ends with it (SkyRL-gym: `init`)."""

    @abc.abstractmethod
    async def step(self, response: str) -> Reply:
        """The answer to the model's turn `response` (verifiers: `env_response` and `is_completed`;
        SkyRL-gym: `step`). CPU-bound work must be bounded by construction or run where the step's
        timeout can stop it (a subprocess): a timeout cancels the coroutine, it cannot stop a thread."""

    @abc.abstractmethod
    async def score(self, transcript: Transcript) -> Score:
        """The episode's score, also when it ended at a bound (`transcript.ended`)."""

    async def close(self) -> None:
        """Free what the episode held (most environments hold nothing); called once, after `score`."""
        return None


# makes the environment of one episode: (the prompt, the sample seed) -> a fresh environment
EnvironmentFactory = Callable[[Prompt, int], Environment]
