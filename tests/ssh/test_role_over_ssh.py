# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet role over SSH, as fleets are reached: an sshd of this test's own on 127.0.0.1 (the benchmark's,
bench/fleetbench.py ``SshServer``: its own config, host key, user key and port), ControlPersist, one simulated
GPU host of its own. Everything the role and the modules need on the host goes through the SSH session: the
simulated host's wrappers name every path absolutely (make-simhost.sh), and the play's ``environment:`` carries
only what a real driver would not need (where the fake NVML library and its GPU set are).

The path a user takes: converge, a no-op (changed=0), a limits change, the facts, teardown - then nothing of
the role left on the host and no process running. Run by ``make ssh`` (part of ``make test``) with TEST_ROOT
and ANSIBLE_COLLECTIONS_PATH set as the Makefile sets them.
"""
from __future__ import annotations

import getpass
import json
import os
import re
import subprocess
import sys
from typing import Dict, Iterator, List

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
sys.path.insert(0, os.path.join(REPO, 'bench'))
sys.path.insert(0, os.path.join(REPO, 'tests', 'fakes'))
from fleetbench import SshServer  # noqa: E402  pylint: disable=wrong-import-position
from private_host import PYTHON, private_host  # noqa: E402  pylint: disable=wrong-import-position
RECAP = re.compile(r'^sshhost\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)\s+rescued=(\d+)', re.M)

PLAYBOOK = '''---
- name: The fleet role over SSH
  hosts: sshhost
  gather_facts: false
  environment:
    FAKE_NVML_CONFIG: "{{ sim }}/nvml.ini"
    LD_LIBRARY_PATH: "{{ sim }}/lib"
  vars:
    mps_root: "{{ base }}/run/nvidia/mps"
    mps_config_dir: "{{ base }}/etc/gpufleet-mps"
    mps_control_binary: "{{ sim }}/bin/nvidia-cuda-mps-control"
    mps_python: "%s"
    mps_supervisor: none
    mps_stop_timeout: 5
    mps_logrotate_dir: "{{ base }}/etc/logrotate.d"
    mps_local_facts_dir: "{{ base }}/etc/ansible/facts.d"
    mps_resources:
      - {name: train, devices: [0, 1], replicas: "{{ replicas | default(2) | int }}"}
      - {name: infer, devices: [2]}
  roles:
    - role: gpufleet.mps.fleet
''' % PYTHON


@pytest.fixture(scope='module')
def fleet() -> Iterator[Dict[str, str]]:
    """An sshd and a simulated host of this test's own, an inventory reaching it through that sshd; all ended after."""
    work, base, sim = private_host('ssh-role', 'ssh')
    ssh = SshServer(work)
    ssh.start()
    try:
        with open(os.path.join(work, 'inventory.yml'), 'w', encoding='utf-8') as handle:
            handle.write('\n'.join([
                '---', 'all:', '  hosts:', '    sshhost:', '      ansible_connection: ssh', '      ansible_host: 127.0.0.1',
                '      ansible_port: %d' % ssh.port, '      ansible_user: %s' % getpass.getuser(),
                '      ansible_ssh_private_key_file: %s' % ssh.user_key, '      ansible_python_interpreter: %s' % PYTHON,
                '      base: %s' % base, '      sim: %s' % sim, '']))
        with open(os.path.join(work, 'ansible.cfg'), 'w', encoding='utf-8') as handle:
            handle.write('\n'.join([
                '[defaults]', 'host_key_checking = False', 'retry_files_enabled = False', 'nocolor = True', '',
                '[ssh_connection]',
                'ssh_args = -o ControlMaster=auto -o ControlPersist=60s -o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no '
                '-o IdentitiesOnly=yes -o LogLevel=ERROR',
                'control_path_dir = %s' % ssh.control_dir, 'pipelining = True', '']))
        with open(os.path.join(work, 'fleet.yml'), 'w', encoding='utf-8') as handle:
            handle.write(PLAYBOOK)
        yield {'work': work, 'base': base, 'sim': sim}
    finally:
        ssh.stop()
        subprocess.run([PYTHON, os.path.join(REPO, 'hacking', 'leftovers.py'), '--kill', work], check=False, capture_output=True)


