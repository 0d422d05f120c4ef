# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The naive way to check MPS state: one command per process.

This is what a hand-written check (or a module written without batching) does: every
``get_*`` question is its own ``echo <command> | nvidia-cuda-mps-control`` process, and every
compute mode is its own ``nvidia-smi`` process. The benchmark runs these side by side with
``mps_limits`` and ``mps_daemon`` answering the same no-op question, and counts the processes.
They live here, not in ``plugins/``: they exist only to be measured against.
"""

from __future__ import annotations

import os
import subprocess
import typing as t

GIB_MIB = 1024


class Asker:
    """Runs one control UI process per question and counts them."""

    def __init__(self, binary: str, pipe_dir: str, log_dir: str, environ: t.Optional[t.Mapping[str, str]] = None) -> None:
        self.binary = binary
        self.env = dict(os.environ if environ is None else environ)
        self.env['CUDA_MPS_PIPE_DIRECTORY'] = pipe_dir
        self.env['CUDA_MPS_LOG_DIRECTORY'] = log_dir
        self.processes = 0

    def ask(self, command: str) -> str:
        """``echo <command> | nvidia-cuda-mps-control``, without the shell."""
        self.processes += 1
        proc = subprocess.run([self.binary], input=command + '\n', capture_output=True, text=True, env=self.env,
                              timeout=30, check=False)
        if proc.returncode != 0:
            output = (proc.stdout + proc.stderr).strip()
            raise RuntimeError('%s: %r failed with status %d: %s' % (self.binary, command, proc.returncode, output))
        return proc.stdout.strip()

    def run(self, argv: t.Sequence[str]) -> str:
        """Any other helper process (nvidia-smi), counted the same way."""
        self.processes += 1
        proc = subprocess.run(list(argv), capture_output=True, text=True, env=self.env, timeout=30, check=False)
        if proc.returncode != 0:
            raise RuntimeError('%s failed with status %d: %s' % (argv[0], proc.returncode, (proc.stdout + proc.stderr).strip()))
        return proc.stdout.strip()


def _readback_mib(text: str) -> t.Optional[float]:
    """The daemon's memory read-back (``10G``, ``512M``, or nothing) in MiB."""
    text = text.strip()
    if not text:
        return None
    unit = text[-1].upper()
    number = float(text[:-1])
    return number * GIB_MIB if unit == 'G' else number


def naive_limits_noop(asker: Asker, ngpus: int, percentage: float, mem_mib: int) -> t.Dict[str, t.Any]:
    """Is every default and every running server's limit as wanted? One UI process per question.

    The same questions ``mps_limits`` asks in its single read batch: the default thread percentage,
    the default pinned memory of each device ordinal, the server list, and each server's own limits.
    """
    changed = False
    pct = float(asker.ask('get_default_active_thread_percentage'))
    changed = changed or abs(pct - percentage) > 0.05
    for ordinal in range(ngpus):
        got = _readback_mib(asker.ask('get_default_device_pinned_mem_limit %d' % ordinal))
        # The read-back is rounded down to whole GiB: accept anything within one GiB below.
        changed = changed or got is None or not mem_mib - GIB_MIB < got <= mem_mib
    servers = [int(word) for word in asker.ask('get_server_list').split()]
    for pid in servers:
        server_pct = asker.ask('get_active_thread_percentage %d' % pid)
        changed = changed or abs(float(server_pct) - percentage) > 0.05
        for ordinal in range(ngpus):
            got = _readback_mib(asker.ask('get_device_pinned_mem_limit %d %d' % (pid, ordinal)))
            changed = changed or got is None or not mem_mib - GIB_MIB < got <= mem_mib
    return {'changed': changed, 'processes': asker.processes, 'servers': len(servers)}


def naive_daemon_noop(asker: Asker, nvidia_smi: str, gpu_indices: t.Sequence[int], mode: str = 'Exclusive_Process') -> t.Dict[str, t.Any]:
    """Does the daemon answer, and is every one of its GPUs in the wanted compute mode?

    One UI process for the liveness question, one ``nvidia-smi`` process per GPU for its compute
    mode - where ``mps_daemon`` asks one UI process and reads every compute mode through one NVML
    session inside the module.
    """
    asker.ask('get_server_list')
    changed = False
    for index in gpu_indices:
        got = asker.run([nvidia_smi, '-i', str(index), '--query-gpu=compute_mode', '--format=csv,noheader'])
        changed = changed or got != mode
    return {'changed': changed, 'processes': asker.processes}
