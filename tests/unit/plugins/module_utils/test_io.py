# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import errno
import os

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._observe.paths import read_paths
from ansible_collections.gpufleet.mps.plugins.module_utils._io import ancestors
from ansible_collections.gpufleet.mps.plugins.module_utils import _io
from ansible_collections.gpufleet.mps.plugins.module_utils._errors import MpsError, UnsafePathError
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.layout import managed_dirs, resource_paths


def test_atomic_write_reports_change_and_sets_the_mode(tmp_path):
    target = str(tmp_path / 'f')
    assert _io.atomic_write(target, 'a\n', 0o640)
    assert not _io.atomic_write(target, 'a\n', 0o640)
    assert oct(os.stat(target).st_mode & 0o777) == oct(0o640)
    assert _io.atomic_write(target, 'a\n', 0o644)


@pytest.mark.parametrize('failing', ['write', 'replace'])
def test_a_failed_write_leaves_the_old_file_whole_and_no_temporary(tmp_path, monkeypatch, failing):
    target = tmp_path / 'limits.json'
    target.write_text('old content\n')
    if failing == 'replace':
        def refuse(*args):
            raise OSError(errno.EROFS, 'Read-only file system')
        monkeypatch.setattr(_io.os, 'replace', refuse)
    else:
        real_fdopen = os.fdopen

        class Full:
            def __init__(self, handle):
                self.handle = handle

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.handle.close()

            def write(self, data):
                raise OSError(errno.ENOSPC, 'No space left on device')

        monkeypatch.setattr(_io.os, 'fdopen', lambda fd, *a, **k: Full(real_fdopen(fd, *a, **k)))
    with pytest.raises(MpsError, match='cannot write .*limits.json: (Read-only file system|No space left on device)'):
        _io.atomic_write(str(target), 'new content\n')
    assert target.read_text() == 'old content\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ['limits.json']


def test_untraversable_parents_are_listed(tmp_path):
    closed = tmp_path / 'closed'
    (closed / 'pipe').mkdir(parents=True)
    closed.chmod(0o700)
    blocked = _io.untraversable(read_paths(others=ancestors(str(closed / 'pipe'))), str(closed / 'pipe'))
    assert str(closed) in blocked


@pytest.fixture
def paths(tmp_path):
    root = tmp_path / 'root'
    root.mkdir()
    return resource_paths(str(root), 'vendor/res')


def test_missing_and_proper_directories_are_accepted(paths, tmp_path):
    _io.refuse_unsafe_dirs(managed_dirs(paths, str(tmp_path / 'etc')))
    os.makedirs(paths.pipe_dir, 0o755)
    (tmp_path / 'etc').mkdir(mode=0o755)
    _io.refuse_unsafe_dirs(managed_dirs(paths, str(tmp_path / 'etc')))


@pytest.mark.parametrize('which, param', [('root', 'root'), ('pipe_dir', 'name'), ('resource_dir', 'name')])
def test_a_symlinked_managed_directory_is_refused_naming_the_parameter(paths, tmp_path, which, param):
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    target = getattr(paths, which)
    if os.path.isdir(target):
        os.rmdir(target)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.symlink(elsewhere, target)
    with pytest.raises(UnsafePathError) as excinfo:
        _io.refuse_unsafe_dirs(managed_dirs(paths))
    assert excinfo.value.msg.startswith(param + ': ') and 'symbolic link' in excinfo.value.msg


def test_a_world_writable_config_dir_is_refused(paths, tmp_path):
    etc = tmp_path / 'etc'
    etc.mkdir()
    etc.chmod(0o777)
    with pytest.raises(UnsafePathError, match='config_dir: .* writable by every user'):
        _io.refuse_unsafe_dirs(managed_dirs(paths, str(etc)))
    etc.chmod(0o1777)
    _io.refuse_unsafe_dirs(managed_dirs(paths, str(etc)))


def test_a_directory_owned_by_another_user_is_refused(paths):
    os.chown(paths.root, 65534, 65534)
    with pytest.raises(UnsafePathError, match='root: .* owned by uid 65534'):
        _io.refuse_unsafe_dirs(managed_dirs(paths))


def test_a_file_where_a_directory_belongs_is_refused(paths):
    os.makedirs(paths.resource_dir)
    with open(paths.pipe_dir, 'w') as handle:
        handle.write('')
    with pytest.raises(UnsafePathError, match='not a directory'):
        _io.refuse_unsafe_dirs(managed_dirs(paths))


def test_created_parents_get_the_mode_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        assert _io.ensure_dir(str(tmp_path / 'a' / 'b' / 'pipe'), 0o755)
    finally:
        os.umask(old)
    for path in (tmp_path / 'a', tmp_path / 'a' / 'b', tmp_path / 'a' / 'b' / 'pipe'):
        assert oct(path.stat().st_mode & 0o777) == oct(0o755)
    assert not _io.ensure_dir(str(tmp_path / 'a' / 'b' / 'pipe'), 0o755)
