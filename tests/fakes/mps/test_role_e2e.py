# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""tests/gpu/role_e2e.py, the fleet role end to end as a GPU host runs it, played on a private simulated host."""
from __future__ import annotations

import os
import subprocess

from conftest import PYTHON, REPO, new_base, remove_tree
import transcript

E2E = os.path.join(REPO, 'tests', 'gpu', 'role_e2e.py')
MAKE_SIMHOST = os.path.join(REPO, 'tests', 'fakes', 'make-simhost.sh')


def _host_env(base: str) -> dict[str, str]:
    """A simulated host of its own (its own GPU state), and the environment its env file sets."""
    lib = os.path.join(os.environ['GPUFLEET_SIMHOST'], 'lib')  # make test-fakes sources .simhost/env: the built fake NVML
    subprocess.run([MAKE_SIMHOST, os.path.join(base, 'host'), lib, PYTHON], check=True, capture_output=True)
    out = subprocess.run(['bash', '-c', f'. {base}/host/env && env -0'], check=True, capture_output=True).stdout
    return dict(item.split('=', 1) for item in out.decode().split('\0') if '=' in item)


def test_the_role_end_to_end_passes_its_seven_steps_on_a_simulated_host() -> None:
    base = new_base('e2e')
    os.chmod(base, 0o755)
    try:
        env = _host_env(base)
        proc = subprocess.run([PYTHON, E2E, '--simulated', '--python', PYTHON, '--work', os.path.join(base, 'w')], env=env,
                              capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert [line.split(':')[0] for line in proc.stdout.splitlines() if line.startswith(('PASS', 'FAIL'))] == [
            'PASS provision', 'PASS client', 'PASS no-op', 'PASS limits', 'PASS facts', 'PASS busy', 'PASS teardown']
        assert 'SUMMARY: role end to end: 7 of 7 steps passed' in proc.stdout
        assert not os.path.exists(os.path.join(base, 'w'))  # removed after a passing run
    finally:
        transcript.kill_all(transcript.processes_with(base + os.sep))
        remove_tree(base)


def test_without_a_real_binary_and_not_simulated_it_skips() -> None:
    proc = subprocess.run([PYTHON, E2E], env=dict(os.environ, PATH='/usr/bin:/bin'), capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout.startswith('SKIP: no real nvidia-cuda-mps-control'), proc.stdout + proc.stderr