def ansible(fleet: Dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    # Nothing of this shell's simulated host or of a caller's Ansible settings reaches the session but the files above.
    env = {k: v for k, v in os.environ.items() if not k.startswith(('CUDA_MPS_', 'FAKE_', 'NVML_', 'ANSIBLE_', 'GPUFLEET_'))}
    env.update(ANSIBLE_CONFIG=os.path.join(fleet['work'], 'ansible.cfg'), ANSIBLE_COLLECTIONS_PATH=os.environ['ANSIBLE_COLLECTIONS_PATH'],
               LD_LIBRARY_PATH='')
    return subprocess.run(list(argv) + ['-i', os.path.join(fleet['work'], 'inventory.yml')], cwd=fleet['work'], env=env,
                          capture_output=True, text=True, timeout=600, check=False)


def play(fleet: Dict[str, str], *extra: str) -> List[int]:
    proc = ansible(fleet, os.path.join(REPO, '.venv', 'bin', 'ansible-playbook'), os.path.join(fleet['work'], 'fleet.yml'), *extra)
    found = RECAP.search(proc.stdout)
    assert proc.returncode == 0 and found, proc.stdout[-5000:] + proc.stderr[-2000:]
    return [int(value) for value in found.groups()]


def ask(fleet: Dict[str, str], pipe: str, command: str) -> str:
    """A control command to a daemon of the host, answered through the simulated host's own wrapper over SSH."""
    proc = ansible(fleet, os.path.join(REPO, '.venv', 'bin', 'ansible'), 'sshhost', '-m', 'ansible.builtin.shell', '-a',
                   'echo %s | CUDA_MPS_PIPE_DIRECTORY=%s %s/bin/nvidia-cuda-mps-control' % (command, pipe, fleet['sim']))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return proc.stdout.split('>>', 1)[1].strip() if '>>' in proc.stdout else proc.stdout


def test_the_simulated_hosts_tools_work_in_a_bare_ssh_session(fleet: Dict[str, str]) -> None:
    # no environment at all but the session's: the wrappers find their interpreter, library and GPU set themselves
    proc = ansible(fleet, os.path.join(REPO, '.venv', 'bin', 'ansible'), 'sshhost', '-m', 'ansible.builtin.command', '-a',
                   '%s/bin/nvidia-smi -L' % fleet['sim'])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(re.findall(r'^GPU \d+: ', proc.stdout, re.M)) == 4, proc.stdout


def test_the_role_converges_is_idempotent_changes_limits_and_tears_down_over_ssh(fleet: Dict[str, str]) -> None:
    root = os.path.join(fleet['base'], 'run', 'nvidia', 'mps')
    ok, changed, unreachable, failed, _skipped, rescued = play(fleet)
    assert changed > 0 and (unreachable, failed, rescued) == (0, 0, 0)
    assert sorted(os.listdir(root)) == ['.ready', 'infer', 'train']
    assert ask(fleet, root + '/train/pipe', 'get_default_active_thread_percentage').splitlines()[-1] == '50.0'

    assert play(fleet)[1:4] == [0, 0, 0], 'the second run over SSH changed something'

    _ok, changed, _unreachable, failed, _skipped, _rescued = play(fleet, '-e', 'replicas=4')
    assert (changed > 0, failed) == (True, 0)
    assert ask(fleet, root + '/train/pipe', 'get_default_active_thread_percentage').splitlines()[-1] == '25.0'

    proc = ansible(fleet, os.path.join(REPO, '.venv', 'bin', 'ansible'), 'sshhost', '-m', 'gpufleet.mps.mps_info', '-a',
                   'root=%s config_dir=%s/etc/gpufleet-mps control_binary=%s/bin/nvidia-cuda-mps-control' % (root, fleet['base'], fleet['sim']))
    facts = json.loads(proc.stdout.split('=>', 1)[1]) if '=>' in proc.stdout else {}
    assert proc.returncode == 0 and facts, proc.stdout[-3000:] + proc.stderr[-1000:]
    # mps_info has no play environment here: it finds no NVML, and still reads the daemons through the control UI
    assert {d['name']: (d['running'], d['healthy']) for d in facts['daemons']} == {'train': (True, True), 'infer': (True, True)}

    assert play(fleet, '-e', 'mps_state=absent', '-e', 'mps_remove_logs=true')[3] == 0
    assert not os.path.exists(root) or os.listdir(root) == []
    assert not os.path.exists(os.path.join(fleet['base'], 'etc', 'gpufleet-mps')) or not os.listdir(os.path.join(fleet['base'], 'etc', 'gpufleet-mps'))
    assert play(fleet, '-e', 'mps_state=absent')[1:4] == [0, 0, 0], 'a second teardown over SSH changed something'
    left = subprocess.run([PYTHON, os.path.join(REPO, 'hacking', 'leftovers.py'), fleet['work']], capture_output=True, text=True, check=False)
    assert left.returncode == 0, left.stdout + left.stderr
