# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The bytecode cache (_bytecode.py), each case in a fresh interpreter that imports from an AnsiballZ-like payload zip
(the collection's package layout, this _bytecode.py and a probe module), as a module process does."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils import _bytecode
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.layout import DEFAULT_ROOT

UTILS = 'ansible_collections/gpufleet/mps/plugins/module_utils/'

# The interpreter of one module run: ansible-core's basic as AnsiballZ leaves it (the arguments in _ANSIBLE_ARGS), the
# payload first on sys.path, install(), then the probe imported. Prints what it saw; counts the probe's compiles.
RUN = r'''
import builtins, json, os, sys, types
payload, args = sys.argv[1], sys.argv[2]
if len(sys.argv) > 3:
    os.geteuid = lambda: int(sys.argv[3])  # a run as another user, as far as the cache can tell
sys.path.insert(0, payload)
basic = types.ModuleType('ansible.module_utils.basic')
basic._ANSIBLE_ARGS = args.encode()
sys.modules['ansible.module_utils.basic'] = basic
compiles = []
real = builtins.compile
def counting(source, filename, *rest, **kwargs):
    if str(filename).endswith('probe.py'):
        compiles.append(str(filename))
    return real(source, filename, *rest, **kwargs)
builtins.compile = counting
from ansible_collections.gpufleet.mps.plugins.module_utils import _bytecode  # installs the cache, as in a module
_bytecode.install()  # a second call changes nothing
from ansible_collections.gpufleet.mps.plugins.module_utils import probe
print(json.dumps({'value': probe.VALUE, 'compiles': len(compiles), 'refused': _bytecode.STATUS['refused'],
                  'cached_loader': type(probe.__loader__).__name__, 'file': probe.__file__,
                  'finders': sum(type(finder).__name__ == 'Finder' for finder in sys.meta_path)}))
'''


def _payload(path, probe='VALUE = 42\n'):
    with zipfile.ZipFile(path, 'w') as payload:
        for package in ('ansible_collections/', 'ansible_collections/gpufleet/', 'ansible_collections/gpufleet/mps/',
                        'ansible_collections/gpufleet/mps/plugins/', UTILS):
            payload.writestr(package + '__init__.py', '')
        payload.writestr(UTILS + '_bytecode.py', Path(_bytecode.__file__).read_text())
        payload.writestr(UTILS + 'probe.py', probe)
    return str(path)


def _run(payload, root, euid=None, **args):
    args = dict(dict(root=str(root), _ansible_module_name='gpufleet.mps.mps_host'), **args)
    done = subprocess.run([sys.executable, '-I', '-c', RUN, payload, json.dumps({'ANSIBLE_MODULE_ARGS': args})]
                          + ([] if euid is None else [str(euid)]), capture_output=True, text=True, check=False,
                          env={'PATH': os.environ['PATH']})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def setup(tmp_path):
    root = tmp_path / 'root'
    root.mkdir()
    return _payload(tmp_path / 'ansible_gpufleet.mps.mps_host_payload.zip'), root, root / '.bytecode'


def _entries(cache):
    return sorted(os.listdir(cache)) if cache.exists() else []


@pytest.mark.skipif(os.geteuid() != 0, reason='the cache is used only by root')
def test_the_first_run_compiles_and_stores_and_the_next_one_loads_without_compiling(setup):
    payload, root, cache = setup
    first = _run(payload, root)
    assert (first['value'], first['compiles'], first['refused'], first['cached_loader']) == (42, 1, '', 'Loader')
    assert first['finders'] == 1
    assert first['file'] == payload + '/' + UTILS + 'probe.py'
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700 and cache.stat().st_uid == 0
    [entry] = [name for name in _entries(cache) if name.startswith('probe-')]
    assert stat.S_IMODE((cache / entry).stat().st_mode) == 0o600
    second = _run(payload, root)
    assert (second['value'], second['compiles']) == (42, 0)


@pytest.mark.skipif(os.geteuid() != 0, reason='the cache is used only by root')
def test_a_tampered_or_truncated_entry_is_a_miss_compiled_from_the_source_and_written_anew(setup):
    payload, root, cache = setup
    _run(payload, root)
    [entry] = [cache / name for name in _entries(cache) if name.startswith('probe-')]
    good = entry.read_bytes()
    entry.write_bytes(good[:-3] + bytes(b ^ 0xFF for b in good[-3:]))  # the code altered, its hash not
    again = _run(payload, root)
    assert (again['value'], again['compiles']) == (42, 1)
    assert entry.read_bytes() == good
    entry.write_bytes(good[:10])
    assert _run(payload, root)['compiles'] == 1 and entry.read_bytes() == good


@pytest.mark.skipif(os.geteuid() != 0, reason='the cache is used only by root')
def test_a_new_source_is_a_new_key_and_replaces_the_modules_old_entry(setup, tmp_path):
    payload, root, cache = setup
    _run(payload, root)
    old = [name for name in _entries(cache) if name.startswith('probe-')]
    (tmp_path / 'newer').mkdir()
    newer = _payload(tmp_path / 'newer' / 'ansible_gpufleet.mps.mps_host_payload.zip', 'VALUE = 43\n')
    result = _run(newer, root)
    assert (result['value'], result['compiles']) == (43, 1)
    now = [name for name in _entries(cache) if name.startswith('probe-')]
    assert len(now) == 1 and now != old


@pytest.mark.parametrize('mode', [0o755, 0o770])
@pytest.mark.skipif(os.geteuid() != 0, reason='the cache is used only by root')
def test_a_directory_others_may_use_is_not_used_and_the_module_says_why(setup, mode):
    payload, root, cache = setup
    cache.mkdir()
    cache.chmod(mode)
    result = _run(payload, root)
    assert (result['value'], result['compiles']) == (42, 1)
    assert result['refused'] == '%s is not a directory of root with mode 0700 (owner uid 0, mode %04o)' % (cache, mode)
    assert _entries(cache) == []


@pytest.mark.skipif(os.geteuid() != 0, reason='the cache is used only by root')
def test_a_link_in_place_of_the_directory_is_not_followed(setup, tmp_path):
    payload, root, cache = setup
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir(mode=0o700)
    cache.symlink_to(elsewhere)
    result = _run(payload, root)
    assert result['compiles'] == 1 and 'cannot be opened as a directory' in result['refused']
    assert os.listdir(elsewhere) == []


def test_check_mode_and_a_teardown_write_nothing_and_a_missing_root_is_not_made(setup, tmp_path):
    payload, root, cache = setup
    assert _run(payload, root, _ansible_check_mode=True)['compiles'] == 1
    assert _run(payload, root, state='absent')['cached_loader'] != 'Loader'  # a teardown does not even read it
    assert not cache.exists()
    assert _run(payload, tmp_path / 'no-root-yet')['compiles'] == 1
    assert not (tmp_path / 'no-root-yet').exists()


def test_a_run_that_is_not_roots_neither_makes_nor_reads_the_cache(setup):
    payload, root, cache = setup
    result = _run(payload, root, euid=1000)
    assert (result['value'], result['refused'], result['finders']) == (42, '', 0)  # the payload's own import, compiled
    assert result['compiles'] >= 1 and result['cached_loader'] != 'Loader' and not cache.exists()


def test_only_mps_host_uses_the_cache(setup):
    payload, root, cache = setup
    for module in ('gpufleet.mps.mps_daemon', 'gpufleet.mps.mps_info', None):
        assert _run(payload, root, _ansible_module_name=module)['cached_loader'] != 'Loader'
    assert not cache.exists()


def test_outside_a_payload_or_with_a_relative_root_nothing_is_installed(setup, tmp_path):
    payload, root, cache = setup
    plain = tmp_path / 'plain.zip'
    os.rename(payload, plain)  # not AnsiballZ's payload name
    assert _run(str(plain), root)['cached_loader'] != 'Loader'
    os.rename(plain, payload)
    assert _run(payload, 'relative/root')['cached_loader'] != 'Loader'
    assert not cache.exists()


def test_a_teardown_removes_the_caches_entries_and_directory_and_nothing_else(tmp_path):
    cache = tmp_path / '.bytecode'
    cache.mkdir(mode=0o700)
    (cache / ('_host.manager-' + 'a' * 64)).write_bytes(b'x')
    (cache / ('probe-' + 'b' * 64 + '.77.tmp')).write_bytes(b'x')
    _bytecode.remove_bytecode(str(cache))
    assert not cache.exists()
    cache.mkdir(mode=0o700)
    (cache / ('probe-' + 'c' * 64)).write_bytes(b'x')
    (cache / 'notes.txt').write_text('not the cache\'s')
    _bytecode.remove_bytecode(str(cache))
    assert os.listdir(cache) == ['notes.txt']
    link = tmp_path / 'link'
    link.symlink_to(cache)
    _bytecode.remove_bytecode(str(link))
    assert link.is_symlink() and os.listdir(cache) == ['notes.txt']


def test_the_cache_knows_the_modules_default_root():
    assert _bytecode.DEFAULT_ROOT == DEFAULT_ROOT
