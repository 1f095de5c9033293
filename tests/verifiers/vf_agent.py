"""The test's verifiers environment as an agent (`environment.agent = "tests.verifiers.vf_agent:agent"`),
as a user would point one at cadence: its taskset by id, the answer reward saying what is correct."""

from __future__ import annotations

from cadence.tasks.agents.verifiers_env import VerifiersAgent

agent = VerifiersAgent({"taskset": {"id": "vf_calculator"}}, correct="correct")
