#!/usr/bin/python
# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: mps_daemon
short_description: Run one NVIDIA CUDA MPS control daemon per resource, idempotently
version_added: 0.1.0
description:
  - Starts, stops and restarts the MPS control daemon (C(nvidia-cuda-mps-control -d)) of one resource - a named
    group of GPUs - under a root directory laid out like NVIDIA's Kubernetes device plugin
    (C(<root>/<name>/pipe), C(<root>/<name>/log), C(<root>/<name>/.started)).
  - Each daemon sees only its own GPUs (C(CUDA_VISIBLE_DEVICES) by UUID); a GPU can belong to one daemon under a root.
  - A GPU that any other MPS control daemon on the host serves - under another O(root), started by hand, NVIDIA's
    device plugin's - is never taken (the start fails naming that daemon's pid and pipe directory), nor has its compute
    mode reset when this daemon stops. Daemons are found among the host's processes (C(nvidia-cuda-mps-control -d)
    or C(-f)) by their C(CUDA_MPS_PIPE_DIRECTORY) and C(CUDA_VISIBLE_DEVICES); reading another user's needs root.
  - A running daemon that answers and was started with the wanted devices, multi-user flag and supervisor is left
    alone at the cost of one control UI process and one NVML initialisation. Anything else is restarted, and the diff
    says what differed. A dead daemon's leftover files are cleaned up and the daemon started again, with a warning.
  - The limits persisted for the resource by M(gpufleet.mps.mps_limits) (in O(config_dir)) hold from the daemon's
    start. The default active thread percentage is in the daemon's start environment
    (C(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), which NVIDIA documents as the default of every server the daemon
    spawns), so it binds the very first client. The pinned device memory limits have no documented start form for
    the daemon - they are replayed in the first control session after the daemon answers (the same UI process as the
    health check, every reply checked); a client that connects within those milliseconds, and its server, get no
    memory limit. The same holds for a start by systemd (C(EnvironmentFile=), C(ExecStartPost=)).
  - A daemon that is alive but does not answer within O(start_timeout) is reported, with its pid and log file, and
    never killed.
extends_documentation_fragment:
  - gpufleet.mps._common
  - gpufleet.mps._common.root
  - gpufleet.mps._common.name
  - gpufleet.mps._common.daemon
  - gpufleet.mps._common.container_root
  - gpufleet.mps._common.selinux
attributes:
  check_mode:
    description: Reports what would change without touching GPUs, files or processes.
    support: full
  diff_mode:
    description: Shows the daemon's state, devices, multi-user flag and supervisor before and after.
    support: full
  idempotent:
    description: A second run with the same options changes nothing.
    support: full
options:
  state:
    description:
      - V(started) starts the daemon when it is not running or was started differently (restarting it then).
      - V(stopped) stops it with C(quit -t) O(stop_timeout), sets the compute mode of its GPUs back to DEFAULT unless
        another daemon under O(root) uses them, and removes C(.started). Logs are kept.
      - V(restarted) always restarts it.
      - V(absent) stops it as V(stopped) does, disables its unit, then removes what this module and
        M(gpufleet.mps.mps_limits) created for the resource and nothing else - by name, never a whole directory -
        its systemd environment file and drop-ins, C(.started), the persisted limits, the files the daemon leaves in its
        pipe directory and the resource lock. A directory goes only when it is empty afterwards (the pipe and resource
        directories, O(root) and O(config_dir) included), so files of other tools stay, each directory kept for them
        named in a warning with what it holds. The template unit C(gpufleet-mps@.service) goes with the last resource
        of O(config_dir). The logs stay unless O(remove_logs).
    type: str
    choices: [started, stopped, restarted, absent]
    default: started
  devices:
    description:
      - The GPUs of this resource - V(all), or a list of GPU indices, UUIDs (C(GPU-...)) or unique UUID prefixes, as
        C(nvidia-smi -L) shows them. The order sets the daemon's device ordinals (0, 1, ...).
      - Or one MIG device - C(<gpu index>:<mig index>) (C(1:0) is C(MIG ... Device 0) under C(GPU 1) in C(nvidia-smi -L)),
        its UUID (C(MIG-...)) or the legacy C(MIG-GPU-<gpu uuid>/<gpu instance>/<compute instance>). The daemon gets
        C(CUDA_VISIBLE_DEVICES=MIG-<uuid>); its clients see the instance as device 0. A MIG device is its resource's only
        device - NVIDIA runs MPS on MIG as one daemon per MIG device, and CUDA before driver R570 enumerates one MIG
        device per process and no whole GPU beside it - so a second device next to it is refused.
      - A whole GPU with MIG enabled is refused, the message listing its MIG devices. V(all) is every GPU not in MIG
        mode; the GPUs in MIG mode it leaves out are named in a warning.
    type: raw
    default: all
  multiuser:
    description:
      - Start the daemon with C(-multiuser-server) - one server shared by clients of every user.
      - Refused, before anything is done, when a GPU of O(devices) has a compute capability below 7.0 (before Volta) -
        the driver starts C(-multiuser-server) there, but clients that are not root then fail to connect.
    type: bool
    default: false
  enabled:
    description:
      - With O(supervisor=systemd), whether the unit starts at boot. With O(state=stopped), V(false) disables the unit
        and V(true) leaves its boot setting alone.
    type: bool
    default: true
