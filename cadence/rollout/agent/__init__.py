"""Agent episodes (`environment.agent`): a user's agent written against the OpenAI client, run against
the rollout worker's own OpenAI-compatible endpoint, its calls answered by the worker's engine with
the batch's version and traced into token sequences. `episodes.py` runs a batch's agents
(`AgentEpisodes`, `AgentTask`), `server.py` is the endpoint, `calls.py` one episode's calls within its
bounds, `batcher.py` the calls gathered into engine calls, `trace.py` the calls as sequences, `chat.py`
the OpenAI wire, `toolcalls.py` tool calls in the model family's form, `sampling.py` what a call is
sampled at, `logprobs.py` log-probs in OpenAI's form. See docs/environments.md.
"""
