"""Run every benchmark in turn (``make bench``). Each prints its figures beside a baseline
measured in the same run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = [
    "kernel.py",
    "append.py",
    "scan.py",
    "dispatch.py",
    "verify.py",
    "queues.py",
    "replicate.py",
    "spark.py",
    "streaming.py",
]

if __name__ == "__main__":
    for script in SCRIPTS:
        subprocess.run([sys.executable, str(HERE / script), *sys.argv[1:]], check=True)
