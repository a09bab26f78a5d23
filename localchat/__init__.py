"""localchat: a local, offline-first chat app for the terminal."""

import logging

__version__ = "0.1.0"

# Records go nowhere until logs.attach() sends them to the log file: never to logging's
# last-resort handler, which would print a traceback on the user's terminal.
logging.getLogger(__name__).addHandler(logging.NullHandler())
