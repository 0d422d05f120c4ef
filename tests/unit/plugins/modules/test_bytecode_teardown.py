# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""mps_host's bytecode cache, <root>/.bytecode (_bytecode.py), at a teardown: removed by mps_host state=absent as a
change of its own (check mode only reports it). The module runs here from the collection's files, not from a payload,
so the cache is laid out by the test."""
from __future__ import annotations

import os

TRAIN = [{'name': 'train', 'devices': [0]}]


def _cache(host):
    cache = os.path.join(host.root, '.bytecode')
    os.mkdir(cache, 0o700)
    with open(os.path.join(cache, '_host.manager-' + 'a' * 64), 'wb') as handle:
        handle.write(b'x')
    return cache


def test_a_teardown_removes_the_bytecode_cache_and_check_mode_only_reports_it(host):
    host.ok(TRAIN)
    cache = _cache(host)
    checked = host.run([], check=True, state='absent')
    assert 'host: remove %s (the modules\' bytecode cache)' % cache in checked['actions'] and os.path.isdir(cache)
    done = host.run([], state='absent')
    assert not done.get('failed'), done.get('msg')
    assert 'host: remove %s (the modules\' bytecode cache)' % cache in done['actions']
    assert not os.path.exists(cache)
    assert host.run([], state='absent')['changed'] is False
