# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The logrotate drop-in for the daemons' logs, run by the real logrotate (make deps installs it)."""
from __future__ import annotations

import gzip
import os
import shutil
import subprocess

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._errors import MpsError
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.logrotate import render_logrotate

LOGROTATE = shutil.which('logrotate') or shutil.which('logrotate', path='/usr/sbin:/sbin')


def _logs(root, *names):
    paths = []
    for name in names:
        log_dir = os.path.join(root, name, 'log')
        os.makedirs(log_dir, mode=0o700)
        for log in ('control.log', 'server.log'):
            path = os.path.join(log_dir, log)
            with open(path, 'w', encoding='utf-8') as handle:
                handle.write('[2026-12-03 10:00:00.000 Control    72] line\n' * 100)
            paths.append(path)
    return paths


def test_the_drop_in_rotates_every_resources_logs_in_place(tmp_path):
    assert LOGROTATE, 'logrotate is not installed: run make deps (hacking/install-deps.sh)'
    root = str(tmp_path / 'root')
    logs = _logs(root, 'train', 'example.com/infer')
    conf = tmp_path / 'gpufleet-mps'
    conf.write_text(render_logrotate(root, size='1k', rotate=2))
    os.chmod(str(conf), 0o644)
    state = str(tmp_path / 'state')
    debug = subprocess.run([LOGROTATE, '--debug', '--state', state, str(conf)], capture_output=True, text=True, check=False)
    assert debug.returncode == 0 and 'error' not in debug.stderr.lower(), debug.stderr
    for path in logs:
        assert path in debug.stderr  # both patterns match: one level of resource names, and two
    inodes = {path: os.stat(path).st_ino for path in logs}
    subprocess.run([LOGROTATE, '--state', state, str(conf)], check=True, capture_output=True)
    for path in logs:
        assert os.stat(path).st_ino == inodes[path] and os.path.getsize(path) == 0  # truncated in place, never replaced
        with open(path + '.1', encoding='utf-8') as handle:
            assert handle.read().count('line') == 100  # delaycompress: the first old copy stays plain
    with open(logs[0], 'a', encoding='utf-8') as handle:
        handle.write('x' * 2048)
    subprocess.run([LOGROTATE, '--state', state, str(conf)], check=True, capture_output=True)
    with gzip.open(logs[0] + '.2.gz', 'rt') as handle:
        assert handle.read().count('line') == 100


@pytest.mark.parametrize('root, size, rotate, message', [
    ('relative', '50M', 7, 'root'),
    ('/run/with space', '50M', 7, 'root'),
    ('/run/mps*', '50M', 7, 'root'),
    ('/run/mps', '50 MB', 7, 'size'),
    ('/run/mps', '50M', -1, 'rotate'),
])
def test_what_a_drop_in_cannot_carry_is_refused(root, size, rotate, message):
    with pytest.raises(MpsError, match='^%s: ' % message):
        render_logrotate(root, size, rotate)
