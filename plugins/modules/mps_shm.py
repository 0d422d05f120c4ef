#!/usr/bin/python
# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: mps_shm
short_description: Mount the shared-memory tmpfs that MPS daemons and their container clients use as /dev/shm
version_added: 0.2.0
description:
  - An MPS client and its server share memory through C(/dev/shm), so a client in a container needs the C(/dev/shm)
    of the daemon's servers. NVIDIA's Kubernetes device plugin gives its daemon and every container one dedicated
    tmpfs, C(<root>/shm); this module serves that tmpfs from the host.
  - Mounts a tmpfs on C(<root>/shm) with C(rw,nosuid,nodev,noexec,mode=1777) and a size, and keeps it across reboots
    with a systemd mount unit or an C(/etc/fstab) line. Start daemons with
    M(gpufleet.mps.mps_daemon) O(gpufleet.mps.mps_daemon#module:shm=true) to give them this tmpfs as C(/dev/shm).
  - A different size or missing mount flags are changed with a remount, never an unmount, so containers that use
    the tmpfs keep it. Any other file system already mounted on C(<root>/shm) is refused.
attributes:
  check_mode:
    description: Reports what would change without mounting or writing anything.
    support: full
  diff_mode:
    description: Shows the mount (size in KiB, flags, mode) and its persistence before and after.
    support: full
  idempotent:
    description: A second run with the same options changes nothing.
    support: full
extends_documentation_fragment:
  - gpufleet.mps._common.root
  - gpufleet.mps._common.selinux
options:
  state:
    description:
      - V(mounted) mounts the tmpfs (or remounts it with the wanted size and flags) and persists it as O(persist) says.
      - V(absent) unmounts it, removes its mount unit or fstab entry, and removes the mount point C(<root>/shm) when it is
        empty then (anything another tool put there keeps it). It is refused while a running daemon under
        O(root) was started with it as its C(/dev/shm) (M(gpufleet.mps.mps_daemon) O(gpufleet.mps.mps_daemon#module:shm=true)),
        because the unmount would succeed on the host and leave that daemon with a tmpfs no new container can reach.
        Unmounting a tmpfs that a process of the host still uses fails, naming the mount point, and leaves it mounted.
    type: str
    choices: [mounted, absent]
    default: mounted
  size:
    description:
      - The tmpfs size - a percentage of RAM (V(50%), half of RAM, as the device plugin has it) or a size with a
        V(k), V(m), V(g) or V(t) suffix (V(16G)). The kernel rounds it up to whole pages; the mount, the mount unit and
        the fstab line carry the resulting size in KiB, recomputed on every run.
    type: str
    default: 50%
  persist:
    description:
      - How the mount comes back after a reboot. V(systemd) writes and enables the mount unit
        C(<escaped path>.mount) (for the default root C(run-nvidia-mps-shm.mount)); V(fstab) writes one line in
        O(fstab); V(none) only mounts it now. The mechanism not chosen is removed, so the two never both apply.
      - V(auto) is V(systemd) when systemd is PID 1, else V(fstab). V(systemd) is refused where systemd is not PID 1,
        since the unit could not be enabled.
    type: str
    choices: [auto, systemd, fstab, none]
    default: auto
  fstab:
    description:
      - The fstab file used by O(persist=fstab) (and cleaned of this mount point otherwise).
    type: path
    default: /etc/fstab
notes:
  - Needs root (mount, umount, C(/etc)).
  - Uses C(mount) and C(umount) from util-linux.
seealso:
  - module: gpufleet.mps.mps_daemon
author:
  - gpufleet.mps developers (@gpufleet)
'''

EXAMPLES = r'''
- name: A tmpfs of half of RAM on /run/nvidia/mps/shm, back at every boot
  gpufleet.mps.mps_shm:

- name: A daemon whose servers use it as /dev/shm, so containers can mount it as theirs
  gpufleet.mps.mps_daemon:
    name: train
    devices: [0, 1]
    shm: true
  register: gpu

- name: What a container needs - the mounts and the environment
  ansible.builtin.debug:
    msg: >-
      docker run {% for m in gpu.container.mounts %}-v {{ m.source }}:{{ m.target }} {% endfor %}
      {% for k, v in gpu.container.env.items() %}-e {{ k }}={{ v }} {% endfor %}IMAGE

- name: A fixed size instead
  gpufleet.mps.mps_shm:
    size: 16G

- name: Stop the daemons that use it - removing it under a running one is refused
  gpufleet.mps.mps_daemon:
    name: train
    state: stopped

- name: Unmount it and forget it
  gpufleet.mps.mps_shm:
    state: absent
'''

RETURN = r'''
path:
  description: The mount point, C(<root>/shm) (symbolic links of the parents of O(root) resolved, as the kernel names it).
  returned: always
  type: str
  sample: /run/nvidia/mps/shm
mounted:
  description: Whether the tmpfs is mounted after the run (in check mode, whether it would be).
  returned: always
  type: bool
  sample: true
size_kib:
  description: The tmpfs size in KiB; null when not mounted.
  returned: always
  type: int
  sample: 65872896
options:
  description: The mount options used.
  returned: when O(state=mounted)
  type: str
  sample: rw,nosuid,nodev,noexec,size=65872896k,mode=1777
persist:
  description: The persistence in effect (V(auto) resolved).
  returned: always
  type: str
  sample: systemd
unit:
  description: The name of the systemd mount unit for this mount point (written only with O(persist=systemd)).
  returned: always
  type: str
  sample: run-nvidia-mps-shm.mount
actions:
  description: What was done (or, in check mode, would be done), in order.
  returned: always
  type: list
  elements: str
  sample: ['mount a tmpfs of 65872896 KiB on /run/nvidia/mps/shm', 'write /etc/systemd/system/run-nvidia-mps-shm.mount']
'''

from ansible_collections.gpufleet.mps.plugins.module_utils._module import finish, run_module
from ansible_collections.gpufleet.mps.plugins.module_utils._options import spec
from ansible_collections.gpufleet.mps.plugins.module_utils._shm import ShmManager
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.unit import UNIT_DIR
from ansible_collections.gpufleet.mps.plugins.module_utils._tmpfs import mount_options, size_kib


def argument_spec():
    return spec(
        'root', 'selinux_type',
        state=dict(type='str', choices=['mounted', 'absent'], default='mounted'),
        size=dict(type='str', default='50%'),
        persist=dict(type='str', choices=['auto', 'systemd', 'fstab', 'none'], default='auto'),
        fstab=dict(type='path', default='/etc/fstab'),
    )


def run(module):
    params = module.params
    if params['state'] == 'mounted':
        kib = size_kib(params['size'])
    manager = ShmManager.for_host(params['root'], params['state'], params['persist'], params['fstab'], UNIT_DIR, check_mode=module.check_mode,
                                  selinux_type=params['selinux_type'])
    persist = manager.persist
    outcome = manager.ensure(params['state'], params['size'])
    values = dict(path=manager.path, mounted=outcome.after['mounted'], size_kib=outcome.after['size_kib'], persist=persist,
                  unit=manager.unit)
    if params['state'] == 'mounted':
        values['options'] = mount_options(kib)
    return finish(module, outcome, **values)


def main():
    run_module(argument_spec(), run)


if __name__ == '__main__':
    main()
