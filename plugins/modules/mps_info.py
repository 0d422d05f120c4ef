#!/usr/bin/python
# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: mps_info
short_description: Facts about NVIDIA GPUs, CUDA MPS control daemons, their servers and limits
version_added: 0.1.0
description:
  - Reports the host's GPUs as NVML sees them, every MPS control daemon under O(root) that is running or left state
    behind (a crashed one), its health, devices, servers and clients, and its limits both as the daemon reports them
    and as persisted in O(config_dir).
  - Each running daemon is asked everything in one control UI process. A daemon that does not answer within
    O(timeout) is reported with RV(daemons[].healthy=false) and the reason in RV(daemons[].error); the task does not
    fail.
  - A host without the NVIDIA driver or without nvidia-ml-py does not fail either - RV(nvml.available) is V(false) and
    RV(nvml.error) says why - so a play over a mixed fleet can skip hosts without GPUs.
  - Also reports, as warnings, what usually breaks MPS clients - see RV(warnings).
  - Changes nothing, ever.
attributes:
  check_mode:
    description: Runs the same reads in check mode; it never changes anything anyway.
    support: full
  diff_mode:
    description: Nothing is changed, so there is nothing to show.
    support: none
  idempotent:
    description: Reading facts changes nothing.
    support: full
extends_documentation_fragment:
  - gpufleet.mps._common
  - gpufleet.mps._common.root
  - gpufleet.mps._common.container_root
