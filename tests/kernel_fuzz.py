"""The compiled record kernel under AddressSanitizer and UndefinedBehaviorSanitizer.

    python tests/kernel_fuzz.py [--inputs N] [--seed S] [--build-dir DIR]

Builds ``rmqstore/kernel/_native.pyx`` with ``-fsanitize=address,undefined`` (any finding
aborts), then runs N inputs through it in a child interpreter that preloads the sanitizer
runtime: every commit-log file of the real-broker stores and fixture scenarios, then mutations
of them (bit flips, truncations, zeroed ranges, length fields at extremes). Each input is
scanned with every option set, whole and window by window, and compared with the pure-Python
reference (tests/kernel_corpus.py). ``make fuzz-native`` runs 100,000 inputs; ``make test``
runs a short pass (tests/engine/test_kernel_fuzz.py).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "rmqstore" / "kernel" / "_native.pyx"
SANITIZERS = "address,undefined"


def build(directory: Path) -> Path:
    """The sanitized extension module, compiled into ``directory``."""
    from Cython.Build import cythonize  # the build tool: only this script needs it

    c_file = directory / "_native.c"
    copy = directory / "_native.pyx"
    copy.write_text(SOURCE.read_text(encoding="utf-8"), encoding="utf-8")
    cythonize([str(copy)], quiet=True, compiler_directives={"language_level": "3"})
    module = directory / f"_native{sysconfig.get_config_var('EXT_SUFFIX')}"
    # -O0: the sanitizers check every access all the same, and the run's time goes to the
    # reference kernel it is compared with, while -O1 -g makes the compile about seven times
    # longer (50 s against 7 s on two cores), the larger part of make test's short pass
    command = [
        os.environ.get("CC", "gcc"),
        "-shared",
        "-fPIC",
        "-O0",
        "-g",
        "-fno-omit-frame-pointer",
        f"-fsanitize={SANITIZERS}",
        "-fno-sanitize-recover=all",
        f"-I{sysconfig.get_paths()['include']}",
        str(c_file),
        "-o",
        str(module),
    ]
    subprocess.run(command, check=True)
    return module


def runtime() -> str:
    """The ASan runtime to preload (the interpreter itself is not instrumented)."""
    compiler = os.environ.get("CC", "gcc")
    found = subprocess.run(
        [compiler, "-print-file-name=libasan.so"], check=True, capture_output=True, text=True
    ).stdout.strip()
    if not os.path.isabs(found):
        raise SystemExit(f"{compiler} has no AddressSanitizer runtime (libasan.so)")
    return found


CHILD = """
import importlib.util, random, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[4])
spec = importlib.util.spec_from_file_location("rmqstore.kernel._native", sys.argv[1])
native = importlib.util.module_from_spec(spec)
spec.loader.exec_module(native)
from kernel_corpus import differences, mutate, scenario_workdir, seed_files
inputs, seed, failure = int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[6])
rng = random.Random(seed)
started = told = time.monotonic()
with scenario_workdir() as workdir:
    seeds = seed_files(Path(workdir))
done = 0
for name, data, base in seeds:
    if done >= inputs:
        break
    problems = list(differences(native, data, base, rng))
    assert not problems, f"{name}: {problems}"
    done += 1
while done < inputs:
    name, data, base = rng.choice(seeds)
    mutated = mutate(data, base, rng)
    problems = list(differences(native, mutated, base, rng))
    if problems:
        failure.write_bytes(mutated)
        raise SystemExit(f"{name} mutated (saved as {failure}): {problems}")
    done += 1
    if time.monotonic() - told >= 60:  # a long run says how far it is, once a minute
        told = time.monotonic()
        print(f"kernel fuzz: {done:,} of {inputs:,} inputs, {told - started:.0f} s",
              file=sys.stderr, flush=True)
seconds = time.monotonic() - started
print(f"kernel fuzz: {done} inputs ({len(seeds)} seeds, the rest mutations), "
      f"sanitizers {sys.argv[5]}, no finding, no divergence, {seconds:.0f} s")
"""


def fuzz(
    inputs: int, seed: int, build_dir: Path | None = None, *, show_progress: bool = False
) -> subprocess.CompletedProcess:
    """Build the sanitized kernel and run ``inputs`` inputs through it. A mutated input that
    makes it fail is saved as ``kernel-fuzz-failure.bin`` in the current directory. With
    ``show_progress`` the run's progress lines (and any sanitizer report) go straight to this
    process's stderr instead of being captured."""
    failure = Path.cwd() / "kernel-fuzz-failure.bin"
    with tempfile.TemporaryDirectory(prefix="rmqstore-asan-") as scratch:
        directory = build_dir or Path(scratch)
        directory.mkdir(parents=True, exist_ok=True)
        module = build(directory)
        env = {
            **os.environ,
            "LD_PRELOAD": runtime(),
            "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
            "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
            "PYTHONMALLOC": "malloc",  # Python's buffers through the sanitized allocator
        }
        return subprocess.run(
            [
                sys.executable,
                "-c",
                CHILD,
                str(module),
                str(inputs),
                str(seed),
                str(REPO / "tests"),
                SANITIZERS,
                str(failure),
            ],
            env=env,
            cwd=directory,
            stdout=subprocess.PIPE,
            stderr=None if show_progress else subprocess.PIPE,
            text=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--build-dir", type=Path)
    options = parser.parse_args()
    result = fuzz(options.inputs, options.seed, options.build_dir, show_progress=True)
    sys.stdout.write(result.stdout)
    raise SystemExit(result.returncode)


if __name__ == "__main__":
    main()
