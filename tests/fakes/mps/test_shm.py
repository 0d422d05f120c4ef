# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The /dev/shm rendezvous of clients and servers (FAKE_MPS_SHM; README.md, "Interpretations")."""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
from typing import Optional

import pytest

from conftest import CLIENT, NOBODY, PYTHON, SIM, SimHost, pid_alive, shm_path, wait_until
import mps_client
import mps_common
import mps_server

# the client as a container would run it: the system interpreter (mps_client.py is stdlib-only)
SYSTEM_PYTHON = '/usr/bin/python3' if os.access('/usr/bin/python3', os.X_OK) else PYTHON

needs_mount_ns = pytest.mark.skipif(os.geteuid() != 0 or shutil.which('unshare') is None,
                                    reason='a private mount namespace needs root and unshare (util-linux)')


def in_mount_ns(host: SimHost, script: str, *args: str, env: Optional[dict[str, str]] = None) -> tuple[subprocess.Popen, str, str]:
    """``sh -c script`` ("$@" = args) in a new mount namespace of private propagation; (process, stdout, stderr).

    ``unshare`` without ``--fork`` execs sh, which execs the last program: its pid is the Popen's.
    """
    proc = subprocess.Popen(['unshare', '--mount', '--propagation', 'private', 'sh', '-c', script, 'sh', *args],  # pylint: disable=consider-using-with
                            env=host.environ(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    host.procs.append(proc)
    out, err = proc.communicate(timeout=30)
    return proc, out, err


def client_in_mount_ns(host: SimHost, setup: str, env: Optional[dict[str, str]] = None) -> tuple[subprocess.Popen, str, dict]:
    """A --once client run after the mount commands of setup; (process, its stderr, its JSON line)."""
    proc, out, err = in_mount_ns(host, f'{setup} && exec "$@"', SYSTEM_PYTHON, CLIENT, '--once', env=env)
    lines = out.splitlines()
    assert len(lines) == 1, (proc.returncode, out, err)
    return proc, err, json.loads(lines[0])


def test_the_standalone_scripts_use_the_common_names() -> None:
    for module in (mps_client, mps_server):
        assert (module.SHM_DIR, module.SHM_PREFIX) == (mps_common.SHM_DIR, mps_common.SHM_PREFIX)
    assert mps_client.SHM_MODES == mps_common.SWITCHES['FAKE_MPS_SHM'][1]


def test_a_server_creates_its_rendezvous_file_and_removes_it_when_it_exits(running: SimHost) -> None:
    client = running.client()
    spid = client.info()['server_pid']
    path = shm_path(spid)
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644 and st.st_uid == 0
    assert client.stop() == 0
    assert os.path.exists(path)  # an idle server stays, and so does its file
    running.out([f'shutdown_server {spid}'])
    wait_until(lambda: not pid_alive(spid), what='server exit')
    wait_until(lambda: not os.path.exists(path), what=f'{path} removed')
    assert not [m for m in running.log_messages('server') if 'Failed to create' in m]


def test_the_rendezvous_file_does_not_depend_on_the_umask(host: SimHost) -> None:
    old = os.umask(0o077)
    try:
        host.start()
    finally:
        os.umask(old)
    spid = host.client('--once').info()['server_pid']
    assert stat.S_IMODE(os.lstat(shm_path(spid)).st_mode) == 0o644


def test_a_terminated_server_removes_its_file(running: SimHost) -> None:
    spid = running.client('--once').info()['server_pid']
    os.kill(spid, signal.SIGTERM)
    wait_until(lambda: not pid_alive(spid), what='server exit')
    assert not os.path.exists(shm_path(spid))


def test_servers_of_a_killed_daemon_remove_their_files(host: SimHost) -> None:
    host.start(env={'FAKE_MPS_FAULT_KILL_ON': 'get_server_list'})
    client = host.client()
    spid = client.info()['server_pid']
    assert os.path.exists(shm_path(spid))
    host.ui(['get_server_list'])
    wait_until(lambda: not pid_alive(spid), what='server exit')
    assert not os.path.exists(shm_path(spid))
    assert client.rest()[0] == 1


def test_a_server_of_another_uid_creates_its_file_as_that_uid(running: SimHost) -> None:
    info = running.client(uid=NOBODY).info()
    assert info['ok'] is True and info['uid'] == NOBODY
    st = os.lstat(shm_path(info['server_pid']))
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY, 0o644)


def test_a_client_fails_when_the_file_of_its_server_is_missing(running: SimHost) -> None:
    first = running.client()
    spid = first.info()['server_pid']
    os.unlink(shm_path(spid))  # as if the client lived elsewhere
    second = running.client()
    rc, out, err = second.rest()
    assert rc == 1
    result = json.loads(out)
    assert (result['ok'], result['error'], result['code']) == (False, 'CUDA_ERROR_MPS_CONNECTION_FAILED', 805)
    assert result['detail'].startswith(f'{shm_path(spid)} not found')
    assert 'CUDA error 805' in err
    # the daemon attached it, then saw it go
    running.wait_log(f'Client {{PID: {second.pid}, Context ID: 1}} disconnected', 'server')
    assert running.out([f'get_client_list {spid}']) == f'{first.pid}\n'


def test_shm_off_on_the_daemon_creates_nothing(host: SimHost) -> None:
    host.start(env={'FAKE_MPS_SHM': 'off'})
    info = host.client('--once', env={'FAKE_MPS_SHM': 'off'}).info()
    assert info['ok'] is True
    assert not os.path.exists(shm_path(info['server_pid']))
    # both sides must agree: a checking client misses the file
    rc, out, _err = host.client().rest()
    assert rc == 1 and json.loads(out)['error'] == 'CUDA_ERROR_MPS_CONNECTION_FAILED'


def test_a_bad_shm_value_is_rejected_by_the_daemon_and_by_the_client(host: SimHost) -> None:
    proc = host.start(env={'FAKE_MPS_SHM': 'maybe'}, check=False)
    assert proc.returncode == 2 and 'FAKE_MPS_SHM' in proc.stderr
    host.start()
    rc, out, err = host.client(env={'FAKE_MPS_SHM': 'maybe'}).rest()
    assert (rc, out) == (2, '') and "FAKE_MPS_SHM='maybe'" in err


@needs_mount_ns
def test_a_client_with_a_private_dev_shm_fails(running: SimHost) -> None:
    spid = running.client().info()['server_pid']
    proc, err, result = client_in_mount_ns(running, 'mount -t tmpfs tmpfs /dev/shm')
    assert proc.returncode == 1
    assert (result['ok'], result['error']) == (False, 'CUDA_ERROR_MPS_CONNECTION_FAILED')
    detail = result['detail']
    assert shm_path(spid) in detail and "this client's /dev/shm is not the MPS server's" in detail
    assert "mount the daemon's /dev/shm into the container" in detail and '--ipc=host' in detail
    assert f'[{detail}]' in err
    # the daemon had attached it (the same pid: unshare and sh exec), then saw it go
    running.wait_log(f'Client {{PID: {proc.pid}, Context ID: 1}} disconnected', 'server')
    assert running.out([f'get_client_list {spid}']).split() == [str(running.clients[0].pid)]
    assert os.path.exists(shm_path(spid))  # the host's file is untouched


@needs_mount_ns
def test_a_client_with_the_daemons_dev_shm_bound_in_connects(running: SimHost) -> None:
    spid = running.client().info()['server_pid']
    stash = os.path.join(running.base, 'daemon-shm')
    os.mkdir(stash)
    # a container's own /dev/shm, then the daemon's mounted over it (what the device plugin does)
    setup = f'mount --bind /dev/shm {stash} && mount -t tmpfs tmpfs /dev/shm && mount --bind {stash} /dev/shm'
    proc, err, result = client_in_mount_ns(running, setup)
    assert proc.returncode == 0, err
    assert result['ok'] is True and result['server_pid'] == spid


@needs_mount_ns
def test_shm_off_in_the_client_skips_the_check(running: SimHost) -> None:
    spid = running.client().info()['server_pid']
    proc, err, result = client_in_mount_ns(running, 'mount -t tmpfs tmpfs /dev/shm', env={'FAKE_MPS_SHM': 'off'})
    assert proc.returncode == 0, err
    assert result['ok'] is True and result['server_pid'] == spid


@needs_mount_ns
def test_a_server_that_cannot_create_its_file_logs_it_and_carries_on(host: SimHost) -> None:
    # the daemon (and so its servers) sees a read-only /dev/shm
    host.make_dirs(host.environ())
    proc, out, err = in_mount_ns(host, 'mount -t tmpfs -o ro tmpfs /dev/shm && exec "$@"', PYTHON, SIM, '-d')
    assert (proc.returncode, out, err) == (0, '', '')
    info = host.client('--once', env={'FAKE_MPS_SHM': 'off'}).info()
    spid = info['server_pid']
    failed = host.wait_log(f'Failed to create {shm_path(spid)}', 'server')
    assert failed == [f'Failed to create {shm_path(spid)}: Read-only file system']
    assert 'Server has started' in host.log_messages('server')
    assert host.out([f'get_server_status {spid}']) == 'ACTIVE\n'
    rc, out, _err = host.client().rest()  # a checking client does not find it
    assert rc == 1 and json.loads(out)['error'] == 'CUDA_ERROR_MPS_CONNECTION_FAILED'
