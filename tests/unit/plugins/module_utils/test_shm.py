# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils import _shm, _tmpfs
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor import unit as _systemd
from ansible_collections.gpufleet.mps.plugins.module_utils._errors import InvalidParameterError, MpsError

PAGES = (6170896, 4096)  # a 24 GiB machine: total pages, page size

MOUNTINFO = r"""22 1 0:21 / / rw,relatime - ext4 /dev/vda rw
66 22 0:40 / /run/nvidia/mps/shm rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,size=65536k
67 22 0:41 / /run/with\040space/shm rw,relatime shared:5 - tmpfs tmpfs rw
68 22 0:42 / /srv/x/shm rw,relatime - ext4 /dev/vdb rw
"""


@pytest.mark.parametrize('size, kib', [
    ('50%', 6170896 // 2 * 4), ('33%', 8145584), ('100%', 6170896 * 4), ('1%', 246836),
    ('64m', 65536), ('64M', 65536), ('1G', 1048576), ('1t', 1 << 30), ('4096', 4), ('1', 4), ('5000', 8), ('1k', 4),
])
def test_size_kib_rounds_like_the_kernel(size, kib):
    # 33% and 1% were checked against a real tmpfs on this machine (mountinfo size=8145584k).
    assert _tmpfs.size_kib(size, PAGES) == kib


@pytest.mark.parametrize('size', ['0', '0%', '101%', '-1G', '16GB', 'half', '1G,exec', '50%\n', '', ' ', '1.5G', True, None, 'size=1G'])
def test_bad_sizes_fail_naming_size(size):
    with pytest.raises(InvalidParameterError, match=r'^size: must be a percentage of RAM'):
        _tmpfs.size_kib(size, PAGES)


def test_mountinfo_is_parsed_with_escapes_and_optional_fields():
    entry = _tmpfs.mounted_at('/run/with space/shm', MOUNTINFO)
    assert entry is not None and entry.fstype == 'tmpfs' and entry.flags == ['rw', 'relatime']
    assert _tmpfs.mounted_at('/run/nvidia/mps/shm', MOUNTINFO).super_options['size'] == '65536k'
    assert _tmpfs.mounted_at('/nowhere', MOUNTINFO) is None


def test_current_state_reads_the_size_and_the_default_the_kernel_omits(tmp_path):
    state = _tmpfs.current_state('/run/nvidia/mps/shm', PAGES, MOUNTINFO)
    assert (state.mounted, state.size_kib, state.flags) == (True, 65536, ['rw', 'nosuid', 'nodev', 'noexec'])
    default = _tmpfs.current_state('/run/with space/shm', PAGES, MOUNTINFO)
    assert default.size_kib == _tmpfs.size_kib('50%', PAGES) and default.flags == ['rw']
    assert not _tmpfs.current_state('/nowhere', PAGES, MOUNTINFO).mounted


def test_another_file_system_on_the_path_is_refused():
    with pytest.raises(MpsError, match='is a mount point of a ext4 file system .*not a tmpfs'):
        _tmpfs.current_state('/srv/x/shm', PAGES, MOUNTINFO)


def test_fstab_edit_replaces_only_our_entry_and_keeps_the_rest():
    text = 'UUID=a / ext4 defaults 0 1\n# a comment\ntmpfs /run/nvidia/mps/shm/ tmpfs size=1G 0 0\n'
    line = _tmpfs.fstab_line('/run/nvidia/mps/shm', 65536)
    assert line.endswith('mode=1777,X-mount.mkdir 0 0')
    edited = _tmpfs.fstab_edit(text, '/run/nvidia/mps/shm', line)
    mark = _tmpfs.FSTAB_MARK + ' /run/nvidia/mps/shm'
    assert edited.splitlines() == ['UUID=a / ext4 defaults 0 1', '# a comment', mark, line]
    assert _tmpfs.fstab_edit(edited, '/run/nvidia/mps/shm', line) is edited
    assert _tmpfs.fstab_edit(edited, '/run/nvidia/mps/shm', None) == 'UUID=a / ext4 defaults 0 1\n# a comment\n'
    assert _tmpfs.fstab_line('/a b/shm', 4) == 'tmpfs /a\\040b/shm tmpfs rw,nosuid,nodev,noexec,size=4k,mode=1777,X-mount.mkdir 0 0'
    assert _tmpfs.fstab_edit(_tmpfs.fstab_edit('', '/a b/shm', _tmpfs.fstab_line('/a b/shm', 4)), '/a b/shm', None) == ''


def test_fstab_entries_of_two_roots_leave_each_other_alone():
    one = _tmpfs.fstab_edit('', '/srv/a/shm', _tmpfs.fstab_line('/srv/a/shm', 4))
    both = _tmpfs.fstab_edit(one, '/srv/b/shm', _tmpfs.fstab_line('/srv/b/shm', 8))
    assert _tmpfs.fstab_edit(both, '/srv/a/shm', _tmpfs.fstab_line('/srv/a/shm', 4)) is both
    assert _tmpfs.fstab_edit(both, '/srv/b/shm', None) == one


def test_an_fstab_without_our_entry_is_never_rewritten_even_without_a_final_newline():
    text = 'UUID=a / ext4 defaults 0 1'
    assert _tmpfs.fstab_edit(text, '/run/nvidia/mps/shm', None) is text


def test_a_bind_mount_of_another_tmpfs_is_refused():
    info = ('30 1 0:30 / /dev/shm rw,nosuid,nodev - tmpfs tmpfs rw\n'
            '66 22 0:30 / /run/nvidia/mps/shm rw,nosuid,nodev,noexec - tmpfs tmpfs rw\n'
            '67 22 0:31 /sub /srv/x/shm rw - tmpfs tmpfs rw\n')
    with pytest.raises(MpsError, match=r'is a bind mount of a tmpfs that is also mounted elsewhere \(/dev/shm\)'):
        _tmpfs.current_state('/run/nvidia/mps/shm', PAGES, info)
    with pytest.raises(MpsError, match='its directory /sub'):
        _tmpfs.current_state('/srv/x/shm', PAGES, info)


def test_symbolic_links_in_the_parents_are_resolved_as_the_kernel_names_mount_points(tmp_path):
    (tmp_path / 'run').mkdir()
    os.symlink(tmp_path / 'run', tmp_path / 'varrun')
    assert _tmpfs.real_path(str(tmp_path / 'varrun' / 'shm')) == str(tmp_path / 'run' / 'shm')
    info = '66 22 0:40 / %s rw,nosuid - tmpfs tmpfs rw\n' % (tmp_path / 'run' / 'shm')
    assert _tmpfs.mounted_at(str(tmp_path / 'varrun' / 'shm'), info) is not None


@pytest.mark.parametrize('path', ['/a b/shm', '/a%n/shm', '/a:b/shm', '/%s/shm' % ('x' * 300)])
def test_paths_a_unit_file_cannot_carry_are_refused_naming_root(path):
    with pytest.raises(InvalidParameterError, match='^root: '):
        _shm.check_unit_path(path, 'root')


def test_shm_persisted_finds_the_unit_or_the_fstab_line(tmp_path):
    path = str(tmp_path / 'root' / 'shm')
    fstab = tmp_path / 'fstab'
    fstab.write_text('')
    assert not _shm.shm_persisted(path, str(tmp_path), str(fstab))
    fstab.write_text(_tmpfs.fstab_line(path, 4) + '\n')
    assert _shm.shm_persisted(path, str(tmp_path), str(fstab))
    fstab.write_text('')
    (tmp_path / _shm.mount_unit_name(path)).write_text('x')
    assert _shm.shm_persisted(path, str(tmp_path), str(fstab))


@pytest.mark.parametrize('path, unit', [
    ('/run/nvidia/mps/shm', 'run-nvidia-mps-shm.mount'), ('/srv/mps-root/shm', 'srv-mps\\x2droot-shm.mount'),
    ('/run//x/shm/', 'run-x-shm.mount'),
])
def test_mount_unit_names_escape_like_systemd(path, unit):
    assert _shm.mount_unit_name(path) == unit


@pytest.mark.skipif(shutil.which('systemd-escape') is None, reason='systemd-escape not installed')
@pytest.mark.parametrize('path', ['/run/nvidia/mps/shm', '/srv/mps-root/shm', '/run/a.b_c/shm', '/run/ünï/shm'])
def test_mount_unit_names_match_the_real_systemd_escape(path):
    real = subprocess.run(['systemd-escape', '--path', '--suffix=mount', path], capture_output=True, text=True, check=True)
    assert _shm.mount_unit_name(path) == real.stdout.strip()


@pytest.mark.skipif(shutil.which('systemd-analyze') is None, reason='systemd-analyze not installed')
def test_mount_unit_and_shm_dropin_pass_systemd_analyze_verify(tmp_path):
    where = str(tmp_path / 'root' / 'shm')
    unit = tmp_path / _shm.mount_unit_name(where)
    unit.write_text(_shm.render_mount_unit(where, 65536))
    proc = subprocess.run(['systemd-analyze', 'verify', '--man=no', str(unit)], capture_output=True, text=True, check=False,
                          env=dict(os.environ, SYSTEMD_LOG_LEVEL='notice'))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ''
    assert 'Options=rw,nosuid,nodev,noexec,size=65536k,mode=1777' in unit.read_text()


def test_shm_dropin_binds_the_tmpfs_and_refuses_unquotable_paths():
    text = _systemd.render_shm_dropin('/run/nvidia/mps/shm')
    assert 'BindPaths=/run/nvidia/mps/shm:/dev/shm' in text and 'RequiresMountsFor=/run/nvidia/mps/shm' in text
    for bad in ('/a b/shm', '/a%n/shm', '/a"/shm', "/a'/shm", '/a\\/shm'):
        with pytest.raises(MpsError):
            _systemd.render_shm_dropin(bad)


class FakeMounter:
    def __init__(self):
        self.calls = []

    def mount(self, path, kib):
        self.calls.append(('mount', path, kib))

    def remount(self, path, kib):
        self.calls.append(('remount', path, kib))

    def umount(self, path):
        self.calls.append(('umount', path))


class FakeSystemctl:
    def __init__(self):
        self.enabled = set()
        self.calls = []

    def is_enabled(self, unit):
        return unit in self.enabled

    @staticmethod
    def is_active(unit):
        return False

    def states(self, units):
        return {unit: (self.is_active(unit), self.is_enabled(unit)) for unit in units}

    def enable(self, unit):
        self.calls.append(('enable', unit))
        self.enabled.add(unit)

    def disable(self, unit):
        self.calls.append(('disable', unit))
        self.enabled.discard(unit)

    def daemon_reload(self):
        self.calls.append(('daemon-reload',))


def test_systemd_persistence_writes_enables_and_removes_the_unit(tmp_path, monkeypatch):
    monkeypatch.setattr(_shm, 'current_state', lambda path, pages=None, **kwargs: _shm.ShmState(True, 65536, list(_shm.FLAGS), '1777'))
    fstab = tmp_path / 'fstab'
    fstab.write_text('UUID=a / ext4 defaults 0 1\n')
    systemctl = FakeSystemctl()
    units = tmp_path / 'units'

    def manager(persist, check_mode=False):
        return _shm.ShmManager(str(tmp_path / 'root'), persist, str(fstab), str(units), check_mode=check_mode, mounter=FakeMounter(),
                               pages=PAGES, systemctl=systemctl)

    unit_file = units / _shm.mount_unit_name(str(tmp_path / 'root' / 'shm'))
    checked = manager('systemd', check_mode=True).ensure('mounted', '64m')
    assert checked.changed and not unit_file.exists() and systemctl.calls == []
    out = manager('systemd').ensure('mounted', '64m')
    assert out.actions == ['write %s' % unit_file, 'systemctl daemon-reload', 'enable %s' % unit_file.name]
    assert unit_file.exists() and systemctl.enabled == {unit_file.name}
    assert not manager('systemd').ensure('mounted', '64m').changed
    # switching to fstab removes the unit, so two mechanisms never both mount it at boot
    moved = manager('fstab').ensure('mounted', '64m')
    assert 'disable %s' % unit_file.name in moved.actions and not unit_file.exists()
    assert _tmpfs.fstab_line(str(tmp_path / 'root' / 'shm'), 65536) in fstab.read_text()


def test_absent_unmounts_and_a_resize_remounts(tmp_path, monkeypatch):
    monkeypatch.setattr(_shm, 'current_state', lambda path, pages=None, **kwargs: _shm.ShmState(True, 1024, ['rw'], '1777'))
    mounter = FakeMounter()
    fstab = tmp_path / 'fstab'
    manager = _shm.ShmManager(str(tmp_path / 'root'), 'none', str(fstab), str(tmp_path), check_mode=False, mounter=mounter, pages=PAGES)
    resized = manager.ensure('mounted', '64m')
    assert mounter.calls == [('remount', str(tmp_path / 'root' / 'shm'), 65536)]
    assert resized.before['size_kib'] == 1024 and resized.after['size_kib'] == 65536
    manager.ensure('absent', '64m')
    assert mounter.calls[-1] == ('umount', str(tmp_path / 'root' / 'shm'))
    assert not fstab.exists()
