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
    V3_DROPIN,
    render_env,
    render_foreground_dropin,
    render_order_dropin,
    render_pidfile_dropin,
    render_shm_dropin,
    render_unit,
    unit_environment,
)
from .model import DaemonRun, Wanted, record_start


def _v3_dropin() -> str:
    """An MPS v3 resource's drop-in (imported only for one: a legacy host never compiles it)."""
    from .._supervisor.v3_variants import DROPIN_V3  # pylint: disable=import-outside-toplevel
    return DROPIN_V3


class UnitFiles:
    """The daemon's unit under supervisor=systemd: the files rendered for a wanted daemon, installing and starting it."""

    def __init__(self, run: DaemonRun) -> None:
        self.run = run
        unit_d = os.path.join(run.unit_dir, '%s.d' % run.unit)
        self.template_path = os.path.join(run.unit_dir, UNIT_NAME)
        self.dropin_path = os.path.join(unit_d, SHM_DROPIN)
        self.foreground_dropin_path = os.path.join(unit_d, FOREGROUND_DROPIN)
        self.order_dropin_path = os.path.join(unit_d, ORDER_DROPIN)
        self.pidfile_dropin_path = os.path.join(unit_d, PIDFILE_DROPIN)
        self.v3_dropin_path = os.path.join(unit_d, V3_DROPIN)

    def paths(self) -> t.List[str]:
        """The unit files a plan compares (the environment file aside): a host plan observes them first."""
        return [self.template_path, self.dropin_path, self.foreground_dropin_path, self.pidfile_dropin_path, self.order_dropin_path,
                self.v3_dropin_path]

    def env_values(self, wanted: Wanted) -> t.Dict[str, str]:
        run = self.run
        return unit_environment(run.paths, run.config, [gpu.uuid for gpu in wanted.devices], multiuser=wanted.multiuser,
                                compute_mode=wanted.compute_mode, control_binary=run.daemon.binary, nvidia_smi=run.nvidia_smi,
                                stop_timeout=run.daemon.stop_timeout, log_mode=run.daemon.log_mode, selinux_type=run.selinux_type, foreground=wanted.foreground,
                                v3=wanted.v3)

    def render(self, wanted: Wanted) -> t.Dict[str, t.Optional[str]]:
        """Path -> wanted content; None for a file that must not exist."""
        run = self.run
        daemon = run.daemon
        return {
            self.template_path: render_unit(run.config.config_dir, int(daemon.start_timeout), daemon.stop_timeout),
            run.config.env_file: render_env(run.paths.name, self.env_values(wanted)),
            self.dropin_path: render_shm_dropin(run.paths.shm_dir) if wanted.shm else None,
            self.foreground_dropin_path: (render_foreground_dropin(int(daemon.start_timeout), v3=wanted.v3 is not None)
                                          if wanted.foreground else None),
            self.pidfile_dropin_path: (None if wanted.foreground else
                                       render_pidfile_dropin(os.path.join(run.paths.pipe_dir, PID_FILE))),
            self.order_dropin_path: render_order_dropin(run.unit_before, run.unit_after),
            self.v3_dropin_path: _v3_dropin() if wanted.v3 is not None else None,
        }

    def start(self, wanted: Wanted, out: Outcome, *, restart: bool) -> None:
        run = self.run
        if run.systemctl is None:
            return
        (run.systemctl.restart if restart else run.systemctl.start)(run.unit)
        run.daemon.wait_ready()
        record_start(run, wanted, inspect(run.paths).pid or run.systemctl.main_pid(run.unit), out)

    def install(self, wanted: Wanted, out: Outcome) -> None:
        run = self.run
        reload_needed = False
        for path, content in self.render(wanted).items():
            if run.view.text(path, 'a systemd unit file' if path != run.config.env_file else 'an environment file') == content:
                continue
            if content is None:
                out.act('remove %s' % path, lambda path=path: remove(path))
            else:
                out.act('write %s' % path, lambda path=path, content=content: (
                    ensure_dir(os.path.dirname(path), 0o755), atomic_write(path, content, 0o644)))
            reload_needed = reload_needed or path != run.config.env_file
        if reload_needed:
            out.act('systemctl daemon-reload', run.systemctl.daemon_reload if run.systemctl else None)
        self.apply_enabled(out, enabled=wanted.enabled)

    def apply_enabled(self, out: Outcome, *, enabled: t.Optional[bool]) -> None:
        run = self.run
        if enabled is None or run.systemctl is None:
            return
        if run.view.unit(run.unit)[1] != enabled:
            run.planned.disable = run.planned.disable or not enabled
            systemctl = run.systemctl
            unit = run.unit
            out.act('%s %s' % ('enable' if enabled else 'disable', unit),
                    lambda: (systemctl.enable if enabled else systemctl.disable)(unit))

    def stop_unit(self, out: Outcome) -> None:
        """Stop the unit where it is active and no stop of it is planned yet."""
        run = self.run
        systemctl = run.systemctl
        if systemctl is not None and not run.planned.unit_stop and run.view.unit(run.unit)[0]:
            unit = run.unit
            out.act('stop %s' % unit, lambda: systemctl.stop(unit))
