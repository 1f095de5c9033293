"""What turns an assignment into a scored group: single-turn generation (`single_turn.py`), multi-turn
episodes on the worker's engine (`play.py`), the group as made and scored (`results.py`: `GroupSamples`,
and the `GroupResult` or `EvalResult` that carries it), and the maker that chooses between them
(`maker.py`: `GroupMaker`). The rollout worker (`cadence/actors/rollout.py`) and `cadence eval`
(`cadence/launch/evaluate.py`) make their groups with it alike.
"""
