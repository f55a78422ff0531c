"""Is there a Java 17+ for Spark? Checked before a Spark session starts, so a missing or old
JVM is one clear sentence instead of a stack trace. ``python -m rmqstore.spark.javacheck``
exits 1 with that sentence when it is not."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

MINIMUM_JAVA = 17
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


class JavaMissing(Exception):
    """No suitable Java: the message says what to install."""


def java_executable() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = os.path.join(home, "bin", "java")
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("java")


def java_major_version(executable: str) -> int | None:
    try:
        output = subprocess.run(
            [executable, "-version"], capture_output=True, text=True, timeout=30
        ).stderr
    except (OSError, subprocess.SubprocessError):
        return None
    match = _VERSION.search(output)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def require_java() -> str:
    """The java executable to use; raises :class:`JavaMissing` saying what to install."""
    executable = java_executable()
    if executable is None:
        raise JavaMissing(
            f"Spark needs Java {MINIMUM_JAVA} or newer, and no 'java' was found "
            "on PATH or in JAVA_HOME; install a JDK 17+ (for example "
            "'apt install openjdk-17-jre-headless') or set JAVA_HOME"
        )
    major = java_major_version(executable)
    if major is None or major < MINIMUM_JAVA:
        found = f"Java {major}" if major else "a Java whose version could not be read"
        raise JavaMissing(
            f"Spark needs Java {MINIMUM_JAVA} or newer, but {executable} is "
            f"{found}; install a JDK 17+ or point JAVA_HOME at one"
        )
    return executable


def main() -> int:
    try:
        executable = require_java()
    except JavaMissing as exc:
        print(f"java-check: {exc}", file=sys.stderr)
        return 1
    print(f"java-check: {executable} is Java {java_major_version(executable)} (ok for Spark)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
