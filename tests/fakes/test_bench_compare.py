# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""bench/compare.py, which make bench-quick runs: its table from alternated runs of two trees, and a baseline this
clone lacks (a shallow CI clone) reported, not failed."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / 'bench'
sys.path.insert(0, str(BENCH))

import compare  # noqa: E402  pylint: disable=wrong-import-position,import-error


def _run(tree, hosts, pair, b, h, e):
    return {'tree': tree, 'hosts': hosts, 'pair': pair, 'fleet': {
        'variants': {'b': {'cpu_per_host_s': b}, 'h': {'cpu_per_host_s': h}, 'e': {'cpu_per_host_s': e}},
        'cpu_ratios': {'b/e': b / e, 'h/e': h / e, 'b/h': b / h}}}


def test_the_table_takes_medians_over_pairs_and_divides_new_by_old_per_fleet_size():
    runs = [_run('old', 4, 1, 1.2, 1.0, 0.5), _run('new', 4, 1, 0.9, 0.8, 0.5),
            _run('old', 4, 2, 1.4, 1.1, 0.6), _run('new', 4, 2, 0.8, 0.7, 0.4),
            _run('old', 4, 3, 1.0, 0.9, 0.4), _run('new', 4, 3, 1.0, 0.9, 0.6),
            _run('old', 16, 1, 2.0, 1.0, 1.0), _run('new', 16, 1, 1.0, 1.0, 1.0)]
    table = compare.summarise(runs)
    assert sorted(table) == [4, 16]
    assert table[4]['old']['b'] == 1.2 and table[4]['new']['b'] == 0.9
    assert abs(table[4]['new/old']['b'] - 0.75) < 1e-9
    assert abs(table[4]['old']['b/e'] - 2.4) < 1e-9 and abs(table[4]['new']['b/e'] - 1.8) < 1e-9
    assert table[16]['new/old']['b'] == 0.5 and table[16]['new/old']['e'] == 1.0
    text = compare.report(table, {'old': ('4e9c7f4', ''), 'new': ('abc1234', '')}, 3)
    assert text.splitlines()[0] == 'no-op CPU per host, 4e9c7f4 (old) against abc1234 (new), 3 alternated pair(s) per N, medians:'
    assert '  4   new/old     0.75' in text


def test_a_baseline_this_clone_lacks_is_said_and_compares_nothing(tmp_path):
    done = subprocess.run([sys.executable, str(BENCH / 'compare.py'), '--baseline', '0' * 40, '--out', str(tmp_path / 'out')],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == 'compare.py: %s is not in this clone (shallow?): nothing compared' % ('0' * 40)
    assert not (tmp_path / 'out').exists()
