"""``rmqstore replicate`` of the benchmark store into a new DEST, beside ``cp`` of the same
commit-log files plus ``dispatch --rebuild`` of the copy (what a copy by hand takes); then the
same over RocketMQ's HA protocol on loopback (``serve-ha`` and ``replicate ha://``).

    python bench/replicate.py [--messages N] [--workdir DIR]
"""

from __future__ import annotations

import re
import subprocess
import sys

from common import arguments, build_store, row, timed


def main() -> None:
    options = arguments(__doc__).parse_args()
    workdir, count = options.workdir, options.messages
    store, _ = build_store(workdir, count)
    print(f"replicate: the {count:,}-message store")
    rmqstore = [sys.executable, "-m", "rmqstore"]

    dest = workdir / "replica"
    subprocess.run(["rm", "-rf", str(dest)], check=True)
    with timed() as replicated:
        subprocess.run([*rmqstore, "replicate", str(store), str(dest)], check=True,
                       capture_output=True)  # fmt: skip
    copy = workdir / "copied"
    subprocess.run(["rm", "-rf", str(copy)], check=True)
    with timed() as copied:
        copy.mkdir()
        subprocess.run(["cp", "-r", "--sparse=always", str(store / "commitlog"), str(copy)],
                       check=True)  # fmt: skip
        subprocess.run(["sync", "-f", str(copy)], check=True)
    with timed() as rebuilt:
        subprocess.run([*rmqstore, "dispatch", str(copy), "--rebuild", "--yes"], check=True,
                       capture_output=True)  # fmt: skip
    baseline = copied.seconds + rebuilt.seconds
    row(
        "replicate into a new DEST (copy, fsync, dispatch)",
        f"{replicated.seconds:.2f} s ({replicated.seconds / baseline:.2f}x the baseline)",
        f"cp + sync {copied.seconds:.2f} s, then dispatch --rebuild {rebuilt.seconds:.2f} s: "
        f"{baseline:.2f} s",
    )
    with timed() as again:
        subprocess.run([*rmqstore, "replicate", str(store), str(dest)], check=True,
                       capture_output=True)  # fmt: skip
    row("replicate again (nothing new: the prefix check)", f"{again.seconds:.2f} s")
    subprocess.run(["rm", "-rf", str(dest), str(copy)], check=True)
    served = subprocess.Popen(
        [*rmqstore, "serve-ha", str(store), "--listen", "127.0.0.1:0"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert served.stderr is not None
        port = re.search(r":(\d+);", served.stderr.readline())
        assert port, "serve-ha did not say its port"
        slave = workdir / "slave"
        subprocess.run(["rm", "-rf", str(slave)], check=True)
        subprocess.run(["sync"], check=True)  # the copies above are gone and written back
        with timed() as over_ha:
            subprocess.run([*rmqstore, "replicate", f"ha://127.0.0.1:{port.group(1)}", str(slave)],
                           check=True, capture_output=True)  # fmt: skip
    finally:
        served.terminate()
        served.wait()
    size = sum(p.stat().st_blocks * 512 for p in (slave / "commitlog").iterdir())
    row(
        "replicate ha:// from serve-ha on loopback (an empty slave: the master's last file)",
        f"{over_ha.seconds:.2f} s ({size / over_ha.seconds / 1e6:.0f} MB/s)",
        f"the directory replicate {replicated.seconds:.2f} s",
    )
    subprocess.run(["rm", "-rf", str(slave)], check=True)


if __name__ == "__main__":
    main()
