# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The health check's metrics directory as the host plan manages it: made when missing, an old textfile removed."""
from __future__ import annotations

import os

from ansible_collections.gpufleet.mps.plugins.module_utils._host.around import HEALTH_TIMER, Around
from ansible_collections.gpufleet.mps.plugins.module_utils._observe.paths import read_paths
from ansible_collections.gpufleet.mps.plugins.module_utils._observe.view import HostView
from ansible_collections.gpufleet.mps.plugins.module_utils._outcome import Outcome
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.health import render_health
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.metrics import METRICS_FILE


class Systemctl:
    """Answers as if the timer were enabled and active; records nothing (the plan is not executed here)."""

    def is_enabled(self, _unit):
        return True

    def is_active(self, _unit):
        return True

    def daemon_reload(self):
        raise AssertionError('not executed in these tests')


def _around(tmp_path, metrics_dir):
    params = {'health_check': True, 'supervisor': 'systemd', 'ready': True, 'health_interval': 30, 'health_timeout': 10,
              'metrics_dir': metrics_dir, 'state': 'present', 'logrotate_dir': str(tmp_path / 'logrotate.d'), 'local_facts_dir': '',
              'slurm_task_prolog': '', 'slurm_gres_conf': ''}
    around = Around(params, str(tmp_path / 'root'), str(tmp_path / 'etc'), str(tmp_path / 'units'), Systemctl())
    return around


def _see(around):
    """The view a host's run reads of what the health check plans from (the timer enabled and active)."""
    wants = around.wants()
    view = HostView(paths=read_paths(wants.files, wants.dirs, wants.others))
    view.units[HEALTH_TIMER] = (True, True)
    around.view = view.seal()


def _health_files(tmp_path, script, metrics_dir):
    """The health check's files with the script at ``script`` (never the host's /usr/local/sbin)."""
    return render_health(str(tmp_path / 'root'), str(tmp_path / 'etc'), str(tmp_path / 'units'), script=script,
                         metrics_dir=metrics_dir or None)


def test_a_missing_metrics_directory_is_made(tmp_path):
    script = str(tmp_path / 'sbin' / 'health')
    around = _around(tmp_path, str(tmp_path / 'metrics'))
    around._health_files = lambda: _health_files(tmp_path, script, around.params['metrics_dir'])  # pylint: disable=protected-access
    for path, text in around._health_files().items():  # pylint: disable=protected-access
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'w', encoding='utf-8') as handle:
            handle.write(text)
        os.chmod(path, 0o755 if path == script else 0o644)
    _see(around)
    out = Outcome()
    around.health(out, wanted_here=True)
    assert [change.action for change in out.changes] == ['create %s' % (tmp_path / 'metrics')]


def test_a_textfile_of_an_earlier_directory_goes_when_the_metrics_move_or_stop(tmp_path):
    old_dir = tmp_path / 'old'
    old_dir.mkdir()
    (old_dir / METRICS_FILE).write_text('gpufleet_mps_ready{root="/r"} 1\n')
    (tmp_path / 'new').mkdir()
    script = str(tmp_path / 'sbin' / 'health')
    os.makedirs(os.path.dirname(script))
    with open(script, 'w', encoding='utf-8') as handle:
        handle.write(_health_files(tmp_path, script, str(old_dir))[script])
    for wanted in (str(tmp_path / 'new'), ''):
        around = _around(tmp_path, wanted)
        around._health_files = lambda wanted=wanted: _health_files(tmp_path, script, wanted)  # pylint: disable=protected-access
        _see(around)
        out = Outcome()
        around.health(out, wanted_here=True)
        assert 'remove %s' % (old_dir / METRICS_FILE) in [change.action for change in out.changes], out.changes
    # the same directory: nothing to remove
    around = _around(tmp_path, str(old_dir))
    around._health_files = lambda: _health_files(tmp_path, script, str(old_dir))  # pylint: disable=protected-access
    _see(around)
    out = Outcome()
    around.health(out, wanted_here=True)
    assert not [change for change in out.changes if change.action.startswith('remove')]
