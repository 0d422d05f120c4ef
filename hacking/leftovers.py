# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""List (or, with --kill, end) the processes that tests of this checkout left running.

A process is one of ours when its command line names one of DIRS (the simulator's daemons, servers and
clients run as `python <checkout>/tests/fakes/mps/...`) or when its environment points the simulator at
one of them (FAKE_NVML_CONFIG, CUDA_MPS_PIPE_DIRECTORY). Processes of other checkouts on the same
machine are left alone; so are this script, its ancestors (make, the shell) and kernel threads.

usage: leftovers.py [--kill] DIR...   exit 1 when, without --kill, anything is found
"""
from __future__ import annotations

import os
import signal
import sys
import time

ENV_KEYS = (b'FAKE_NVML_CONFIG=', b'CUDA_MPS_PIPE_DIRECTORY=')


def ancestors() -> set[int]:
    found, pid = set(), os.getpid()
    while pid > 1:
        found.add(pid)
        try:
            with open(f'/proc/{pid}/stat', encoding='ascii', errors='replace') as handle:
                pid = int(handle.read().rsplit(')', 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return found


def ours(pid: int, dirs: list[bytes]) -> bytes | None:
    """The process's command line when it belongs to one of DIRS, else None."""
    try:
        with open(f'/proc/{pid}/cmdline', 'rb') as handle:
            cmdline = handle.read().replace(b'\0', b' ').strip()
    except OSError:
        return None
    if not cmdline:
        return None  # a kernel thread or a zombie
    if any(directory in cmdline for directory in dirs):
        return cmdline
    try:
        with open(f'/proc/{pid}/environ', 'rb') as handle:
            environ = handle.read().split(b'\0')
    except OSError:
        return None
    for entry in environ:
        for key in ENV_KEYS:
            if entry.startswith(key) and any(entry[len(key):].startswith(directory) for directory in dirs):
                return cmdline
    return None


def main(argv: list[str]) -> int:
    kill = '--kill' in argv
    dirs = [os.path.realpath(arg).encode() + b'/' for arg in argv if arg != '--kill']
    if not dirs:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    skip = ancestors()
    found = {}
    for entry in os.listdir('/proc'):
        if entry.isdigit() and int(entry) not in skip:
            cmdline = ours(int(entry), dirs)
            if cmdline is not None:
                found[int(entry)] = cmdline
    if not kill:
        for pid, cmdline in sorted(found.items()):
            print(f'left running: pid {pid}: {cmdline.decode(errors="replace")[:300]}')
        if found:
            print(f'{len(found)} process(es) of this checkout are still running (stop them with: hacking/leftovers.py --kill DIR...)')
        return 1 if found else 0
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(os.path.exists(f'/proc/{pid}/cmdline') and ours(pid, dirs) for pid in found):
        time.sleep(0.1)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
