# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A driver upgraded under running daemons (issue 44): NVML's "Driver/library version mismatch", and a control binary
replaced or removed under its daemon, are reported as a pending driver upgrade with what to do, and nothing is stopped
while NVML cannot answer; once NVML answers with the new driver, the restart is planned under the busy policy."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

TRAIN = [{'name': 'train', 'devices': [0]}]


def _ini(edit):
    path = os.environ['FAKE_NVML_CONFIG']
    with open(path, encoding='utf-8') as handle:
        text = handle.read()
    with open(path, 'w', encoding='utf-8') as handle:
        handle.write(edit(text))


def _mismatch(text):
    return text.replace('[system]\n', '[system]\nfail.nvmlInit = NVML_ERROR_LIB_RM_VERSION_MISMATCH\n', 1)


def test_a_driver_library_mismatch_changes_nothing_and_says_what_to_do(host, warnings):
    first = host.ok(TRAIN)
    pid = first['resources'][0]['pid']
    _ini(_mismatch)
    for options in ({}, {'state': 'absent'}, {'require_gpu': False}):
        for check in (True, False):
            result = host.run(TRAIN if not options.get('state') else [], check=check, **options)
            assert result.get('failed') and not result.get('changed'), result
            assert result['msg'].startswith('driver upgrade pending: NVML answers') and 'reboot' in result['msg'], result['msg']
            assert result['nvml']['driver_upgrade_pending'] is True
    assert list(host.daemons()) == [pid]  # nothing stopped
    daemon = host.module('mps_daemon', name='train', devices=[0])
    assert daemon.get('failed') and daemon['msg'].startswith('driver upgrade pending') and list(host.daemons()) == [pid]
    info = host.module('mps_info', gather=['daemons'])
    assert not info.get('failed') and info['nvml']['driver_upgrade_pending'] is True and not info['nvml']['available']
    assert any(text.startswith('driver upgrade pending') for text in warnings(info))
    assert [(d['name'], d['running'], d['pid']) for d in info['daemons']] == [('train', True, pid)]
    # The new module loaded (a reboot or a reload): NVML answers with the new driver, and the daemon started under the old
    # one is restarted, under the busy policy.
    _ini(lambda text: re.sub(r'(?m)^driver_version = .*$', 'driver_version = 570.86.15',
                             text.replace('fail.nvmlInit = NVML_ERROR_LIB_RM_VERSION_MISMATCH\n', '')))
    planned = host.run(TRAIN, check=True)
    assert planned['changed'] and any('driver: the daemon was started under driver' in action for action in planned['actions']), planned
    client = host.client('train')
    refused = host.run(TRAIN, busy='refuse')
    assert refused.get('failed') and list(host.daemons()) == [pid], refused.get('msg')
    host.leave(client)
    restarted = host.ok(TRAIN)
    assert restarted['changed'] and restarted['resources'][0]['pid'] != pid


def _linked_python(base):
    """The interpreter under a second name of the same file (a hard link), which can then be removed under a running
    process as a package upgrade removes the old binary; None where no link can be made (another filesystem)."""
    real = os.path.realpath(sys.executable)
    directory = base / 'driver-old' / 'bin'
    directory.mkdir(parents=True)
    link = str(directory / 'python3')
    try:
        os.link(real, link)
    except OSError:
        return None
    probe = subprocess.run([link, '-c', 'pass'], capture_output=True, check=False)
    return link if probe.returncode == 0 else None


def test_a_control_binary_replaced_under_its_daemon_is_reported_and_left_running(host, warnings):
    link = _linked_python(host.base)
    if link is None:
        pytest.skip('no hard link to the interpreter can be made here')
    with open(host.binary, encoding='utf-8') as handle:
        wrapper = handle.read()
    control = str(host.base / 'driver-old' / 'bin' / 'nvidia-cuda-mps-control')
    with open(control, 'w', encoding='utf-8') as handle:  # the simulator, run by the linked interpreter
        handle.write(re.sub(r'(?m)^exec "[^"]+"', 'exec "%s"' % link, wrapper))
    os.chmod(control, 0o755)
    first = host.ok(TRAIN, control_binary=control)
    pid = first['resources'][0]['pid']
    quiet = host.ok(TRAIN, control_binary=control)
    assert not quiet['changed'] and not any('driver upgrade pending' in text for text in warnings(quiet))
    assert [d['binary_replaced'] for d in host.module('mps_info', gather=['daemons'], control_binary=control)['daemons']] == [False]
    os.unlink(link)  # the package manager replaced it: the running daemon's program is gone from the file system
    shutil.copy2(os.path.realpath(sys.executable), link)  # the new one in its place
    again = host.ok(TRAIN, control_binary=control)
    assert not again['changed'] and list(host.daemons()) == [pid], again
    said = [text for text in warnings(again) if text.startswith('driver upgrade pending')]
    assert len(said) == 1 and 'pid %d' % pid in said[0] and link in said[0], warnings(again)
    info = host.module('mps_info', gather=['daemons'], control_binary=control)
    assert [d['binary_replaced'] for d in info['daemons']] == [True]
    assert any('driver upgrade pending' in text for text in warnings(info))
