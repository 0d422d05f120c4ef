# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The health timer as the host plan stops and starts it: a check in progress never writes the ready mark after a run
withdrew it (the timer's service outlives a stopped timer under systemd, so both are stopped)."""
from __future__ import annotations

import os

from ansible_collections.gpufleet.mps.plugins.module_utils._host.around import HEALTH_SERVICE, HEALTH_TIMER, Around
from ansible_collections.gpufleet.mps.plugins.module_utils._observe.paths import read_paths
from ansible_collections.gpufleet.mps.plugins.module_utils._observe.view import HostView
from ansible_collections.gpufleet.mps.plugins.module_utils._outcome import Outcome
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.health import render_health


class Systemctl:
    """Records each call, in order."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, verb):
        return lambda *units: self.calls.append(' '.join((verb,) + units))


def _around(tmp_path, active, **params):
    """An Around whose health check files are in ``tmp_path`` (the script too) and on disk, the timer ``active`` or not."""
    values = {'health_check': True, 'supervisor': 'systemd', 'ready': True, 'health_interval': 30, 'health_timeout': 10,
              'metrics_dir': '', 'state': 'present', 'logrotate_dir': str(tmp_path / 'logrotate.d'), 'local_facts_dir': '',
              'slurm_task_prolog': '', 'slurm_gres_conf': ''}
    values.update(params)
    systemctl = Systemctl()
    around = Around(values, str(tmp_path / 'root'), str(tmp_path / 'etc'), str(tmp_path / 'units'), systemctl)
    files = render_health(around.root, around.config_dir, around.unit_dir, script=str(tmp_path / 'sbin' / 'health'))
    around._health_files = lambda: files  # pylint: disable=protected-access
    for path, text in files.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'w', encoding='utf-8') as handle:
            handle.write(text)
        os.chmod(path, 0o644 if path.startswith(around.unit_dir) else 0o755)
    wants = around.wants()
    view = HostView(paths=read_paths(wants.files, wants.dirs, wants.others))
    view.units[HEALTH_TIMER] = (active, True)
    around.view = view.seal()
    return around, systemctl


def _run(out):
    for _change, run in out.steps:
        run()


def test_a_teardown_stops_the_check_in_progress_with_the_timer_before_anything_else(tmp_path):
    around, systemctl = _around(tmp_path, active=True)
    out = Outcome()
    around.health(out, wanted_here=False)
    assert [(change.kind, change.action) for change in out.changes][0] == ('unit', 'stop and disable %s' % HEALTH_TIMER)
    _run(out)
    assert systemctl.calls[:3] == ['stop %s' % HEALTH_TIMER, 'stop %s' % HEALTH_SERVICE, 'disable %s' % HEALTH_TIMER]
    assert systemctl.calls[3:] == ['daemon_reload'] and not os.listdir(tmp_path / 'units')


def test_a_run_that_brings_daemons_down_pauses_the_timer_and_its_check_and_starts_it_after_them(tmp_path):
    around, systemctl = _around(tmp_path, active=True)
    head, tail = Outcome(), Outcome()
    assert around.pause_health(head) is True
    around.health(tail, wanted_here=True, paused=True)
    assert [(change.kind, change.action) for change in head.changes] == [('unit', 'stop %s' % HEALTH_TIMER)]
    assert 'write %s back' % around.ready_path in head.changes[0].reason
    assert [(change.kind, change.action, change.reason) for change in tail.changes] == [
        ('unit', 'start %s' % HEALTH_TIMER, 'the daemons this run brought down are up again')]
    _run(head)
    assert systemctl.calls == ['stop %s' % HEALTH_TIMER, 'stop %s' % HEALTH_SERVICE]
    _run(tail)
    assert systemctl.calls[2:] == ['restart %s' % HEALTH_TIMER]


def test_a_timer_that_is_not_running_is_not_paused_and_a_run_without_a_pause_leaves_a_running_one(tmp_path):
    around, systemctl = _around(tmp_path, active=False)
    head = Outcome()
    assert around.pause_health(head) is False and not head.changes
    around, systemctl = _around(tmp_path, active=True)
    tail = Outcome()
    around.health(tail, wanted_here=True)
    assert not tail.changes and not systemctl.calls