notes:
  - Needs root to change compute modes and to write under the default directories.
  - Clients reach the daemon with the returned RV(env). A parent of the pipe directory that other users cannot
    traverse makes non-root clients fail; the module warns about it.
  - A resource whose persisted limits hold static SM partitions (M(gpufleet.mps.mps_limits) O(gpufleet.mps.mps_limits#module:sm_partitions))
    is started with C(-S), as its start record says; a running daemon started otherwise (or with C(-S) when the partitions
    are gone) is restarted, O(busy) deciding about its clients. A control binary without static partitioning (its help
    text lists no C(sm_partition); r580) is refused before anything is stopped or started.
seealso:
  - module: gpufleet.mps.mps_limits
author:
  - gpufleet.mps developers (@gpufleet)
'''

EXAMPLES = r'''
- name: One daemon for every GPU, in the device plugin's default layout
  gpufleet.mps.mps_daemon:
    name: nvidia.com/gpu

- name: Stop it, and give its GPUs back to non-MPS users
  gpufleet.mps.mps_daemon:
    name: nvidia.com/gpu
    state: stopped

- name: Two daemons on disjoint GPUs, without systemd
  gpufleet.mps.mps_daemon:
    name: "{{ item.name }}"
    devices: "{{ item.devices }}"
    supervisor: none
  loop:
    - {name: train, devices: [0, 1]}
    - {name: infer, devices: [2]}

- name: A daemon whose server is shared by every user, on the GPU with this UUID prefix
  gpufleet.mps.mps_daemon:
    name: shared
    devices: [GPU-d77bfc07]
    multiuser: true
  register: shared

- name: What a client of that daemon needs in its environment
  ansible.builtin.debug:
    var: shared.env

- name: Stop it
  gpufleet.mps.mps_daemon:
    name: shared
    state: stopped

- name: Remove the resource and everything created for it - unit files, record, persisted limits - but its logs
  gpufleet.mps.mps_daemon:
    name: shared
    state: absent
'''

RETURN = r'''
pid:
  description: Pid of the running control daemon; null when stopped (or in check mode before a start).
  returned: always
  type: int
  sample: 4182
pipe_dir:
  description: The daemon's pipe directory (C(CUDA_MPS_PIPE_DIRECTORY)).
  returned: always
  type: str
  sample: /run/nvidia/mps/nvidia.com/gpu/pipe
log_dir:
  description: The daemon's log directory (C(control.log), C(server.log)).
  returned: always
  type: str
  sample: /run/nvidia/mps/nvidia.com/gpu/log
devices:
  description:
    - The resource's GPUs in the daemon's ordinal order; empty when stopped.
    - A MIG device also has C(mig) (its address, C(1:0)) and C(profile); its C(index) is its GPU's.
  returned: always
  type: list
  elements: dict
  sample: [{index: 0, uuid: GPU-6a2b5c1e-5f0e-4e9b-9a55-1c7f2a1b0c01, name: NVIDIA H100 80GB HBM3}]
env:
  description: The environment a CUDA client needs to use this daemon.
  returned: always
  type: dict
  sample: {CUDA_MPS_PIPE_DIRECTORY: /run/nvidia/mps/nvidia.com/gpu/pipe, CUDA_MPS_LOG_DIRECTORY: /run/nvidia/mps/nvidia.com/gpu/log}
supervisor:
  description: The supervisor in effect (V(auto) resolved).
  returned: always
  type: str
  sample: systemd
started_at:
  description: When the running daemon was started by this collection (UTC, ISO 8601); null when stopped.
  returned: always
  type: str
  sample: '2026-12-02T13:04:59Z'
forced:
  description: Whether stopping the daemon had to force out servers or clients after O(stop_timeout).
  returned: always
  type: bool
  sample: false
clients:
  description:
    - The clients that were connected when the daemon had to stop (see O(busy)) - ended with O(busy=terminate), waited
      for with O(busy=wait) - each with its C(pid), C(uid) (null when unknown) and the C(server) it was on. Empty when the
      daemon was not stopped or had no client.
  returned: always
  type: list
  elements: dict
  sample: [{pid: 4312, uid: 1000, server: 4288}]
  version_added: 0.2.0
selinux:
  description:
    - Where SELinux is enabled and O(selinux_type) is set, the pipe directory's SELinux type before the run
      (null when the directory did not exist) and after it; null otherwise (no SELinux, or labels left alone).
  returned: always
  type: dict
  sample: {before: var_run_t, after: container_file_t}
  version_added: 0.2.0
container:
  description:
    - What a client in a container needs, in the device plugin's layout - bind mounts from host paths to container
      paths, and the environment as the container sees it. Template C(docker run -v), a Podman quadlet or a pod spec
      from it.
  returned: always
  type: dict
  contains:
    root:
      description: The container root (O(container_root)).
      type: str
      sample: /mps
    pipe_dir:
      description: The pipe directory inside the container.
      type: str
      sample: /mps/nvidia.com/gpu/pipe
    env:
      description: The environment a client in the container sets.
      type: dict
      sample: {CUDA_MPS_PIPE_DIRECTORY: /mps/nvidia.com/gpu/pipe}
    mounts:
      description:
        - Bind mounts, C(source) on the host to C(target) in the container - the pipe directory, and the daemon's
          C(/dev/shm) (C(<root>/shm) with O(shm=true), else the host's C(/dev/shm)) at C(/dev/shm).
      type: list
      elements: dict
      sample: [{source: /run/nvidia/mps/nvidia.com/gpu/pipe, target: /mps/nvidia.com/gpu/pipe}, {source: /run/nvidia/mps/shm, target: /dev/shm}]
    engine:
      description:
        - The same as a container engine's arguments - C(podman) and C(docker) (C(--volume) the pipe directory
          read-only and the daemon's C(/dev/shm) read-write, C(--env) each variable) - and C(kubernetes), the
          C(volumes) (C(hostPath)), C(volumeMounts) and C(env) of a pod spec. See the containers guide.
      type: dict
      sample: {podman: [--volume, '/run/nvidia/mps/nvidia.com/gpu/pipe:/mps/nvidia.com/gpu/pipe:ro', --volume, '/run/nvidia/mps/shm:/dev/shm',
                        --env, CUDA_MPS_PIPE_DIRECTORY=/mps/nvidia.com/gpu/pipe]}
      version_added: 0.2.0
notes:
  description: What the run did not do as asked, and why, without failing - a compute mode on a MIG device.
  returned: always
  type: list
  elements: str
  sample: ['compute mode EXCLUSIVE_PROCESS not applied: MIG device 1:0 (3g.40gb, MIG-67ea...) is a MIG device, ...']
  version_added: 0.2.0
gone:
  description:
    - The devices the daemon was started on that NVML no longer reports, each with its C(uuid) and a C(message) saying
      what to do - typically a MIG instance destroyed, or re-created with a new UUID by re-partitioning. Also warned.
  returned: always
  type: list
  elements: dict
  sample: [{uuid: MIG-4502df36-d355-dd53-45ab-861586d827ec, message: 'MIG device MIG-4502... no longer exists: ...'}]
  version_added: 0.2.0
actions:
  description: What was done (or, in check mode, would be done), in order.
  returned: always
  type: list
  elements: str
  sample: ['set compute mode EXCLUSIVE_PROCESS on GPU 0 (GPU-6a2b5c1e-5f0e-4e9b-9a55-1c7f2a1b0c01)', 'start the MPS control daemon']
'''

from ansible_collections.gpufleet.mps.plugins.module_utils._daemon.manager import DaemonSetup
from ansible_collections.gpufleet.mps.plugins.module_utils._gpus import ENUMERATION_WARNING, Nvml
from ansible_collections.gpufleet.mps.plugins.module_utils._module import control_binary, finish, run_module
from ansible_collections.gpufleet.mps.plugins.module_utils._options import DAEMON_OPTIONS, spec


def argument_spec():
    return spec(
        'root', 'config_dir', 'control_binary', 'devices', 'multiuser', *DAEMON_OPTIONS,
        name=dict(type='str', required=True),
        state=dict(type='str', choices=['started', 'stopped', 'restarted', 'absent'], default='started'),
        enabled=dict(type='bool', default=True),
    )


def run(module):
    params = module.params
    setup = DaemonSetup.from_params(params, control_binary)
    with Nvml() as nvml:
        outcome = setup.manager(nvml, check_mode=module.check_mode).ensure(
            params['state'], params['devices'], multiuser=params['multiuser'], compute_mode=params['compute_mode'],
            enabled=params['enabled'], shm=params['shm'], remove_logs=params['remove_logs'], foreground=params['foreground'])
        if nvml.enumeration_var_was_set:
            outcome.warnings.append(ENUMERATION_WARNING)
    running = params['state'] not in ('stopped', 'absent')
    return finish(
        module, outcome,
        pid=outcome.pid if running else None,
        pipe_dir=setup.paths.pipe_dir,
        log_dir=setup.paths.log_dir,
        devices=outcome.devices if running else [],
        env=setup.paths.client_env(),
        container=setup.container,
        supervisor=setup.supervisor,
        started_at=outcome.started_at if running else None,
        forced=outcome.forced,
        clients=outcome.clients,
        selinux=outcome.selinux,
        notes=outcome.notes,
        gone=outcome.gone,
    )


def main():
    run_module(argument_spec(), run)


if __name__ == '__main__':
    main()
