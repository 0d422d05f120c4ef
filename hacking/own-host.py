# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run a test command as on a machine of its own: a PID namespace and a /dev/shm of its own.

Simulated GPU hosts on one machine would otherwise see each other's daemons in /proc (a daemon of a parallel suite,
another checkout's tests or a running `make demo` was read as serving every GPU, and valid requests were refused), and
the simulator's clients find their servers through /dev/shm. Inside, the command and everything it starts see only each
other's processes and shared memory; the modules under test know nothing of it.

When the command ends, what it left running is named (hacking/leftovers.py over the directories given with --check, a
failure like any other), then ended with the namespace. Needs root (unshare); where it cannot be had (not root, no user
namespaces) the command runs as it is, and says so.

usage: own-host.py [--check DIR]... -- COMMAND [ARG...]
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
INSIDE = 'GPUFLEET_OWN_HOST'


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    if '--' not in argv:
        sys.exit('usage: own-host.py [--check DIR]... -- COMMAND [ARG...]')
    cut = argv.index('--')
    options, command = argv[:cut], argv[cut + 1:]
    dirs = [options[index + 1] for index, option in enumerate(options[:-1]) if option == '--check']
    return dirs, command


def _inside(dirs: list[str], command: list[str]) -> int:
    """PID 1 of the namespace: a private /dev/shm, the command, every orphan reaped, then the leftovers check."""
    mounted = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'mode=1777,nosuid,nodev', 'tmpfs', '/dev/shm'], check=False)
    if mounted.returncode != 0:
        print('own-host.py: no /dev/shm of its own here: %s shares the machine\'s' % command[0], file=sys.stderr)
    child = subprocess.Popen(command)  # pylint: disable=consider-using-with
    status = None
    while status is None:
        pid, raw = os.wait()  # as init: orphans re-parented here are reaped too
        if pid == child.pid:
            status = os.waitstatus_to_exitcode(raw)
    if dirs:
        found = subprocess.run([sys.executable, os.path.join(HERE, 'leftovers.py')] + dirs, check=False)
        if found.returncode and status == 0:
            print('own-host.py: %s left the processes above running' % ' '.join(command), file=sys.stderr)
            status = 1
    return status if status >= 0 else 128 - status


def main() -> int:
    dirs, command = _split(sys.argv[1:])
    if os.environ.get(INSIDE) == str(os.getpid()):
        return _inside(dirs, command)
    if os.environ.get(INSIDE):
        os.execvp(command[0], command)  # already on a machine of its own
    unshare = shutil.which('unshare')
    works = os.geteuid() == 0 and unshare and subprocess.run(
        [unshare, '--pid', '--fork', '--mount-proc', 'true'], capture_output=True, check=False).returncode == 0
    if not works:
        print('own-host.py: no PID namespace here (needs root and unshare): %s runs beside every other process' % command[0],
              file=sys.stderr)
        os.execvp(command[0], command)
    # The forked child is PID 1 of the new namespace: it finds itself by that pid.
    env = dict(os.environ, **{INSIDE: '1'})
    os.execve(unshare, [unshare, '--pid', '--fork', '--mount-proc', '--mount', '--propagation', 'private', '--',
                        sys.executable, os.path.abspath(__file__)] + sys.argv[1:], env)
    return 1


if __name__ == '__main__':
    sys.exit(main())
