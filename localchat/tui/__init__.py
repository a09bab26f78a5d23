"""The terminal app: chat log, prompt, status bar, sessions (run with `localchat`)."""
