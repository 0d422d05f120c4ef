# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations


class ModuleDocFragment:
    """Options shared by every module that addresses one resource's daemon."""

    DOCUMENTATION = r'''
options:
  name:
    description:
      - The resource, a named group of GPUs with its own MPS control daemon.
      - One or two segments separated by C(/), each of letters, digits, C(.), C(_) and C(-), never C(.) or C(..),
        for example V(nvidia.com/gpu) (the device plugin's default) or V(train).
      - Its pipe directory is C(<root>/<name>/pipe) and its log directory C(<root>/<name>/log).
    type: str
    required: true
  root:
    description:
      - Absolute directory under which every resource has its directories, laid out like NVIDIA's Kubernetes
        device plugin, so tools written for it find the daemons.
      - C(<root>/<name>/pipe) must be at most 87 bytes long; a longer one is refused before anything is done, because
        NVIDIA's control daemon fails silently there (no log line, no socket; observed on driver 535).
    type: path
    default: /run/nvidia/mps
  config_dir:
    description:
      - Absolute directory for what must survive a reboot (C(/run) does not) - the daemon's systemd environment
        file and the persisted limits, one set of files per resource, named after the systemd-escaped resource name.
    type: path
    default: /etc/gpufleet-mps
  control_binary:
    description:
      - Absolute path of C(nvidia-cuda-mps-control). Found on E(PATH) when not given.
    type: path
requirements:
  - nvidia-ml-py >= 12 (C(import pynvml)) on the managed node
  - the NVIDIA driver (C(libnvidia-ml.so.1) and C(nvidia-cuda-mps-control))
'''
