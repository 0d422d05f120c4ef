# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The metrics the health check writes for node_exporter: each one's type, labels and HELP (the script renders them, the
tests and the monitoring guide are held to them)."""

from __future__ import annotations

# Why a daemon failed its last check: the values of gpufleet_mps_daemon_error's "reason" label, every one always exported.
ERROR_REASONS = ('not_running', 'unreachable', 'timeout', 'control_binary', 'ui_failed', 'bad_answer')
# Every metric of the textfile: name -> (type, labels, HELP). Per resource the labels are root and resource.
METRICS = {
    'gpufleet_mps_daemon_up': ('gauge', ('root', 'resource'), (
        'Whether the MPS control daemon of the resource runs: its pid file or its lock on control_lock names a live '
        'control daemon of its pipe directory, or it answered (1), or not (0).')),
    'gpufleet_mps_daemon_answering': ('gauge', ('root', 'resource'), (
        'Whether the control daemon answered the health question within the timeout (1) or not (0): the ready mark '
        'needs every enabled daemon of the root to answer.')),
    'gpufleet_mps_daemon_error': ('gauge', ('root', 'resource', 'reason'), (
        'Why the last check of the daemon failed: 1 for the reason that applies, 0 for the others, all 0 when it '
        'answered every question. not_running: no live control daemon; unreachable: it runs, but the control UI '
        'cannot reach it; timeout: no answer within the timeout; control_binary: the control binary is missing or not '
        'executable; ui_failed: the control UI failed; bad_answer: an answer the check cannot read.')),
    'gpufleet_mps_servers': ('gauge', ('root', 'resource'), (
        'MPS servers the control daemon runs (get_server_list).')),
    'gpufleet_mps_clients': ('gauge', ('root', 'resource'), (
        'CUDA clients connected to the MPS servers of the control daemon (get_client_list of each server).')),
    'gpufleet_mps_clients_by_owner': ('gauge', ('root', 'resource', 'owner'), (
        'The clients of gpufleet_mps_clients by what owns them, from the cgroup of each: container (the layout of a '
        'container engine names it), slurm_job (the cgroup of slurmstepd names a Slurm job), host (the slices or scopes '
        'of systemd on the host), unknown (anything else, or unreadable). Every owner always exported: a bounded set, '
        'never one series per process.')),
    'gpufleet_mps_default_active_thread_ratio': ('gauge', ('root', 'resource'), (
        'Default active thread percentage the control daemon gives new MPS servers, as a ratio (0.25 for 25.0).')),
    'gpufleet_mps_default_device_pinned_memory_limit_bytes': ('gauge', ('root', 'resource', 'device', 'uuid'), (
        'Default pinned device memory limit the control daemon gives new MPS servers on a device (its ordinal as the '
        'daemon sees it), as the daemon reports it: from 1 GiB up in whole GiB, rounded down. Absent where none is '
        'set.')),
    'gpufleet_mps_device_info': ('gauge', ('root', 'resource', 'device', 'uuid'), (
        'A device of the control daemon: its ordinal as the daemon sees it and its UUID (CUDA_VISIBLE_DEVICES). '
        'Always 1.')),
    'gpufleet_mps_ready': ('gauge', ('root',), (
        'Whether <root>/.ready exists after the last check (1): every enabled daemon of the root answered.')),
    'gpufleet_mps_health_check_timestamp_seconds': ('gauge', ('root',), (
        'Unix time at which the last health check ended.')),
    'gpufleet_mps_health_check_duration_seconds': ('gauge', ('root',), (
        'How long the last health check took.')),
    'gpufleet_mps_health_check_last_success_timestamp_seconds': ('gauge', ('root',), (
        'Unix time of the last health check in which every enabled daemon of the root answered.')),
}
