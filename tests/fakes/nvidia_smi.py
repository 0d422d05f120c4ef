# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A minimal ``nvidia-smi`` over NVML, for the simulated host: ``-L``, ``-i IDS -c MODE`` and
``--query-gpu=FIELDS --format=csv[,noheader][,nounits]`` (``-i IDS`` selects GPUs for both).

The systemd unit sets compute modes with ``nvidia-smi -i <uuids> -c <mode>``, and the benchmark's
hand-written baseline does too; on the simulated host this stand-in does it through the real
nvidia-ml-py and the fake libnvidia-ml.so.1, so the change is seen by every later NVML user.
"""

from __future__ import annotations

import argparse
import sys

import pynvml

MODES = {'DEFAULT': 0, '0': 0, 'PROHIBITED': 2, '2': 2, 'EXCLUSIVE_PROCESS': 3, '3': 3}
# How nvidia-smi --query-gpu prints compute_mode.
QUERY_MODE_NAMES = {0: 'Default', 1: 'Exclusive_Thread', 2: 'Prohibited', 3: 'Exclusive_Process'}
# --query-gpu fields: (value without its unit, unit or None). With --format=csv a value is printed as
# '<value> <unit>' ('81559 MiB'), with nounits as '<value>'.
QUERY_FIELDS = {
    'index': (lambda h: str(pynvml.nvmlDeviceGetIndex(h)), None),
    'uuid': (lambda h: _text(pynvml.nvmlDeviceGetUUID(h)), None),
    'name': (lambda h: _text(pynvml.nvmlDeviceGetName(h)), None),
    'compute_mode': (lambda h: QUERY_MODE_NAMES[pynvml.nvmlDeviceGetComputeMode(h)], None),
    'memory.total': (lambda h: '%d' % (pynvml.nvmlDeviceGetMemoryInfo(h).total // 1048576), 'MiB'),
}
# --format: 'csv' (mandatory) plus any of these options, in any order.
CSV_OPTIONS = ('noheader', 'nounits')
FORMAT_REFUSED = ('Only --format=csv, csv,noheader, csv,nounits and csv,noheader,nounits '
                  '(options in any order) are simulated')


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _csv_options(spec: str | None) -> set[str] | None:
    """The options of ``--format=csv[,noheader][,nounits]`` (order-free), or None for a format not simulated."""
    words = [word.strip() for word in (spec or '').split(',')]
    if 'csv' not in words or len(set(words)) != len(words) or not set(words) <= {'csv', *CSV_OPTIONS}:
        return None
    return set(words) - {'csv'}


def _header(fields: list[str]) -> str:
    """The first line of ``--format=csv``: the fields as given in --query-gpu, separated by ', ', a field with a unit
    followed by ' [<unit>]'. As the real r580 H200 printed it (gpu-evidence 2026-12-04/log.txt, line 5, for
    tools/gpu-check.sh's ``--query-gpu=index,name,uuid,compute_mode,mig.mode.current,persistence_mode,driver_version,
    memory.total --format=csv``): ``index, name, uuid, compute_mode, mig.mode.current, persistence_mode,
    driver_version, memory.total [MiB]``. With nounits the header keeps its ' [<unit>]' and only the values lose
    theirs [I]: not recorded there; NVIDIA's documentation of --format has nounits drop units "for numerical
    values", and a published csv,nounits capture (nesi/hpc-intro-dl, docs/monitor.md) shows ``memory.used [MiB]``
    over bare numbers.
    """
    return ', '.join(field + (' [%s]' % QUERY_FIELDS[field][1] if QUERY_FIELDS[field][1] else '') for field in fields)


def _value(field: str, handle, units: bool) -> str:
    getter, unit = QUERY_FIELDS[field]
    value = getter(handle)
    return '%s %s' % (value, unit) if unit and units else value


def _select(ids: str) -> list:
    handles = []
    for ident in ids.split(','):
        ident = ident.strip()
        if ident.isdigit():
            handles.append(pynvml.nvmlDeviceGetHandleByIndex(int(ident)))
        else:
            handles.append(pynvml.nvmlDeviceGetHandleByUUID(ident))
    return handles


def _list_migs(handle) -> None:
    """The MIG devices under a GPU in MIG mode, as the real ``nvidia-smi -L`` indents them (MIG user guide)."""
    try:
        slots = pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)
    except pynvml.NVMLError:
        return
    for mig_index in range(slots):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig_index)
        except pynvml.NVMLError:
            continue
        profile = _text(pynvml.nvmlDeviceGetName(mig)).split(' MIG ', 1)[-1]
        print('  MIG %-12s Device %2d: (UUID: %s)' % (profile, mig_index, _text(pynvml.nvmlDeviceGetUUID(mig))))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog='nvidia-smi', add_help=True)
    parser.add_argument('-L', '--list-gpus', action='store_true')
    parser.add_argument('-i', '--id')
    parser.add_argument('-c', '--compute-mode')
    parser.add_argument('--query-gpu')
    parser.add_argument('--format')
    args = parser.parse_args(argv)
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        print('NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver. (%s)' % exc)
        return 9
    try:
        if args.list_gpus:
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                print('GPU %d: %s (UUID: %s)' % (index, _text(pynvml.nvmlDeviceGetName(handle)), _text(pynvml.nvmlDeviceGetUUID(handle))))
                _list_migs(handle)
            return 0
        if args.query_gpu:
            options = _csv_options(args.format)
            if options is None:
                print(FORMAT_REFUSED)
                return 2
            fields = args.query_gpu.split(',')
            unknown = [field for field in fields if field not in QUERY_FIELDS]
            if unknown:
                print('Field "%s" is not a valid field to query.' % unknown[0])
                return 2
            handles = _select(args.id) if args.id else [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            if 'noheader' not in options:
                print(_header(fields))
            for handle in handles:
                print(', '.join(_value(field, handle, 'nounits' not in options) for field in fields))
            return 0
        if args.compute_mode is not None:
            mode = MODES.get(args.compute_mode.upper())
            if mode is None:
                print('Invalid compute mode: %s' % args.compute_mode)
                return 2
            handles = _select(args.id) if args.id else [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            for handle in handles:
                pynvml.nvmlDeviceSetComputeMode(handle, mode)
                name = [key for key, value in MODES.items() if value == mode and not key.isdigit()][0]
                print('Set compute mode to %s for GPU %s.' % (name, _text(pynvml.nvmlDeviceGetUUID(handle))))
            print('All done.')
            return 0
        parser.print_usage()
        return 2
    except pynvml.NVMLError as exc:
        print('Unable to complete the request: %s' % exc)
        return 4
    finally:
        pynvml.nvmlShutdown()


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
