"""What a call's `temperature` and `top_p` get: every sample is drawn at the batch's own (the run's
`rollout.temperature` and `rollout.top_p`; an eval batch's at the eval temperature), since the
log-probs recorded and the learner's ratio are computed there. A request that asks for the same, or
asks nothing, is served as asked; one that asks for another is, by `environment.agent_sampling`:

```
 "run"    ─► served at the batch's; the response's `cadence` says so: `temperature`, `top_p`, and
             `overridden` (the parameters asked otherwise)
 "refuse" ─► 400 invalid_request_error, param the parameter, its message naming the batch's value
```

Invariant: no request changes what a sample is drawn at; values compare equal within 1e-6 (a
temperature written in a TOML file and in an agent's JSON is the same float). A value served otherwise
is logged (`agent_sampling_overridden`) the first time this `Sampling` meets it, not at every call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import structlog

from cadence.rollout.agent.chat import ApiError, ChatRequest

log = structlog.get_logger()

Other = Literal["run", "refuse"]
TOLERANCE = 1e-6


@dataclass(frozen=True)
class Sampling:
    """What a batch samples at, and what a request asking otherwise gets."""

    temperature: float = 1.0
    top_p: float = 1.0
    other: Other = "run"
    # (parameter, value asked) already logged by this process: an agent's every call asks the same
    _told: set[tuple[str, float]] = field(default_factory=set, init=False, compare=False, repr=False)

    def overridden(self, request: ChatRequest) -> list[str]:
        """The parameters `request` asks otherwise than the batch samples at (served at the batch's);
        `ApiError` 400 instead when such requests are refused."""
        asked = {"temperature": request.temperature, "top_p": request.top_p}
        held = {"temperature": self.temperature, "top_p": self.top_p}
        other = [k for k, v in asked.items() if v is not None and abs(v - held[k]) > TOLERANCE]
        if other and self.other == "refuse":
            name = other[0]
            raise ApiError(
                400,
                f"{name} = {asked[name]}: this endpoint samples at the run's {name} = {held[name]} (the"
                f" one its log-probs are trained at); leave {name} unset or send {held[name]}",
                param=name,
                code="unsupported_value",
            )
        for name in other:
            value = asked[name]
            if value is not None and (name, value) not in self._told:
                self._told.add((name, value))
                log.info("agent_sampling_overridden", param=name, asked=value, served=held[name])
        return other

    def extension(self, overridden: list[str]) -> dict[str, object]:
        """The response's `cadence` fields that say what the call was sampled at."""
        return {"temperature": self.temperature, "top_p": self.top_p, "overridden": overridden}
