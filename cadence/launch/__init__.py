"""The composition root: build each actor's dependencies from the config (`build.py`) and its settings
and session (`settings.py`), run one actor as a process (`processes.py`), and start, watch and stop a
whole run (`launcher.py`)."""
