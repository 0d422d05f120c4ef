# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""List (or, with --kill, end) the processes of simulated GPU hosts that tests left running.

Only programs of a simulated host are looked at: the MPS simulator, its servers, the client stand-in and
the nvidia-smi stand-in, which all run as `python <tree>/tests/fakes/...` (tests/fakes/make-simhost.sh).
One of them belongs to DIRS when its command line names a path in one of DIRS (a checkout's or a
copied collection's simulator) or when its environment points the simulator at one of them
(FAKE_NVML_CONFIG, CUDA_MPS_PIPE_DIRECTORY: a simulated host laid out in a test's own directory).
Anything else - another checkout's simulated hosts, a shell that sourced a simulated host's env file,
an editor running this checkout's .venv - is never listed nor ended; nor are this script's ancestors.

--except DIR leaves out the processes whose environment points into DIR (make test and the demo: the
demo runs this checkout's simulator, but it is the user's to stop, with make demo-clean).

usage: leftovers.py [--kill] [--except DIR]... DIR...
exit status: 1 when, without --kill, a process is found; 0 otherwise (--kill names what it ended)
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

# Every program of a simulated host is a script from a tests/fakes/ directory (make-simhost.sh's wrappers
# exec them; the simulator starts its servers from there too).
FAKES = b'/tests/fakes/'
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


def prefixes(paths: list[str]) -> list[bytes]:
    """Each directory as given (absolute) and resolved, with a trailing slash: /a/b never matches /a/bc."""
    found: list[bytes] = []
    for path in paths:
        for variant in (os.path.abspath(path), os.path.realpath(path)):
            prefix = variant.rstrip('/').encode() + b'/'
            if prefix not in found:
                found.append(prefix)
    return found


def names(text: bytes, dirs: list[bytes]) -> bool:
    """Whether TEXT (an argument, or a variable's value) is or holds a path in one of DIRS: at its start,
    or after '=' or ':' (--opt=/dir/x, PATH-like lists), never in the middle of another path."""
    return any(text.startswith(prefix) or b'=' + prefix in text or b':' + prefix in text for prefix in dirs)


def read_proc(pid: int) -> tuple[list[bytes], list[bytes]] | None:
    """The process's arguments and environment, None when it is gone, a kernel thread or not readable."""
    try:
        with open(f'/proc/{pid}/cmdline', 'rb') as handle:
            args = handle.read().split(b'\0')
        with open(f'/proc/{pid}/environ', 'rb') as handle:
            environ = handle.read().split(b'\0')
    except OSError:
        return None
    if not any(args):
        return None  # a kernel thread or a zombie
    return args, environ


def points_into(environ: list[bytes], dirs: list[bytes]) -> bool:
    return any(entry.startswith(key) and names(entry[len(key):], dirs) for entry in environ for key in ENV_KEYS)


def ours(pid: int, dirs: list[bytes], excepted: list[bytes]) -> bytes | None:
    """The process's command line when it is a program of a simulated host of DIRS, else None."""
    found = read_proc(pid)
    if found is None:
        return None
    args, environ = found
    if not any(FAKES in arg for arg in args):
        return None
    if excepted and points_into(environ, excepted):
        return None
    if any(names(arg, dirs) for arg in args) or points_into(environ, dirs):
        return b' '.join(arg for arg in args if arg)
    return None


def scan(dirs: list[bytes], excepted: list[bytes], skip: set[int]) -> dict[int, bytes]:
    found = {}
    for entry in os.listdir('/proc'):
        if entry.isdigit() and int(entry) not in skip:
            cmdline = ours(int(entry), dirs, excepted)
            if cmdline is not None:
                found[int(entry)] = cmdline
    return found


def show(cmdline: bytes) -> str:
    return cmdline.decode(errors='replace')[:300]


def kill(dirs: list[bytes], excepted: list[bytes], skip: set[int]) -> int:
    # A few rounds: a client may still be starting a server through a daemon killed in the same round.
    for _round in range(3):
        found = scan(dirs, excepted, skip)
        if not found:
            return 0
        for pid, cmdline in sorted(found.items()):
            try:
                os.kill(pid, signal.SIGKILL)
                print(f'killed pid {pid}: {show(cmdline)}')
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(ours(pid, dirs, excepted) is not None for pid in found):
            time.sleep(0.05)
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--kill', action='store_true', help='end them (SIGKILL) instead of failing')
    parser.add_argument('--except', dest='excepted', action='append', default=[], metavar='DIR',
                        help='leave out the processes whose environment points into DIR')
    parser.add_argument('dirs', nargs='+', metavar='DIR')
    args = parser.parse_args(argv)
    dirs, excepted = prefixes(args.dirs), prefixes(args.excepted)
    skip = ancestors()
    if args.kill:
        return kill(dirs, excepted, skip)
    found = scan(dirs, excepted, skip)
    for pid, cmdline in sorted(found.items()):
        print(f'left running: pid {pid}: {show(cmdline)}')
    if found:
        print(f'{len(found)} process(es) of simulated hosts in {" ".join(args.dirs)} are still running'
              f' (end them with: hacking/leftovers.py --kill DIR...)')
    return 1 if found else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
