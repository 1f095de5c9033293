"""The wire contract: the codec (`codec.py`) and every message type (`messages.py`)."""
