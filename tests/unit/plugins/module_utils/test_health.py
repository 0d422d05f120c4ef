# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The health check behind <root>/.ready between Ansible runs, run as the timer would run it."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils import _gpus
from ansible_collections.gpufleet.mps.plugins.module_utils._errors import MpsError
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.layout import config_paths, resource_paths
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.health import render_health
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.liveness import inspect
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.process import daemon_env


class Health:
    """A root with daemons started as the unit starts them, and the health check's files rendered for it."""

    def __init__(self, base):
        self.base = base
        self.root = str(base / 'root')
        self.etc = str(base / 'etc')
        self.units = str(base / 'units')
        self.binary = str(base / 'host' / 'bin' / 'nvidia-cuda-mps-control')
        os.makedirs(os.path.join(self.units, 'multi-user.target.wants'))
        os.makedirs(self.etc)
        self.script = str(base / 'health')
        files = render_health(self.root, self.etc, self.units, interval=30, timeout=2, script=self.script)
        for path, content in files.items():
            with open(path, 'w', encoding='utf-8') as handle:
                handle.write(content)
        os.chmod(self.script, 0o755)
        self.pids = []

    def start(self, name, uuid, enabled=True, v3_server=''):
        paths = resource_paths(self.root, name)
        config = config_paths(self.etc, name)
        for directory in (paths.pipe_dir, paths.log_dir):  # as the modules do: a real -d creates neither
            os.makedirs(directory, exist_ok=True)
        args = []
        if v3_server:  # an MPS v3 daemon with one server, as the unit starts a v3 resource's
            with open(config.v3_config, 'w', encoding='utf-8') as handle:
                handle.write('schema_version = "1.0"\n[servers.%s]\nallowed_devices = "%s"\nuid = %d\n' % (v3_server, uuid, os.geteuid()))
            args = ['-p', '3', '-a', config.v3_config]
        subprocess.run([self.binary, '-d', *args], env=daemon_env(paths, [uuid]), check=True, capture_output=True)
        for attempt in range(200):
            if inspect(paths).running:
                break
            time.sleep(0.05)
        self.pids.append(inspect(paths).pid)
        with open(config.env_file, 'w', encoding='utf-8') as handle:
            handle.write('# test\nCUDA_MPS_PIPE_DIRECTORY=%s\nMPS_CONTROL=%s\n' % (paths.pipe_dir, self.binary)
                         + ('MPS_V3_SERVER=%s\n' % v3_server if v3_server else ''))
        if enabled:
            os.symlink('/dev/null', os.path.join(self.units, 'multi-user.target.wants', 'gpufleet-mps@%s.service' % config.instance))
        return self.pids[-1]

    def run(self):
        return subprocess.run([self.script], capture_output=True, text=True, timeout=60, check=True)

    @property
    def ready(self):
        return os.path.exists(os.path.join(self.root, '.ready'))


@pytest.fixture
def health(simhost):
    made = Health(simhost)
    yield made
    for pid in made.pids:
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _uuids():
    with _gpus.Nvml() as nvml:
        return [gpu.uuid for gpu in nvml.gpus()]


def test_ready_follows_the_daemons_answers(health):
    gpus = _uuids()
    assert health.run() and not health.ready  # no daemon: nothing is ready
    health.start('train', gpus[0])
    pid = health.start('example.com/infer', gpus[1])
    result = health.run()
    assert health.ready and '2 daemon(s) healthy' in result.stdout
    os.kill(pid, signal.SIGSTOP)  # a hung daemon: it accepts, never answers
    try:
        result = health.run()
        assert not health.ready
        assert 'example.com/infer/pipe did not answer within 2s' in result.stderr and 'withdrawn (1 not answering, 1 healthy)' in result.stderr
    finally:
        os.kill(pid, signal.SIGCONT)
    health.run()
    assert health.ready


def test_a_disabled_resource_is_not_asked(health):
    gpus = _uuids()
    health.start('train', gpus[0])
    pid = health.start('pruned', gpus[1], enabled=False)
    os.kill(pid, signal.SIGKILL)
    health.run()
    assert health.ready


def test_a_stopped_daemon_of_an_enabled_unit_withdraws_the_mark(health):
    pid = health.start('train', _uuids()[0])
    health.run()
    assert health.ready
    os.kill(pid, signal.SIGKILL)
    health.run()
    assert not health.ready


def test_a_v3_daemon_is_healthy_while_it_lists_its_server(health, r615):
    """A v3 resource (MPS_V3_SERVER in its environment file) is asked with v3 words - never the legacy question, which a
    v3 daemon refuses - and is healthy while it lists its server Ready (issue 43)."""
    r615()
    gpus = _uuids()
    legacy_script = render_health(health.root, health.etc, health.units, interval=30, timeout=2, script=health.script)[health.script]
    files = render_health(health.root, health.etc, health.units, interval=30, timeout=2, script=health.script, v3=True)
    assert files[health.script] != legacy_script  # a host without a v3 resource keeps the script it had
    with open(health.script, 'w', encoding='utf-8') as handle:
        handle.write(files[health.script])
    health.start('train', gpus[0])
    pid = health.start('shared', gpus[1], v3_server='shared')
    result = health.run()
    assert health.ready and '2 daemon(s) healthy' in result.stdout, result.stdout + result.stderr
    os.kill(pid, signal.SIGSTOP)  # hung: it accepts, never answers
    try:
        result = health.run()
        assert not health.ready and 'shared/pipe did not answer within 2s' in result.stderr, result.stderr
    finally:
        os.kill(pid, signal.SIGCONT)
    health.run()
    assert health.ready


def test_the_units_and_what_they_refuse(tmp_path):
    files = render_health('/run/mps/', '/etc/gpufleet-mps', str(tmp_path), interval=45, timeout=5)
    service = files[str(tmp_path / 'gpufleet-mps-health.service')]
    timer = files[str(tmp_path / 'gpufleet-mps-health.timer')]
    assert 'Type=oneshot' in service and 'ExecStart=/usr/local/sbin/gpufleet-mps-health' in service
    assert 'OnUnitActiveSec=45s' in timer and 'WantedBy=timers.target' in timer
    assert "root='/run/mps'" in files['/usr/local/sbin/gpufleet-mps-health']
    with pytest.raises(MpsError, match='root'):
        render_health("/run/it's", '/etc/gpufleet-mps')
    with pytest.raises(MpsError, match='interval'):
        render_health('/run/mps', '/etc/gpufleet-mps', interval=1)
