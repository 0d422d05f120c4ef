# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""bench/payload_phases.py: the phases of one mps_host process, run from the AnsiballZ payload Ansible really sends
(no bytecode at hand), on a simulated host of the test's own."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIBDIR = Path(os.environ.get('GPUFLEET_SIMHOST', '')) / 'lib'


def test_a_no_op_from_the_real_payload_is_split_into_its_phases(tmp_path):
    if not (LIBDIR / 'libnvidia-ml.so.1').exists():
        pytest.skip('needs the simulated host of make simhost (GPUFLEET_SIMHOST)')
    subprocess.run([str(REPO / 'tests' / 'fakes' / 'make-simhost.sh'), str(tmp_path / 'host'), str(LIBDIR), sys.executable],
                   check=True, capture_output=True)
    subprocess.run([str(REPO / 'hacking' / 'collection-tree.sh'), str(tmp_path / 'coll')], cwd=REPO, check=True, capture_output=True)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(tmp_path / 'coll'), FAKE_NVML_CONFIG=str(tmp_path / 'host' / 'nvml.ini'),
               PATH='%s:%s' % (tmp_path / 'host' / 'bin', os.environ['PATH']), LD_LIBRARY_PATH=str(LIBDIR),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / 'local'), ANSIBLE_HOME=str(tmp_path / 'ansible-home'))
    args = {'root': str(tmp_path / 'root'), 'config_dir': str(tmp_path / 'etc'), 'supervisor': 'none', 'health_check': False,
            'logrotate': False, 'local_facts': False, 'resources': [{'name': 'train', 'devices': [0, 1]}]}
    script = str(REPO / 'bench' / 'payload_phases.py')
    payload = tmp_path / 'AnsiballZ_mps_host.py'
    try:
        subprocess.run([sys.executable, script, 'build', '--out', str(payload), json.dumps(args)], env=env, check=True,
                       capture_output=True, cwd=tmp_path)
        done = subprocess.run([sys.executable, script, 'report', str(payload), '--reps', '2'], env=env, capture_output=True,
                              text=True, check=True, cwd=tmp_path)
        result = subprocess.run([sys.executable, script, 'run', str(payload)], env=env, capture_output=True, text=True,
                                check=False, cwd=tmp_path)
        cached = subprocess.run([sys.executable, script, 'report', str(payload), '--reps', '2', '--pyc', str(tmp_path / 'pyc')],
                                env=env, capture_output=True, text=True, check=True, cwd=tmp_path)
    finally:
        subprocess.run([sys.executable, str(REPO / 'hacking' / 'leftovers.py'), '--kill', str(tmp_path)], check=False,
                       capture_output=True)
    report = json.loads(done.stdout)
    medians = report['medians_s']
    # the payload's source is compiled, the collection's and ansible's apart; one control UI process; a no-op
    assert medians['compile_collection'] > 0 and medians['compile_ansible'] > 0
    # mps_host's bytecode cache (_bytecode.py), through the real payload: the converge made the root, the first timed run
    # compiled the collection's module_utils and stored them, the second loaded them
    cache = tmp_path / 'root' / '.bytecode'
    assert oct(cache.stat().st_mode & 0o777) == '0o700' and any(name.startswith('_host.manager-') for name in os.listdir(cache))
    first, second = report['samples']
    assert second['compile_collection'] < 0.3 * first['compile_collection'], report['samples']
    assert medians['observe'] >= medians['ui'] > 0 and medians['decide'] > 0 and medians['interpreter'] > 0
    # the timed phases do not overlap: what is left of each run's total is never negative
    assert all(sample['rest'] >= 0 for sample in report['samples']), report['samples']
    assert json.loads(result.stdout)['changed'] is False, result.stdout
    # the bytecode-cache spike: the first run fills the cache, then almost nothing of the payload is compiled
    served = json.loads(cached.stdout)['samples'][-1]
    assert served['load_cached'] > 0 and os.listdir(tmp_path / 'pyc')
    assert served['compile_collection'] < 0.2 * medians['compile_collection'], (served, medians)
    assert served['compile_ansible'] < 0.2 * medians['compile_ansible'], (served, medians)
