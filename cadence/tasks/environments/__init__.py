"""Multi-turn episodes: an environment answers each model turn until the episode is done, then scores it.

`base.py` is the interface a user implements (`Environment`: `start`, `step`, `score`), `bounds.py`
what caps an episode, `generation.py` what the runner asks of an engine and a tokenizer,
`episode_record.py` an episode's record as it runs and its result, `guard.py` the calls into an
environment under timeouts, `runner.py` the loop that runs a batch of episodes turn by turn,
`loading.py` an environment by name, and the built-in environments: `calculator.py` (over `calc.py`)
and `guess.py`. See docs/environments.md.
"""