options:
  name:
    description:
      - Report only the daemon of this resource (for example V(nvidia.com/gpu) or V(train)). Without it, every
        resource under O(root) is reported.
      - A resource whose daemon is stopped and left nothing behind is not reported.
    type: str
  gather:
    description:
      - What to report. V(gpus) is RV(gpus); V(daemons) is RV(daemons) without their servers; V(servers) adds each
        daemon's servers, their clients and their limits (and implies V(daemons)).
      - RV(nvml), RV(control_binary) and RV(warnings) are always returned.
    type: list
    elements: str
    choices: [gpus, daemons, servers]
    default: [gpus, daemons, servers]
  timeout:
    description:
      - Seconds to wait for each daemon's answer.
    type: int
    default: 10
  slices:
    description:
      - Add to each daemon's RV(daemons[].container) a C(slice) - the environment one of this many clients (containers,
        pods, jobs) sets to take an equal slice of each of the daemon's GPUs - C(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)
        (C(floor(1000 / slices) / 10)), C(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) (C(total // slices) MiB per device ordinal,
        where NVML gave the GPUs' sizes) and, for a daemon whose clients get below-normal priority,
        C(CUDA_MPS_CLIENT_PRIORITY=1).
      - A client's variables can only lower what its server hands out, so a slice never exceeds the daemon's persisted
        limits. MPS applies them per client process, not per container - a container that starts two CUDA processes
        gets two slices.
      - From 1 to 100, and no more than the MPS clients each of the daemon's GPUs takes (48 from Volta on, 60 with
        drivers 590 and later; fewer on a MIG device), as O(gpufleet.mps.mps_limits#module:replicas).
    type: int
    version_added: 0.2.0
notes:
  - Reading compute modes and the daemons' files works as any user; asking a daemon needs access to its pipe
    directory (root for the default O(root)).
requirements:
  - nvidia-ml-py >= 12 (C(import pynvml)) on the managed node, for GPU facts; without it RV(nvml.available) is V(false).
seealso:
  - module: gpufleet.mps.mps_daemon
author:
  - gpufleet.mps developers (@gpufleet)
'''

EXAMPLES = r'''
- name: Everything about MPS on the host
  gpufleet.mps.mps_info:
  register: mps

- name: Skip hosts without a usable NVIDIA driver
  ansible.builtin.meta: end_host
  when: not mps.nvml.available

- name: Fail when a daemon does not answer
  ansible.builtin.assert:
    that: mps.daemons | rejectattr('healthy') | list | length == 0
    fail_msg: "{{ mps.daemons | rejectattr('healthy') | map(attribute='name') | join(', ') }} not healthy"

- name: Only the GPUs, without touching any daemon
  gpufleet.mps.mps_info:
    gather: [gpus]
  register: gpu_facts

- name: One resource, without its servers (one short control UI session)
  gpufleet.mps.mps_info:
    name: nvidia.com/gpu
    gather: [daemons]
  register: device_plugin_daemon

- name: Client pids of every server of every daemon
  ansible.builtin.debug:
    msg: "{{ mps.daemons | map(attribute='servers') | flatten | map(attribute='clients') | flatten }}"
'''

RETURN = r'''
nvml:
  description: Whether NVML could be used, and the driver's versions.
  returned: always
  type: dict
  sample: {available: true, python_binding: true, error: null, driver_version: 560.35.03, cuda_driver_version: '12.6'}
  contains:
    available:
      description: Whether NVML was initialised and the GPUs read.
      type: bool
      sample: true
    python_binding:
      description:
        - Whether the module's interpreter could import nvidia-ml-py (C(pynvml)). V(false) is a broken interpreter
          rather than a host without a GPU - the fleet role fails such a host instead of skipping it.
      type: bool
      sample: true
      version_added: 0.2.0
    error:
      description: Why NVML is not available (driver or nvidia-ml-py missing, driver not loaded); null when it is.
      type: str
      sample: 'the NVIDIA driver is not installed: libnvidia-ml.so.1 not found'
    driver_version:
      description: The NVIDIA driver's version; null when unknown.
      type: str
      sample: 560.35.03
    driver_upgrade_pending:
      description:
        - V(true) when NVML answers "Driver/library version mismatch" - the driver's libraries were upgraded while the
          old kernel module is still loaded, until a reboot or a module reload. The running daemons are reported from
          what can be read without NVML; M(gpufleet.mps.mps_host), M(gpufleet.mps.mps_daemon) and
          M(gpufleet.mps.mps_limits) fail on such a host and change nothing (M(gpufleet.mps.mps_shm) needs no NVML).
      type: bool
      sample: false
      version_added: 0.2.0
    cuda_driver_version:
      description: The newest CUDA version the driver supports; null when unknown.
      type: str
      sample: '12.6'
gpus:
  description: Every GPU of the host, by index; empty when NVML is not available.
  returned: when O(gather) contains V(gpus)
  type: list
  elements: dict
  sample:
    - index: 0
      uuid: GPU-6a2b5c1e-0000-4000-8000-000000000000
      name: NVIDIA H100 80GB HBM3
      memory_total_mib: 81559
      compute_capability: '9.0'
      compute_mode: exclusive_process
      mig_mode: {current: disabled, pending: disabled}
      persistence_mode: true
      max_mps_clients: 48
  contains:
    index:
      description: The GPU's NVML index (as C(nvidia-smi) numbers it).
      type: int
      sample: 0
    uuid:
      description: The GPU's UUID.
      type: str
      sample: GPU-6a2b5c1e-0000-4000-8000-000000000000
    name:
      description: The product name.
      type: str
      sample: NVIDIA H100 80GB HBM3
    memory_total_mib:
      description: Total device memory in MiB.
      type: int
      sample: 81559
    compute_capability:
      description: CUDA compute capability, C(major.minor).
      type: str
      sample: '9.0'
    compute_mode:
      description: V(default), V(exclusive_process), V(prohibited), or V(unsupported) when NVML cannot tell.
      type: str
      sample: exclusive_process
    mig_mode:
      description: V(unsupported), or the current and pending MIG mode (V(enabled) or V(disabled)).
      type: raw
      sample: {current: disabled, pending: disabled}
    persistence_mode:
      description: Whether persistence mode is on; null when NVML cannot tell.
      type: bool
      sample: true
    max_mps_clients:
      description: Clients per GPU under MPS - 16 before Volta (compute capability 7.0), 48 from it on, 60 on drivers 590 and later (CUDA 13.1 documents 60).
      type: int
      sample: 48
    mig_devices:
      description:
        - A GPU in MIG mode - its MIG devices (compute instances), in NVML's MIG index order; empty otherwise. Requested
          with O(gather=gpus); who serves each is read from the start records under O(root).
      type: list
      elements: dict
      version_added: 0.2.0
      sample:
        - index: 0
          address: '1:0'
          uuid: MIG-67eadff1-ba23-814c-c594-557b386eca73
          name: NVIDIA H100 80GB HBM3 MIG 3g.40gb
          profile: 3g.40gb
          memory_total_mib: 40192
          multiprocessor_count: 60
          gpu_instance_id: 2
          compute_instance_id: 0
          gpu_instance_slices: 3
          compute_instance_slices: 3
          max_mps_clients: 20
          parent_uuid: GPU-67c7eeb2-f9c6-245a-57be-0cbf01b4a96c
          resource: infer-big
          daemon_pid: 4182
      contains:
        index:
          description: The MIG device index under its GPU (C(Device N) in C(nvidia-smi -L)).
          type: int
        address:
          description: C(<gpu index>:<mig index>), the form a resource's C(devices) takes.
          type: str
        uuid:
          description: The MIG device's UUID (C(MIG-...)), which its daemon's C(CUDA_VISIBLE_DEVICES) holds. A new one
            each time the instance is created.
          type: str
        name:
          description: NVML's name for it, C(<GPU name> MIG <profile>).
          type: str
        parent_uuid:
          description: Its GPU's UUID.
          type: str
        gpu_instance_slices:
          description: The slices of its GPU instance.
          type: int
        profile:
          description: The MIG profile (C(1g.10gb), C(3g.40gb), C(1c.3g.40gb)...).
          type: str
        memory_total_mib:
          description: The instance's own memory.
          type: int
        multiprocessor_count:
          description: Its streaming multiprocessors; null when NVML does not say.
          type: int
        gpu_instance_id:
          description: Its GPU instance; null when NVML does not say.
          type: int
        compute_instance_id:
          description: Its compute instance within the GPU instance; null when NVML does not say.
          type: int
        compute_instance_slices:
          description: The compute slices of its compute instance.
          type: int
        max_mps_clients:
          description: The GPU's MPS client cap lowered in proportion to the compute instance (slices of the GPU's 7),
            rounded down - NVIDIA's MIG user guide documents the proportion, not the rounding.
          type: int
        resource:
          description: The resource under O(root) whose daemon was started on it; null when none.
          type: str
        daemon_pid:
          description: The pid of that daemon while it runs; null otherwise.
          type: int
control_binary:
  description: The C(nvidia-cuda-mps-control) used to ask the daemons; null when it is not installed.
  returned: always
  type: str
  sample: /usr/bin/nvidia-cuda-mps-control
other_daemons:
  description:
    - The MPS control daemons of the host that are not under O(root) - under another root, started by hand, NVIDIA's
      device plugin's - found among the processes (C(nvidia-cuda-mps-control -d) or C(-f)). The modules never take
      their GPUs. C(pipe_dir) is the daemon's C(CUDA_MPS_PIPE_DIRECTORY) as it names it (in its own mount namespace),
      null with C(devices) empty when its environment cannot be read (another user's, without root); C(devices)
      are the GPUs its C(CUDA_VISIBLE_DEVICES) names (every GPU when unset).
    - C(orphan) is true for a daemon of O(root) that its pipe directory no longer leads to (the directory deleted under
      the running daemon, or a second daemon started there) - C(quit) cannot reach it, it still serves its GPUs, and
      M(gpufleet.mps.mps_host) and M(gpufleet.mps.mps_daemon) refuse to start another daemon on them.
  returned: when O(gather) includes V(daemons)
  type: list
  elements: dict
  sample: [{pid: 5120, uid: 0, pipe_dir: /tmp/nvidia-mps, orphan: false, devices: [{index: 0,
            uuid: GPU-0aac1e75-0ca4-47bb-816e-bead2982d24c, name: NVIDIA H100 80GB HBM3}]}]
  version_added: 0.2.0
daemons:
  description:
    - Every resource under O(root) (only O(name) when given) whose daemon is running or left files behind, by name.
  returned: when O(gather) contains V(daemons) or V(servers)
  type: list
  elements: dict
  sample:
    - name: nvidia.com/gpu
      pipe_dir: /run/nvidia/mps/nvidia.com/gpu/pipe
      log_dir: /run/nvidia/mps/nvidia.com/gpu/log
      env: {CUDA_MPS_PIPE_DIRECTORY: /run/nvidia/mps/nvidia.com/gpu/pipe, CUDA_MPS_LOG_DIRECTORY: /run/nvidia/mps/nvidia.com/gpu/log}
      state: running
      running: true
      healthy: true
      error: null
      pid: 4182
      supervisor: systemd
      multiuser: false
      started_at: '2026-12-02T13:04:59Z'
      driver_version: 580.159.04
      devices: [{ordinal: 0, uuid: GPU-6a2b5c1e-0000-4000-8000-000000000000, index: 0}]
      leftovers: []
      limits:
        reported: {active_thread_percentage: 25.0, pinned_device_mem_limit: {GPU-6a2b5c1e-0000-4000-8000-000000000000: 3G}}
        persisted: {active_thread_percentage: 25.0, pinned_device_mem_limit_mib: {GPU-6a2b5c1e-0000-4000-8000-000000000000: 3840}, replicas: null}
        differences: []
      servers:
        - pid: 4428
          status: ACTIVE
          uid: 1000
          clients: [4267, 4301]
          limits: {active_thread_percentage: 25.0, pinned_device_mem_limit: {GPU-6a2b5c1e-0000-4000-8000-000000000000: 3G}}
  contains:
    name:
      description: The resource's name.
      type: str
      sample: nvidia.com/gpu
    pipe_dir:
      description: The daemon's pipe directory.
      type: str
      sample: /run/nvidia/mps/nvidia.com/gpu/pipe
    log_dir:
      description: The daemon's log directory.
      type: str
      sample: /run/nvidia/mps/nvidia.com/gpu/log
    env:
      description: The environment a CUDA client needs to use this daemon.
      type: dict
      sample: {CUDA_MPS_PIPE_DIRECTORY: /run/nvidia/mps/nvidia.com/gpu/pipe, CUDA_MPS_LOG_DIRECTORY: /run/nvidia/mps/nvidia.com/gpu/log}
    shm:
      description:
        - Whether the daemon uses C(<root>/shm) as its C(/dev/shm) (M(gpufleet.mps.mps_daemon) O(gpufleet.mps.mps_daemon#module:shm)) -
          as its own mount namespace shows it when it runs, else as recorded when it was started.
      type: bool
      sample: false
      version_added: 0.2.0
    container:
      description:
        - What a client in a container needs - the same as M(gpufleet.mps.mps_daemon)'s
          RV(gpufleet.mps.mps_daemon#module:container) - C(root), C(pipe_dir), C(env) and C(mounts) (C(source) on the host,
          C(target) in the container). Null when the container path would not fit in a unix socket address.
        - With O(slices), also C(slice) - C(slices) and the C(env) one of that many clients sets to take its slice.
        - C(engine) - the same as what a container engine takes - C(podman) and C(docker) argument lists (C(--volume)
          the pipe directory read-only, the daemon's C(/dev/shm) read-write, C(--env) each variable, the slice's
          included), and C(kubernetes), the C(volumes), C(volumeMounts) and C(env) of a pod spec (C(hostPath) volumes).
          A real podman container started with these arguments reaches the daemon (C(make engines)).
      type: dict
      sample: {root: /mps, pipe_dir: /mps/train/pipe, env: {CUDA_MPS_PIPE_DIRECTORY: /mps/train/pipe},
               mounts: [{source: /run/nvidia/mps/train/pipe, target: /mps/train/pipe}, {source: /dev/shm, target: /dev/shm}],
               engine: {podman: [--volume, '/run/nvidia/mps/train/pipe:/mps/train/pipe:ro', --volume, '/dev/shm:/dev/shm',
                                 --env, CUDA_MPS_PIPE_DIRECTORY=/mps/train/pipe]}}
      version_added: 0.2.0
    state:
      description:
        - V(running) when its control socket accepts a connection; V(stale) for a dead daemon's leftover files;
          V(unknown) when a live control daemon process of this pipe directory holds its lock or pid file but the
          socket does not answer (RV(daemons[].error) says which; modules touch nothing of such a daemon).
      type: str
      sample: running
    running:
      description:
        - Whether the daemon is alive, that is whether its C(<pipe>/control) socket accepts a connection. The kernel lock on
          C(control_lock) and the pid file only name its pid (the kind of lock the real daemon takes is undocumented).
      type: bool
      sample: true
    healthy:
      description: Whether the daemon is running and answered the control UI within O(timeout).
      type: bool
      sample: true
    error:
      description: Why a running daemon is not healthy, or why its state is V(unknown); null otherwise.
      type: str
      sample: 'accepted the connection but did not answer within 10s (see /run/nvidia/mps/train/log/control.log)'
    pid:
      description: The running daemon's pid (null when neither its lock nor its pid file names it); null when it is not running.
      type: int
      sample: 4182
    supervisor:
      description: V(systemd) or V(none) as recorded at start by gpufleet.mps.mps_daemon; null without a record.
      type: str
      sample: systemd
    multiuser:
      description: Whether the daemon was started with C(-multiuser-server); null without a record.
      type: bool
      sample: false
    started_at:
      description: When the daemon was started (UTC, ISO 8601); null without a record.
      type: str
      sample: '2026-12-02T13:04:59Z'
    driver_version:
      description:
        - The NVIDIA driver version NVML reported when this collection started the daemon; null without a record, or for a
          record written before version 0.2.0. When NVML now reports another one (a driver upgrade), a warning says so
          and M(gpufleet.mps.mps_daemon) and M(gpufleet.mps.mps_host) plan the daemon's restart, their busy policy
          deciding about connected clients.
      type: str
      sample: 580.159.04
      version_added: 0.2.0
    binary_replaced:
      description:
        - V(true) when the program the running daemon was started from was replaced or removed since (the kernel names it
          C(<path> (deleted)), as after a driver package upgrade under the running daemon); a warning says what to do. Null when
          it is not running or its process cannot be read.
      type: bool
      sample: false
      version_added: 0.2.0
    protocol:
      description:
        - The MPS protocol the running daemon was started with, from its arguments and environment (C(-p 3),
          C(CUDA_MPS_PROTOCOL_VERSION=3)) - 2 (legacy, the default) or 3 (MPS v3, driver r615 and later); null when it
          is not running or its process cannot be read.
        - The collection drives legacy daemons only; a daemon of one of its resources that speaks protocol 3 is not asked
          (the legacy commands are not its own), and its C(error) says so, and M(gpufleet.mps.mps_host),
          M(gpufleet.mps.mps_daemon) and M(gpufleet.mps.mps_limits) refuse to change that resource.
      type: int
      sample: 2
      version_added: 0.2.0
    static_partitioning:
      description:
        - Whether the daemon was started with C(-S) (static SM partitioning, CUDA 13.1 and later), as recorded - it is,
          where its persisted limits hold C(sm_partitions); null without a record.
      type: bool
      sample: false
      version_added: 0.2.0
    sm_partitions:
      description:
        - The static SM partitions of a running daemon started with C(-S), as C(lspart) lists them (asked in the same
          control batch, only of such a daemon) - per partition its C(device) (UUID), C(id) (what a client sets as
          C(CUDA_MPS_SM_PARTITION); new at every start of the daemon), C(chunks), C(sms) and C(in_use) (it has clients).
          The container view's C(sm_partitions) lists the same ids.
        - Null for a daemon without C(-S), one not running, or one that did not answer.
        - Inferred from NVIDIA's documentation and client code; not yet checked against a real CUDA 13.1 binary.
      type: list
      elements: dict
      sample: [{device: GPU-a8aa752d-52a7-47f6-ab1d-d3295872ad6b, id: GPU-a8aa752d-52a7-47f6-ab1d-d3295872ad6b/Dx4AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA,
                chunks: 8, sms: 64, in_use: true}]
      version_added: 0.2.0
    devices:
      description:
        - The daemon's GPUs from its start record, in its device ordinal order, with their host index (null when the GPU
          is not found through NVML). Empty without a record.
        - A MIG device also has C(mig) (its address, C(1:0); null when NVML no longer reports it - the instance was
          destroyed or re-created, which a warning says) and C(profile).
      type: list
      elements: dict
      sample: [{ordinal: 0, uuid: GPU-6a2b5c1e-0000-4000-8000-000000000000, index: 0}]
    leftovers:
      description: The files a dead daemon left behind; empty for a running one.
      type: list
      elements: str
      sample: [control, log, nvidia-cuda-mps-control.pid, .started]
    limits:
      description: The defaults the daemon hands to new servers, as it reports them and as persisted.
      type: dict
      sample:
        reported: {active_thread_percentage: 25.0, pinned_device_mem_limit: {GPU-6a2b5c1e-0000-4000-8000-000000000000: 3G}}
        persisted: {active_thread_percentage: 25.0, pinned_device_mem_limit_mib: {GPU-6a2b5c1e-0000-4000-8000-000000000000: 3840}, replicas: null}
        differences: []
      contains:
        reported:
          description:
            - What the daemon reports - its default active thread percentage and, per device UUID, its default pinned
              memory limit as printed (lossy - C(3840M) reads back as C(3G); null when unset). Null when the daemon was
              not asked or did not answer.
            - C(client_priority) - its default client priority, V(normal) or V(below_normal); null where the control binary
              has no client priority (asked in the same control batch).
          type: dict
          sample: {active_thread_percentage: 25.0, pinned_device_mem_limit: {GPU-6a2b5c1e-0000-4000-8000-000000000000: 3G},
                   client_priority: normal}
        persisted:
          description:
            - The limits persisted for the resource in O(config_dir) (pinned memory in MiB per GPU UUID, or C(*) for
              every GPU; C(client_priority) V(normal), V(below_normal) or null when not managed; C(sm_partitions) the
              chunks of each GPU's static SM partitions, empty when none); null when none are.
          type: dict
          sample: {active_thread_percentage: 25.0, pinned_device_mem_limit_mib: {GPU-6a2b5c1e-0000-4000-8000-000000000000: 3840}, replicas: null,
                   client_priority: null, sm_partitions: []}
        differences:
          description:
            - Where the reported limits disagree with the persisted ones, allowing for the lossy read-back - and, for a
              daemon started with C(-S), where its SM partitions do. Empty when they agree, when nothing is persisted,
              or when the daemon was not asked.
          type: list
          elements: str
          sample: ['active thread percentage 25.0 persisted, 50.0 reported']
    clients_by_owner:
      description:
        - The daemon's clients counted by owner kind (V(container), V(slurm_job), V(host), V(unknown); each present, zero
          included) - a bounded summary of RV(daemons[].servers[].client_owners). Returned when O(gather) contains
          V(servers) and the daemon answered.
      type: dict
      version_added: 0.2.0
      sample: {container: 2, slurm_job: 0, host: 0, unknown: 0}
    servers:
      description:
        - The daemon's MPS servers, in the order the daemon lists them. Returned when O(gather) contains V(servers).
      type: list
      elements: dict
      sample:
        - pid: 4428
          status: ACTIVE
          uid: 1000
          clients: [4267, 4301]
          limits: {active_thread_percentage: 25.0, pinned_device_mem_limit: {GPU-6a2b5c1e-0000-4000-8000-000000000000: 3G}}
      contains:
        pid:
          description: The server's pid.
          type: int
          sample: 4428
        status:
          description: V(INITIALIZING), V(ACTIVE) or V(FAULT); null when unknown.
          type: str
          sample: ACTIVE
        uid:
          description: The uid the server runs as (its clients' uid, or 0 for a multi-user server); null when unknown.
          type: int
          sample: 1000
        clients:
          description: Pids of the server's clients.
          type: list
          elements: int
          sample: [4267, 4301]
        client_owners:
          description:
            - Whose each client is, in the order of RV(daemons[].servers[].clients) - from its cgroup, where the engine
              that started it placed it, and its environment. C(owner) is V(container), V(slurm_job), V(host) (every
              cgroup path in systemd's slices or scopes) or V(unknown) (unreadable, the root of a cgroup namespace of its
              own, or a layout not known here). C(engine) (V(docker), V(podman), V(containerd), V(crio), V(kubernetes)
              where the path names a pod but not its runtime, null when unknown), C(container) (its id), C(pod) (a
              Kubernetes pod's uid), C(job) (the Slurm job its cgroup is in - slurmstepd put it there), C(claimed_job)
              (C(SLURM_JOB_ID) of its environment - said by the process, not proven) and C(uid).
          type: list
          elements: dict
          version_added: 0.2.0
          sample:
            - {pid: 4267, uid: 1000, owner: container, engine: podman, container: 93afc7bc3ce42ad052d2926ffacfba941803bfae080941d1e1375d9d46b6a281,
               pod: null, job: null, claimed_job: null}
        limits:
          description:
            - What the server hands to clients that connect from now on - active thread percentage and pinned memory
              limit per device UUID as printed (null when unset or unknown). Running clients keep the limits they got.
          type: dict
          sample: {active_thread_percentage: 25.0, pinned_device_mem_limit: {GPU-6a2b5c1e-0000-4000-8000-000000000000: 3G}}
shm:
  description: The shared tmpfs at C(<root>/shm) (M(gpufleet.mps.mps_shm)) as the kernel reports it.
  returned: always
  type: dict
  version_added: 0.2.0
  contains:
    path:
      description: C(<root>/shm).
      type: str
      sample: /run/nvidia/mps/shm
    mounted:
      description: Whether something is mounted there.
      type: bool
      sample: true
    size_kib:
      description: The tmpfs size in KiB; null when not mounted.
      type: int
      sample: 65872896
    options:
      description: Which of C(rw), C(nosuid), C(nodev), C(noexec) it is mounted with.
      type: list
      elements: str
      sample: [rw, nosuid, nodev, noexec]
    error:
      description: Why it cannot be used (another file system mounted there), else null.
      type: str
      sample: null
resources:
  description:
    - The name of every resource this collection has something of, under O(root) (a pipe directory or a C(.started)
      record) or in O(config_dir) (an environment file or persisted limits), running or not, sorted. After a reboot
      C(/run) is empty but O(config_dir) is not; this is the list a teardown with
      M(gpufleet.mps.mps_daemon) O(gpufleet.mps.mps_daemon#module:state=absent) visits.
  returned: always
  type: list
  elements: str
  sample: [nvidia.com/gpu, train]
  version_added: 0.2.0
warnings:
  description:
    - What usually breaks MPS - a GPU of a running daemon not in EXCLUSIVE_PROCESS, a GPU claimed by two daemons, a parent
      of a pipe directory other users cannot traverse, a dead daemon's stale files, limits differing from the persisted
      ones, a daemon that runs but does not answer, and C(NVML_MPS_DEVICE_ENUMERATION) set in the environment.
  returned: when there is something to warn about
  type: list
  elements: str
  sample: ['the MPS control daemon of train (pid 4182) is not running but left files behind (control, log, .started); gpufleet.mps.mps_daemon cleans them up']
'''

import shutil

from ansible_collections.gpufleet.mps.plugins.module_utils._info import GATHER_CHOICES, Collector, InfoRequest
from ansible_collections.gpufleet.mps.plugins.module_utils._module import CONTROL_BINARY, common_argument_spec, run_module
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.layout import DEFAULT_CONTAINER_ROOT
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.process import require_binary


def argument_spec():
    spec = common_argument_spec()
    spec.update(
        name=dict(type='str'),
        gather=dict(type='list', elements='str', choices=list(GATHER_CHOICES), default=list(GATHER_CHOICES)),
        timeout=dict(type='int', default=10),
        container_root=dict(type='path', default=DEFAULT_CONTAINER_ROOT),
        slices=dict(type='int'),
    )
    return spec


def run(module):
    params = module.params
    # A read-only module: without the binary the facts say so instead of failing.
    binary = require_binary(params['control_binary']) if params['control_binary'] else shutil.which(CONTROL_BINARY)
    request = InfoRequest.validate(params['root'], params['config_dir'], params['name'], params['gather'], binary,
                                   params['timeout'], params['container_root'], params['slices'])
    report = Collector(request).collect()
    for warning in report.warnings:
        module.warn(warning)
    return dict(changed=False, **report.facts)


def main():
    run_module(argument_spec(), run)


if __name__ == '__main__':
    main()
