"""Sockets, channels, heartbeats and weight transports. Everything between actors goes through here."""
