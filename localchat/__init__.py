"""localchat: a local, offline-first chat app for the terminal."""

__version__ = "0.1.0"
