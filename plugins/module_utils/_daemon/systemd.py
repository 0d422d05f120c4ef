# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A resource's systemd unit: its files, its start, enabling and disabling it."""

from __future__ import annotations

import os
import typing as t

from .._io import atomic_write, ensure_dir, remove
from .._outcome import Outcome
from .._supervisor.liveness import PID_FILE, inspect
from .._supervisor.unit import (
    FOREGROUND_DROPIN,
    ORDER_DROPIN,
    PIDFILE_DROPIN,
    SHM_DROPIN,
    UNIT_NAME,
    render_env,
    render_foreground_dropin,
    render_order_dropin,
    render_pidfile_dropin,
    render_shm_dropin,
    render_unit,
    unit_environment,
)
from .model import Wanted


class SystemdUnit:
    """Of :class:`DaemonManager`: the daemon's unit under supervisor=systemd."""

    # the units the daemon starts before and after (mps_daemon unit_before, unit_after; given to DaemonManager)
    unit_before: t.Tuple[str, ...] = ()
    unit_after: t.Tuple[str, ...] = ()

    @property
    def dropin_path(self) -> str:
        return os.path.join(self.unit_dir, '%s.d' % self.unit, SHM_DROPIN)

    @property
    def foreground_dropin_path(self) -> str:
        return os.path.join(self.unit_dir, '%s.d' % self.unit, FOREGROUND_DROPIN)

    @property
    def order_dropin_path(self) -> str:
        return os.path.join(self.unit_dir, '%s.d' % self.unit, ORDER_DROPIN)

    @property
    def pidfile_dropin_path(self) -> str:
        return os.path.join(self.unit_dir, '%s.d' % self.unit, PIDFILE_DROPIN)

    # --- systemd files ---------------------------------------------------------------------------
    def unit_files(self) -> t.List[str]:
        """The unit files a plan compares (the environment file aside): a host plan observes them first."""
        return [os.path.join(self.unit_dir, UNIT_NAME), self.dropin_path, self.foreground_dropin_path, self.pidfile_dropin_path,
                self.order_dropin_path]

    def _env_values(self, wanted: Wanted) -> t.Dict[str, str]:
        return unit_environment(self.paths, self.config, [gpu.uuid for gpu in wanted.devices], wanted.multiuser,
                                wanted.compute_mode, self.daemon.binary, self.nvidia_smi, self.daemon.stop_timeout,
                                self.daemon.log_mode, self.selinux_type, wanted.foreground)

    def _systemd_files(self, wanted: Wanted) -> t.Dict[str, t.Optional[str]]:
        """Path -> wanted content; None for a file that must not exist."""
        return {
            os.path.join(self.unit_dir, UNIT_NAME): render_unit(self.config.config_dir, int(self.daemon.start_timeout), self.daemon.stop_timeout),
            self.config.env_file: render_env(self.paths.name, self._env_values(wanted)),
            self.dropin_path: render_shm_dropin(self.paths.shm_dir) if wanted.shm else None,
            self.foreground_dropin_path: render_foreground_dropin(int(self.daemon.start_timeout)) if wanted.foreground else None,
            self.pidfile_dropin_path: (None if wanted.foreground else
                                       render_pidfile_dropin(os.path.join(self.paths.pipe_dir, PID_FILE))),
            self.order_dropin_path: render_order_dropin(self.unit_before, self.unit_after),
        }

    def _start_unit(self, wanted: Wanted, out: Outcome, restart: bool) -> None:
        if self.systemctl is None:
            return
        (self.systemctl.restart if restart else self.systemctl.start)(self.unit)
        self.daemon.wait_ready()
        self._write_record(wanted, inspect(self.paths).pid or self.systemctl.main_pid(self.unit), out)

    def _install_unit(self, wanted: Wanted, out: Outcome) -> None:
        reload_needed = False
        for path, content in self._systemd_files(wanted).items():
            if self.view.text(path, 'a systemd unit file' if path != self.config.env_file else 'an environment file') == content:
                continue
            if content is None:
                out.act('remove %s' % path, lambda path=path: remove(path))
            else:
                out.act('write %s' % path, lambda path=path, content=content: (
                    ensure_dir(os.path.dirname(path), 0o755), atomic_write(path, content, 0o644)))
            reload_needed = reload_needed or path != self.config.env_file
        if reload_needed:
            out.act('systemctl daemon-reload', self.systemctl.daemon_reload if self.systemctl else None)
        self._apply_enabled(wanted.enabled, out)

    def _apply_enabled(self, enabled: t.Optional[bool], out: Outcome) -> None:
        if enabled is None or self.systemctl is None:
            return
        if self.view.unit(self.unit)[1] != enabled:
            self._disable_planned = self._disable_planned or not enabled
            systemctl = self.systemctl
            out.act('%s %s' % ('enable' if enabled else 'disable', self.unit),
                    lambda: (systemctl.enable if enabled else systemctl.disable)(self.unit))
