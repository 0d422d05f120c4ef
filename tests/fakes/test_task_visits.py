# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""bench/task_visits.py: the plays it writes run, and its table is (play - floor) / (hosts * tasks) per kind."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / 'bench'
sys.path.insert(0, str(BENCH))

import task_visits  # noqa: E402  pylint: disable=wrong-import-position,import-error


def test_the_table_divides_the_difference_by_hosts_and_tasks(tmp_path, monkeypatch):
    costs = iter([1.0, 3.0, 1.2, 2.2, 0.8, 2.8])  # floor, kind, floor, kind, floor, kind
    monkeypatch.setattr(task_visits, 'run_play', lambda playbook, out, ansible_playbook: next(costs))
    table = task_visits.measure({'floor': 'f.yml', 'assert': 'a.yml'}, str(tmp_path), hosts=2, tasks=4, reps=3, ansible_playbook='x')
    row = table['assert']
    assert row['floor_per_host_s'] == 0.5 and row['play_per_host_s'] == 1.4
    assert abs(row['per_visit_per_host_s'] - (2.8 - 1.0) / 8) < 1e-9
    assert 'assert' in task_visits.report(table, 2, 4, 3)


def test_an_unknown_kind_is_refused_naming_the_kinds(tmp_path):
    done = subprocess.run([sys.executable, str(BENCH / 'task_visits.py'), '--out', str(tmp_path), '--kinds', 'bogus'],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and 'skipped_include, assert, argspec, end_role, args_plain, args_templated' in done.stderr


@pytest.mark.parametrize('kind', task_visits.KINDS)
def test_each_kinds_play_runs_on_a_small_inventory(tmp_path, kind):
    done = subprocess.run([sys.executable, str(BENCH / 'task_visits.py'), '--out', str(tmp_path), '--hosts', '2', '--tasks', '2',
                           '--reps', '1', '--kinds', kind], capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].startswith('CPU per host of one task visit, N=2 hosts, K=2 tasks')
    assert kind in done.stdout
    log = (tmp_path / ('%s.yml.log' % kind)).read_text()
    assert 'h000' in log and 'failed=0' in log
