# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The health check that keeps ``<root>/.ready`` true between Ansible runs: a script, a oneshot unit, a timer.

The fleet role writes ``<root>/.ready`` when every daemon it manages answers; without this the mark only
reflects the last run - missing after a reboot until Ansible runs again, still there while a daemon hangs.
The script asks every daemon the modules' own health question (``get_default_active_thread_percentage``,
answered with one ``%.1f`` line) within a timeout, and writes or withdraws the mark. It checks the
resources of ``config_dir`` whose pipe directory is under ``root`` and whose unit is enabled (a pruned
resource's unit is disabled), reading each one's environment file; like the unit, it runs nothing of this
collection, only ``sh`` and the control binary the environment file names.

With ``metrics_dir`` the script also writes what it saw to ``<metrics_dir>/gpufleet_mps.prom`` for node_exporter's
textfile collector (:data:`METRICS`): per resource whether its daemon runs and answered, why not, its servers and
clients and its default limits; for the root the ready mark and the check's time and duration. Each daemon gets ONE
control UI process (a batch framed as ``_protocol/framing.py`` frames it), the file is replaced atomically (a temp file
of the same directory whose name does not end in ``.prom``, then ``mv``), and without ``metrics_dir`` the script is
byte for byte the one hosts already run.
"""

from __future__ import annotations

import os
import typing as t

from .._errors import MpsError

HEALTH_NAME = 'gpufleet-mps-health'
# What the script writes in metrics_dir, for node_exporter's textfile collector (_supervisor/metrics.py renders it).
METRICS_FILE = 'gpufleet_mps.prom'
SCRIPT_PATH = '/usr/local/sbin/gpufleet-mps-health'

# Placeholders @ROOT@, @CONFIG_DIR@, @WANTS_DIR@, @TIMEOUT@ (the shell needs its braces).
SCRIPT_TEMPLATE = r"""#!/bin/sh
# Managed by the gpufleet.mps Ansible collection (fleet role). Local changes are overwritten.
# Writes @ROOT@/.ready when every MPS daemon of the root answers its health question, withdraws it otherwise.
root='@ROOT@'
config_dir='@CONFIG_DIR@'
wants='@WANTS_DIR@'
timeout_s=@TIMEOUT@
healthy=0
sick=0
for env in "$config_dir"/*.env; do
  [ -f "$env" ] || continue
  instance=$(basename "$env" .env)
  [ -e "$wants/gpufleet-mps@$instance.service" ] || continue   # not enabled: pruned or stopped on purpose
  pipe=$(sed -n 's/^CUDA_MPS_PIPE_DIRECTORY=//p' "$env")
  control=$(sed -n 's/^MPS_CONTROL=//p' "$env")
  case "$pipe" in "$root"/*) ;; *) continue ;; esac
  answer=$(echo get_default_active_thread_percentage | CUDA_MPS_PIPE_DIRECTORY="$pipe" timeout "$timeout_s" "$control" 2>&1)
  if printf '%s\n' "$answer" | grep -Eqx '[0-9]+[.][0-9]'; then
    healthy=$((healthy + 1))
  else
    sick=$((sick + 1))
    echo "gpufleet-mps-health: the MPS daemon of $pipe did not answer within ${timeout_s}s: $answer" >&2
  fi
done
if [ "$healthy" -gt 0 ] && [ "$sick" -eq 0 ]; then
  [ -e "$root/.ready" ] || { : > "$root/.ready" && echo "gpufleet-mps-health: $healthy daemon(s) healthy: $root/.ready written"; }
else
  [ ! -e "$root/.ready" ] || { rm -f "$root/.ready" && echo "gpufleet-mps-health: $root/.ready withdrawn ($sick not answering, $healthy healthy)" >&2; }
fi
exit 0
"""
# Where a resource runs MPS v3 (MPS_V3_SERVER in its environment file) its daemon is asked with v3 words: whether it
# lists the resource's server. Only in the script of a host that has a v3 resource: the others stay byte for byte.
LEGACY_ASK = r"""  case "$pipe" in "$root"/*) ;; *) continue ;; esac
  answer=$(echo get_default_active_thread_percentage | CUDA_MPS_PIPE_DIRECTORY="$pipe" timeout "$timeout_s" "$control" 2>&1)
  if printf '%s\n' "$answer" | grep -Eqx '[0-9]+[.][0-9]'; then"""
V3_ASK = r"""  server=$(sed -n 's/^MPS_V3_SERVER=//p' "$env")
  case "$pipe" in "$root"/*) ;; *) continue ;; esac
  if [ -n "$server" ]; then   # MPS v3: healthy when the daemon lists the resource's server, Ready
    answer=$(CUDA_MPS_PIPE_DIRECTORY="$pipe" timeout "$timeout_s" "$control" namespace list --server="$server" --format=csv,noheader 2>&1)
    good=$(printf '%s\n' "$answer" | sed 's/,[[:space:]]*/,/g' | grep -ic "^default,$server,ready,")
  else
    answer=$(echo get_default_active_thread_percentage | CUDA_MPS_PIPE_DIRECTORY="$pipe" timeout "$timeout_s" "$control" 2>&1)
    good=$(printf '%s\n' "$answer" | grep -Ecx '[0-9]+[.][0-9]')
  fi
  if [ "$good" -gt 0 ]; then"""

SERVICE_TEMPLATE = """\
# Managed by the gpufleet.mps Ansible collection (fleet role). Local changes are overwritten.
[Unit]
Description=Health of the NVIDIA CUDA MPS daemons under {root} (gpufleet.mps): {root}/.ready
After=multi-user.target

[Service]
Type=oneshot
ExecStart={script}
TimeoutStartSec={start_timeout}
"""

TIMER_TEMPLATE = """\
# Managed by the gpufleet.mps Ansible collection (fleet role). Local changes are overwritten.
[Unit]
Description=Check the NVIDIA CUDA MPS daemons under {root} every {interval}s (gpufleet.mps)

[Timer]
OnBootSec={boot_delay}s
OnUnitActiveSec={interval}s
AccuracySec=1s

[Install]
WantedBy=timers.target
"""


def _quoted(value: str, what: str) -> str:
    """A path the script can carry between single quotes (and a unit file, ``%`` doubled there)."""
    if not os.path.isabs(value) or any(char in value for char in "'\n\r\0\\%"):
        raise MpsError('%s: %r cannot be written into the health check (absolute, without quotes, backslashes or %%)' % (what, value))
    return value


def render_health(root: str, config_dir: str, unit_dir: str = '/etc/systemd/system', interval: int = 30,
                  timeout: int = 10, script: str = SCRIPT_PATH, metrics_dir: t.Optional[str] = None, *,
                  v3: bool = False) -> t.Dict[str, str]:
    """The health check's files: path -> content (the script, the oneshot service, its timer).

    ``metrics_dir``: also write ``<metrics_dir>/gpufleet_mps.prom`` for node_exporter's textfile collector on every
    run; None keeps the script byte for byte as it was before metrics existed. ``v3``: a resource of the host runs MPS v3
    (asked with v3 words; without one the script is byte for byte what hosts ran before v3).
    """
    if interval < 5 or timeout < 1:
        raise MpsError('the health check needs an interval of at least 5 s and a timeout of at least 1 s')
    root = _quoted(os.path.normpath(root), 'root')
    config_dir = _quoted(os.path.normpath(config_dir), 'config_dir')
    wants = _quoted(os.path.join(unit_dir, 'multi-user.target.wants'), 'unit_dir')
    if metrics_dir is None:
        content = (SCRIPT_TEMPLATE.replace('@ROOT@', root).replace('@CONFIG_DIR@', config_dir)
                   .replace('@WANTS_DIR@', wants).replace('@TIMEOUT@', str(int(timeout))))
        if v3:
            from .v3_variants import replaced  # pylint: disable=import-outside-toplevel
            content = replaced(content, ((LEGACY_ASK, V3_ASK),), 'the health check')
    else:
        # Imported here: only hosts with metrics compile it (AnsiballZ compiles every module imported, on every run).
        from .metrics import render_metrics_script  # pylint: disable=import-outside-toplevel
        content = render_metrics_script(root, config_dir, wants, timeout,
                                        _quoted(os.path.normpath(metrics_dir), 'metrics_dir'), v3=v3)
    return {
        _quoted(script, 'script'): content,
        os.path.join(unit_dir, HEALTH_NAME + '.service'): SERVICE_TEMPLATE.format(
            root=root, script=script, start_timeout=int(timeout) * 64 + 30),
        os.path.join(unit_dir, HEALTH_NAME + '.timer'): TIMER_TEMPLATE.format(
            root=root, interval=int(interval), boot_delay=int(interval)),
    }
