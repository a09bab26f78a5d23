"""Which heavy libraries a ``localchat`` command line loads: run in a fresh process, so that
nothing the test process imported earlier counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HEAVY = ("llama_cpp", "numpy", "httpx")


def heavy_modules_loaded_by(argv: list[str], home: Path) -> tuple[list[str], str]:
    """(the heavy modules loaded after ``localchat ARGV`` ran under LOCALCHAT_HOME=``home``,
    its stdout); the command must succeed."""
    probe = (f"import json, sys; from localchat.cli import main; code = main({argv!r}); "
             f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules])); sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            env={**os.environ, "LOCALCHAT_HOME": str(home)}, timeout=60)
    assert result.returncode == 0, result.stderr
    *output, loaded = result.stdout.splitlines()
    return json.loads(loaded), "\n".join(output)
