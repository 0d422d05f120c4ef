# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A simulated GPU host of a test's own under TEST_ROOT, for the tests that drive Ansible against one.

Its GPUs have UUIDs of their own (make-simhost.sh derives them from the path), so nothing it starts is mistaken for
another test's daemon. The caller ends what it started (hacking/leftovers.py --kill on ``work``).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import NamedTuple, Optional

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
PYTHON = os.path.join(REPO, '.venv', 'bin', 'python')


class PrivateHost(NamedTuple):
    work: str  # everything of the test: removed first
    base: str  # stands for the host's /: its /run, /etc
    sim: str   # the simulated host: bin/, lib/, nvml.ini, env


def private_host(name: str, make_target: str, config: Optional[str] = None) -> PrivateHost:
    """``TEST_ROOT/<name>``, made anew, with a simulated host of ``config`` (a file of tests/fakes/nvml/configs)."""
    test_root = os.environ.get('TEST_ROOT')
    if not test_root:
        pytest.fail('TEST_ROOT is not set: run this through make %s, which sets it as every make target does' % make_target)
    work = os.path.join(test_root, name)
    shutil.rmtree(work, ignore_errors=True)
    host = PrivateHost(work, os.path.join(work, 'host'), os.path.join(work, 'sim'))
    os.makedirs(host.base)
    argv = [os.path.join(REPO, 'tests', 'fakes', 'make-simhost.sh'), host.sim, os.path.join(REPO, '.simhost', 'lib'), PYTHON]
    if config:
        argv.append(os.path.join(REPO, 'tests', 'fakes', 'nvml', 'configs', config))
    subprocess.run(argv, check=True, capture_output=True, text=True)
    return host


def collections_path(work: str) -> str:
    """Where ansible-playbook finds gpufleet.mps: make's tree (ANSIBLE_COLLECTIONS_PATH), else this checkout's, copied
    into ``work`` (a test run directly, without make)."""
    given = os.environ.get('ANSIBLE_COLLECTIONS_PATH', '')
    if given and os.path.isdir(os.path.join(given, 'ansible_collections', 'gpufleet', 'mps')):
        return given
    tree = os.path.join(work, 'collections')
    subprocess.run([os.path.join(REPO, 'hacking', 'collection-tree.sh'), tree], cwd=REPO, check=True, capture_output=True)
    return tree
