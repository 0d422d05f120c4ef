# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Offline stand-in for the ``get-pip.py`` bootstrap script that ansible-test downloads.

ansible-test bootstraps pip into every virtual environment it creates by running a ``get-pip``
script fetched from a host that is not reachable from every network (ansible/ansible#77304). It
looks for a cached copy at ``~/.ansible/test/cache/get_pip_<version>.py`` first; ``make`` installs
this file there. It is called as ``python get_pip.py [pip options] pip==X.Y [--no-setuptools]
[--no-wheel]`` inside the new virtual environment and must leave that environment with exactly the
requested packages.

It installs pip from the wheel bundled with CPython (``ensurepip``, no network), then lets that pip
install the requested versions. The second step runs pip normally, so pip's own configuration
(index, certificates, constraints from the environment and config files) stays in force.
"""

from __future__ import annotations

import ensurepip
import os
import subprocess
import sys

# Options of get-pip.py itself, not of ``pip install``.
GET_PIP_ONLY_OPTIONS = frozenset(('--no-setuptools', '--no-wheel'))


def main(argv: list[str]) -> int:
    """Bootstrap pip, then install the requested packages with it."""
    pip_args = [arg for arg in argv if arg not in GET_PIP_ONLY_OPTIONS]
    # ensurepip strips PIP_* from os.environ and points PIP_CONFIG_FILE at /dev/null (CPython
    # bpo-19734); the real install below must see the caller's pip configuration again.
    caller_env = dict(os.environ)
    ensurepip.bootstrap(upgrade=True, default_pip=True)
    if not pip_args:
        return 0
    command = [sys.executable, '-m', 'pip', 'install'] + pip_args
    return subprocess.run(command, env=caller_env, check=False).returncode


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
